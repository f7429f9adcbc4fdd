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
-- The clock is Redis TIME: one clock for the whole fleet.
--
-- Redis runs this whole text on every call, so it builds no tables of
-- functions or per-limit state: each algorithm is two plain functions
-- (read, then write) dispatched by its code, and the state between them
-- sits in one flat table. The string-valued keys are read with one MGET.
-- Returns { allowed (1 or 0), then per limit its algorithm's answer: a
-- token bucket 1 integer, a fixed window 2, a sliding window or a
-- concurrency limit 3 } (see each algorithm's write step); the client
-- works out remaining, wait and reset (src/store/redis/script.rs).
local keys, argv = KEYS, ARGV
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local now_text
local cost = tonumber(argv[1])
local n = #keys
local vals
-- Per limit i, from 5i − 4: enough, then up to 3 state values and the
-- limit's second parameter. Sized for one limit.
local st = { false, false, false, false, false }
local allowed = true
-- Limits of one shape share their argument strings: read each once.
local s1, s2, p1, p2

for i = 1, n do
  local a = 4 * i - 1
  local alg, key = argv[a], keys[i]
  if argv[a + 1] ~= s1 then s1 = argv[a + 1]; p1 = tonumber(s1) end
  if argv[a + 2] ~= s2 then s2 = argv[a + 2]; p2 = tonumber(s2) end
  local enough, x, y, z
  if alg == 'c' then
    -- TIME's digits, for the scores: µs padded to 6 digits.
    if not now_text then now_text = t[1] .. string.sub('00000' .. t[2], -6) end
    enough, x, y = concurrency_read(key, p1, p2, now, now_text, cost)
  else
    -- MGET answers false for a key of another type as for a missing one;
    -- each algorithm's write step overwrites or deletes such a key.
    if not vals then vals = call('MGET', unpack(keys)) end
    if alg == 't' then
      enough, x, y, z = token_bucket_read(key, vals[i], p1, p2, now, cost)
    elseif alg == 'f' then
      enough, x, y = fixed_window_read(key, vals[i], p1, p2, now, cost)
    elseif alg == 's' then
      enough, x, y, z = sliding_window_read(key, vals[i], p1, p2, now, cost)
    else
      return redis.error_reply('unknown algorithm ' .. tostring(alg))
    end
  end
  if not enough and argv[a + 3] ~= '1' then allowed = false end
  local b = 5 * i - 4
  st[b], st[b + 1], st[b + 2], st[b + 3], st[b + 4] = enough, x, y, z, p2
end

local out = { allowed and 1 or 0 }
local o = 1
for i = 1, n do
  local key, a, b = keys[i], 4 * i - 1, 5 * i - 4
  local alg = argv[a]
  local enough, x, y, z, p = st[b], st[b + 1], st[b + 2], st[b + 3], st[b + 4]
  local charge = allowed and enough
  if alg == 't' then
    out[o + 1] = token_bucket_write(key, charge, enough, x, y, z, now, cost)
    o = o + 1
  elseif alg == 'f' then
    out[o + 1], out[o + 2] = fixed_window_write(key, charge, enough, x, y, p, cost, argv[a + 2], argv[1])
    o = o + 2
  elseif alg == 's' then
    out[o + 1], out[o + 2], out[o + 3] = sliding_window_write(key, charge, enough, x, y, z, p, now, cost)
    o = o + 3
  else
    out[o + 1], out[o + 2], out[o + 3] = concurrency_write(key, charge, enough, x, y, p, now, cost, argv[2])
    o = o + 3
  end
end
return out
