-- After lua/token_bucket.lua: a global key claimed by a region whose Redis
-- restarted empty (src/region/generation.rs) starts with no tokens. A
-- missing bucket reads as full, and nothing proves the region held any.
--
-- KEYS[1]  the bucket
-- ARGV[1]  a full burst, in µs (with the slack), as the checks send it
-- Returns 1 when the bucket was emptied, 0 when it was empty already.
local key, burst = KEYS[1], tonumber(ARGV[1])
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local tat = tat_read(key, call('MGET', key)[1], burst, now)
if tat >= now + burst then return 0 end
tat_write(key, now + burst, 0, now, nil)
return 1
