local e = tonumber(ARGV[1])
if e ~= 0 and tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0') ~= e then return 0 end
local op = ARGV[2]
if op == 'session' then redis.call('HSET', KEYS[1], 'record', ARGV[3])
elseif op == 'end' then redis.call('HDEL', KEYS[1], 'record'); redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
elseif op == 'append' then
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[2], 'r' .. ARGV[3], ARGV[5]) end
elseif op == 'stage' then
  if redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then redis.call('HSET', KEYS[3], ARGV[3], ARGV[4]) end
elseif op == 'done' then redis.call('HDEL', KEYS[2], ARGV[3], 'r' .. ARGV[3]); redis.call('HDEL', KEYS[3], ARGV[3])
elseif op == 'qos2' then
  if ARGV[4] == '1' then redis.call('SADD', KEYS[4], ARGV[3]) else redis.call('SREM', KEYS[4], ARGV[3]) end
end
return 1
