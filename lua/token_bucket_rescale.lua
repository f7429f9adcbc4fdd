-- After lua/token_bucket.lua: a region's share of a global key grows
-- (src/region/exchange.rs), so its bucket is rescaled to keep the tokens it
-- holds, never to make any. A bucket of share s holds (now + burst − TAT)
-- × s ÷ per tokens: the room now + burst − TAT shrinks by from ÷ to. A
-- missing key is a bucket full at the old share, and is written. Readers
-- still on the old share see fewer tokens than it holds, never more.
--
-- KEYS[1]  the bucket
-- ARGV[1]  a full burst, in µs (with the slack), as the checks send it
-- ARGV[2]  the share before, ARGV[3] the share after (parts per million)
-- Returns 1 when the bucket was written, 0 when nothing changed.
local key = KEYS[1]
local burst, from, to = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
-- MGET, as the lean script: a key of another type reads as no bucket.
local raw = call('MGET', key)[1]
local tat = tat_read(key, raw, burst, now)
local room = (now + burst - tat) * from / to
-- A whole quarter µs later, never earlier: the room only shrinks.
local new = ceil((now + burst - room) * 4) / 4
if to <= from or new <= tat then return 0 end
tat_write(key, new, 0, now, nil)
return 1
