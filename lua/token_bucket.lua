-- fleetlimit token bucket: every limit of one request, all or nothing.
--
-- KEYS[i]                bucket i (all in one hash slot on a cluster)
-- ARGV[1]                cost: tokens each bucket must give
-- ARGV[2i], ARGV[2i+1]   capacity and refill (tokens per second) of bucket i
--
-- State is one string "<tokens> <microseconds>" per key, written with
-- SET ... PX: the value and its expiry are a single write, so no key ever
-- lives without a TTL. A missing key is a full bucket, which is why expiry
-- (time to refill fully, plus a second) loses nothing.
--
-- The clock is Redis TIME: one clock for the whole fleet.
-- Returns { allowed, then per bucket: remaining, wait, reset } as strings,
-- because Redis truncates Lua numbers to integers on the way out.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[1])
local n = #KEYS
local level, cap, rate = {}, {}, {}
local allowed = true

for i = 1, n do
  cap[i] = tonumber(ARGV[2 * i])
  rate[i] = tonumber(ARGV[2 * i + 1]) / 1000000 -- tokens per microsecond
  local tokens = cap[i]
  local v = redis.call('GET', KEYS[i])
  if v then
    local sp = string.find(v, ' ', 1, true)
    if sp then
      local stored = tonumber(string.sub(v, 1, sp - 1))
      local at = tonumber(string.sub(v, sp + 1))
      if stored and at then
        local elapsed = now - at
        if elapsed < 0 then elapsed = 0 end
        tokens = math.min(cap[i], stored + elapsed * rate[i])
      end
    end
  end
  level[i] = tokens
  if tokens < cost then allowed = false end
end

local out = { allowed and '1' or '0' }
for i = 1, n do
  local tokens = level[i]
  local wait = 0
  if allowed then
    -- Only an admitted request writes: a refusal charges nothing anywhere.
    tokens = tokens - cost
    local ttl = math.ceil((cap[i] - tokens) / rate[i] / 1000) + 1000
    redis.call('SET', KEYS[i], string.format('%.17g %.17g', tokens, now), 'PX', ttl)
  elseif tokens < cost then
    wait = (cost - tokens) / rate[i] / 1000000
  end
  out[#out + 1] = string.format('%.17g', tokens)
  out[#out + 1] = string.format('%.17g', wait)
  out[#out + 1] = string.format('%.17g', (cap[i] - tokens) / rate[i] / 1000000)
end
return out
