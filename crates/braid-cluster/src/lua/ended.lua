if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then redis.call('PEXPIRE', KEYS[1], 86400000) end
return 1
