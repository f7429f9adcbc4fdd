-- Coalesced decisions: several independent requests, each against one token
-- bucket, decided in one call (the layer batches what is in flight at the
-- same moment). The same state and arithmetic as lua/token_bucket_one.lua,
-- once per key, in order: a key named twice sees its own earlier write.
--
-- KEYS[i]                       the bucket of request i
-- ARGV[3i-2], [3i-1], [3i]      its cost, capacity and refill per second
-- Returns one "allowed remaining wait reset" string per request.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local out = {}
for i = 1, #KEYS do
  local a = 3 * i - 2
  local per = 1000000 / ARGV[a + 2]
  local burst = ARGV[a + 1] * per
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end
  local new = tat + ARGV[a] * per
  if new < now then new = now end
  if new - now > burst then
    out[i] = '0 ' .. (now + burst - tat) / per .. ' ' .. (new - now - burst) / 1000000 .. ' ' .. (tat - now) / 1000000
  else
    redis.call('SET', KEYS[i], string.format('%.17g', new), 'PX', math.ceil((new - now) / 1000) + 1)
    out[i] = '1 ' .. (now + burst - new) / per .. ' 0 ' .. (new - now) / 1000000
  end
end
return out
