-- fleetlimit's one-check script, after lua/token_bucket.lua: a call that
-- carries a single token-bucket check (a lone request, or a batch of one)
-- runs this instead of lua/token_bucket_lean.lua, and decides and answers
-- as that script does for one check. It skips what only a batch needs (the
-- loop, the table of this call's writes, the pcall around it all), and
-- its numbers come as one argument of three doubles rather than three
-- texts: Redis's Lua reads text numbers with C's strtod, which cost it more
-- than the rest of the decision's arithmetic.
--
-- KEYS[1]  the bucket
-- ARGV[1]  24 bytes, three little-endian doubles (struct '<ddd'): not
--          after (the latest Redis time, µs, at which the call may change
--          anything; +inf: no bound), the cost × emission interval and the
--          capacity × emission interval plus the slack, in µs (as the lean
--          script's ARGV[1], ARGV[2] and ARGV[3]; src/store/redis/reply.rs)
-- Returns { 4 × (TAT − now) after the charge, now } when admitted (≥ 0),
-- { −1 − 4 × (TAT − now), now } when refused (nothing written), the
-- failing command's error text in place of the first when the write
-- fails, or { 'LATE', now } when run after its bound (nothing written).
local key = KEYS[1]
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local not_after, inc, burst = struct.unpack('<ddd', ARGV[1])
if now > not_after then return { 'LATE', now } end
local tat, stored = tat_read(key, call('MGET', key)[1], burst, now)
if tat + inc - now > burst then
  -- Not fleetlimit's state (maybe a key of another type): nothing of it
  -- stays, as in the lean script.
  if not stored then call('DEL', key) end
  return { -1 - (tat - now) * 4, now }
end
local ok, new = pcall(tat_write, key, tat, inc, now, stored)
if not ok then
  return { type(new) == 'table' and new.err or tostring(new), now }
end
return { (new - now) * 4, now }
