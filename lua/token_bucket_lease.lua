-- fleetlimit's lease script, after lua/token_bucket.lua: a hot key's
-- partial lease (src/pipeline/lease/). It takes from one token bucket as
-- many whole requests' worth of tokens as are free, at most ARGV[4] of
-- them, possibly none, so an instance at the key's limit gets what there
-- is in one call instead of asking once per request; the answer also says
-- when the next tokens come (the client reads it from TAT − now).
--
-- KEYS[1]  the bucket
-- ARGV[1]  not after, as in lua/token_bucket_lean.lua ("": no bound)
-- ARGV[2]  one request's cost × emission interval, in µs (> 0)
-- ARGV[3]  capacity × emission interval plus the slack, in µs
-- ARGV[4]  most requests to take (a whole number ≥ 1)
-- Returns { requests taken, 4 × (TAT − now) after, now }, or, run after
-- its bound, { 'LATE', now } (nothing written).
local key, argv = KEYS[1], ARGV
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local not_after = tonumber(argv[1])
if not_after and now > not_after then return { 'LATE', now } end
local step, burst, most = tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4])
-- MGET, as the lean script: nil for a key of another type.
local tat, stored = tat_read(key, call('MGET', key)[1], burst, now)
local free = math.floor((burst - (tat - now)) / step)
if free > most then free = most end
-- Rounding of the division never grants a step the check would refuse.
if free > 0 and tat + free * step - now > burst then free = free - 1 end
if free > 0 then
  tat = tat_write(key, tat, free * step, now, stored)
else
  free = 0
  -- Not fleetlimit's state (or a cost above the capacity): as the lean
  -- script, nothing of it stays.
  if not stored then call('DEL', key) end
end
return { free, (tat - now) * 4, now }
