if ARGV[2] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', '100000', '*', 't', ARGV[1], 'v', ARGV[2])
return 1
