local prev = redis.call('HGET', KEYS[1], 'owner') or ''
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if prev ~= ARGV[1] or ARGV[2] == '1' or epoch == 0 then
  epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1])
redis.call('PERSIST', KEYS[1])
if ARGV[2] == '1' then
  redis.call('HDEL', KEYS[1], 'record')
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
end
return {epoch, prev}
