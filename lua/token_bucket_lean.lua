-- fleetlimit's default script: token-bucket checks, each against one bucket,
-- one or many per call (the layer coalesces checks that are in flight at the
-- same moment; see src/store/batch.rs). Same state as lua/token_bucket.lua
-- (GCRA: the key holds the bucket's theoretical arrival time, TAT, in µs of
-- Redis TIME), decided in order: a key named twice sees its own earlier write.
--
-- It does only what Redis must: TIME once per call, then GET and (when
-- admitted) SET per check. The client does the rest of the arithmetic,
-- before (what a check costs and what a full burst spans, in µs) and after
-- (the headers, from TAT − now). Nothing is formatted in Lua (string
-- formatting is costly in Redis's Lua): Redis writes the TAT with %.17g
-- (exact), and the answers are integers.
--
-- Expiry: a key expires 1 ms after the end of the second (Redis time) in
-- which its bucket is full again, so a missing key is a full bucket. A write
-- whose new TAT falls in the same second as the stored one keeps the TTL it
-- has (KEEPTTL), which spares most writes the cost of setting an expiry.
-- lua/token_bucket.lua always sets
-- the same expiry, so either script may follow the other on one key.
--
-- KEYS[i]              the bucket of check i
-- ARGV[2i-1], ARGV[2i] its cost × emission interval and capacity × emission
--                      interval, in µs (a negative cost is a refund)
-- Returns one integer per check, in quarter µs: 4 × (TAT − now) after the
-- charge when admitted (≥ 0), or −1 − 4 × (TAT − now) when refused (nothing
-- written). TAT and now are whole multiples of 0.25 µs (a double's step at
-- this magnitude), so both are exact.
local call, ceil, keys, argv = redis.call, math.ceil, KEYS, ARGV
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local out = {}
for i = 1, #keys do
  local key = keys[i]
  local stored = tonumber(call('GET', key))
  local tat = stored or now
  if tat < now then tat = now end
  local new = tat + argv[2 * i - 1]
  if new < now then new = now end
  local ahead = new - now
  if ahead > tonumber(argv[2 * i]) then
    out[i] = -1 - (tat - now) * 4
  else
    local second = ceil(new / 1000000)
    if stored and second == ceil(stored / 1000000) then
      call('SET', key, new, 'KEEPTTL')
    else
      call('SET', key, new, 'PXAT', second * 1000 + 1)
    end
    out[i] = ahead * 4
  end
end
return out
