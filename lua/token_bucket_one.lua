-- fleetlimit's lean default: one request against one token bucket, the
-- common case, with nothing but the work it needs (TIME, GET, SET … PX).
-- Same state and arithmetic as lua/token_bucket.lua (GCRA: the key holds the
-- bucket's theoretical arrival time in microseconds of Redis TIME).
--
-- KEYS[1]  the bucket
-- ARGV     cost (negative: a refund), capacity, refill per second
-- Returns "allowed remaining wait reset" as one string (Redis truncates Lua
-- numbers on the way out, and one string is cheaper than four).
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local per = 1000000 / ARGV[3]
local burst = ARGV[2] * per
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new = tat + ARGV[1] * per
if new < now then new = now end
if new - now > burst then
  -- Refused: nothing is written.
  return '0 ' .. (now + burst - tat) / per .. ' ' .. (new - now - burst) / 1000000 .. ' ' .. (tat - now) / 1000000
end
redis.call('SET', KEYS[1], string.format('%.17g', new), 'PX', math.ceil((new - now) / 1000) + 1)
return '1 ' .. (now + burst - new) / per .. ' 0 ' .. (new - now) / 1000000
