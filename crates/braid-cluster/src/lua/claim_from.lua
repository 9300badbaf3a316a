if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[2])
return redis.call('HINCRBY', KEYS[1], 'epoch', 1)
