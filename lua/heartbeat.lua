-- Fleet discovery (src/fleet.rs): records ARGV[1], an instance, as alive in
-- the sorted set KEYS[1], scored by Redis TIME in ms; drops the instances
-- silent for ARGV[2] ms (dead_after); keeps an expiry of twice that on the
-- set, so a fleet that stopped leaves nothing behind; answers how many are
-- alive.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
return redis.call('ZCARD', KEYS[1])
