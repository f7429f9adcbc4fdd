-- fleetlimit: every limit of one request, decided in one atomic call.
--
-- KEYS[i]        the key of limit i (all in one hash slot on a cluster)
-- ARGV[1]        cost: units each limit must give (negative: a refund)
-- ARGV[2]        the request's slot id (concurrency limits; "" without one)
-- ARGV[4i-1..4i+2] for limit i: algorithm ("t" token bucket, "f" fixed
--                window, "s" sliding window, "c" concurrency), its two
--                parameters, and "1" when the limit is in shadow mode
--
-- All or nothing: when any enforced limit lacks room, none is charged.
-- Shadow limits are counted when they have room and never refuse.
-- A limit may need `unit` instead of the cost (a concurrency limit: one
-- slot per request).
-- The clock is Redis TIME: one clock for the whole fleet.
-- Returns { allowed, then per limit: enough, remaining, wait, reset } as
-- strings, since Redis truncates Lua numbers to integers on the way out.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[1])
local slot = ARGV[2]
local algorithms = { t = token_bucket, f = fixed_window, s = sliding_window, c = concurrency }
local states = {}
local allowed = true

for i = 1, #KEYS do
  local a = 4 * i - 1
  local alg = algorithms[ARGV[a]]
  local s = alg.read(KEYS[i], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), now)
  s.alg = alg
  s.enough = cost <= 0 or s.avail >= (s.unit or cost)
  if not s.enough and ARGV[a + 3] ~= '1' then allowed = false end
  states[i] = s
end

local out = { allowed and '1' or '0' }
for i = 1, #KEYS do
  local s = states[i]
  if allowed and s.enough then
    s.alg.write(KEYS[i], s, cost, now, slot)
  else
    s.alg.keep(KEYS[i], s)
  end
  local remaining, wait, reset = s.alg.report(s, cost)
  out[#out + 1] = s.enough and '1' or '0'
  out[#out + 1] = string.format('%.17g', remaining)
  out[#out + 1] = string.format('%.17g', wait)
  out[#out + 1] = string.format('%.17g', reset)
end
return out
