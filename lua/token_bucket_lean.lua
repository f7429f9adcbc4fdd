-- fleetlimit's default script, after lua/token_bucket.lua: token-bucket
-- checks, each against one bucket, one or many per call (the layer
-- coalesces checks that are in flight at the same moment; see
-- src/store/batch.rs), decided in order: a key named twice sees its own
-- earlier write.
--
-- It does only what Redis must: TIME once per call, then GET and (when
-- admitted) SET per check. The client does the rest of the arithmetic,
-- before (what a check costs and what a full burst spans, in µs) and after
-- (the headers, from TAT − now): src/algorithm/token_bucket.rs. Nothing is
-- formatted in Lua (string formatting is costly in Redis's Lua): Redis
-- writes the TAT with %.17g (exact), and the answers are integers. A write
-- keeps the key's TTL while its TAT stays in the same second.
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
local keys, argv = KEYS, ARGV
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local out = {}
local function decide()
  for i = 1, #keys do
    local key, burst, inc = keys[i], tonumber(argv[2 * i]), argv[2 * i - 1]
    local tat, stored = tat_read(key, burst, now)
    if tat + inc - now > burst then
      out[i] = -1 - (tat - now) * 4
    else
      out[i] = (tat_write(key, tat, inc, now, stored) - now) * 4
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
