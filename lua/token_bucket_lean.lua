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
--                      interval, in µs (a negative cost is a refund); the
--                      latter plus 0.5 µs of slack, so rounding to a quarter
--                      µs never refuses an exact fit (REDIS_SLACK_US)
-- Returns one integer per check, in quarter µs: 4 × (TAT − now) after the
-- charge when admitted (≥ 0), or −1 − 4 × (TAT − now) when refused (nothing
-- written). TAT and now are whole multiples of 0.25 µs (a double's step at
-- this magnitude), so both are exact. When a command fails, the reply is
-- shorter: the answers before the failing check, then its error text.
--
-- What counts as a stored TAT (lua/token_bucket.lua applies the same rule):
-- a number, finite, and at most a full burst (`burst`, the check's own)
-- ahead of now; or further ahead (the limit had a larger burst when it was
-- written, or Redis's clock stepped back) when the key's expiry, which
-- every write sets at or after its TAT, is no earlier than the TAT, and at
-- most FAR µs (about 35 years, so the answer stays an exact integer) ahead.
-- A TAT in the past is a full bucket. Anything else (another type, text,
-- nan, inf, -inf, 1e400, a far TAT with a shorter or no expiry) is not
-- fleetlimit's: the bucket is full, and the key is deleted, then written
-- as usual when the check is admitted. So one key's bad state changes the
-- answer for that key only and never fails the call.
local FAR = 2 ^ 50
local call, rpcall, ceil, keys, argv = redis.call, redis.pcall, math.ceil, KEYS, ARGV
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local out = {}
local function decide()
  for i = 1, #keys do
    local key, burst = keys[i], tonumber(argv[2 * i])
    -- pcall: a key of another type answers an error table, not a failure.
    local raw = rpcall('GET', key)
    local stored = tonumber(raw)
    if raw and not (stored and stored - stored == 0
        and (stored <= now + burst
          or (stored - now <= FAR and call('PTTL', key) * 1000 >= stored - now))) then
      -- Not a TAT fleetlimit wrote: a full bucket, and no trace of it stays.
      call('DEL', key)
      stored = nil
    end
    local tat = stored or now
    if tat < now then tat = now end
    local new = tat + argv[2 * i - 1]
    if new < now then new = now end
    local ahead = new - now
    if ahead > burst then
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
end
-- A command that still fails (out of memory, a read-only replica, numbers
-- Redis refuses) ends the call with what was decided so far and the error
-- in the failing check's place: the checks before it stand (Redis keeps
-- their writes), the ones after it were not run.
local ok, err = pcall(decide)
if not ok then
  out[#out + 1] = type(err) == 'table' and err.err or tostring(err)
end
return out
