-- fleetlimit's default script, after lua/token_bucket.lua: token-bucket
-- checks, each against one bucket, one or many per call (the layer
-- coalesces checks that are in flight at the same moment; see
-- src/store/redis/batch.rs), decided in order: a key named twice sees its
-- own earlier write.
--
-- It does only what Redis must: TIME and one MGET of every key per call,
-- then (when admitted) one SET per check. The client does the rest of the
-- arithmetic, before (what a check costs and what a full burst spans, in
-- µs) and after (the headers, from TAT − now):
-- src/algorithm/token_bucket.rs. The answers are integers, and the TAT is
-- written as 8 bytes (tat_write): exact, with nothing to print. A write
-- keeps the key's TTL while its TAT stays in the same second. A call of one
-- check runs lua/token_bucket_one.lua instead, which decides alike.
--
-- MGET answers nil for a key of another type as for a missing one: both
-- are a full bucket; an admitted check overwrites the key (SET, with its
-- expiry), a refused one deletes it, so nothing fleetlimit did not write
-- stays, and every key it leaves has an expiry.
--
-- KEYS[i]              the bucket of check i
-- ARGV[1]              not after: the latest Redis time (µs) at which this
--                      call may change anything, when its caller stops
--                      waiting ("": no bound); a call run later changes
--                      nothing (src/store/redis/clock.rs)
-- ARGV[2i], ARGV[2i+1] its cost × emission interval and capacity × emission
--                      interval, in µs (a negative cost is a refund); the
--                      latter plus 0.5 µs of slack, so rounding to a quarter
--                      µs never refuses an exact fit (REDIS_SLACK_US)
-- ARGV[2n+2]           present when a key is named more than once: the
--                      checks then read each key's latest value from this
--                      call's own writes (a table the call otherwise skips)
-- On a Cluster, checks of several slots owned by one primary share a call
-- of this script flagged `allow-cross-slot-keys` (LEAN_CROSS in
-- src/algorithm/token_bucket.rs; src/store/redis/per_node.rs): Redis
-- refuses declared keys of several slots, and a MGET across slots, so such
-- a call declares none (numkeys 0), names its keys in ARGV after their
-- count (ARGV = n, keys, then the arguments above), and reads each key on
-- its own. A key that is not this node's (its slot moved, or is moving)
-- fails its read: nothing is decided then, and the reply is that error.
-- Returns one integer per check, in quarter µs: 4 × (TAT − now) after the
-- charge when admitted (≥ 0), or −1 − 4 × (TAT − now) when refused (nothing
-- written), then now (µs). TAT and now are whole multiples of 0.25 µs (a
-- double's step at this magnitude), so both are exact. When a command
-- fails, the answers are fewer: those before the failing check, then its
-- error text, then now. Run after its bound: { 'LATE', now }.
local keys, argv = KEYS, ARGV
local cross = #keys == 0
if cross then
  local m = tonumber(argv[1])
  keys, argv = { unpack(ARGV, 2, m + 1) }, { unpack(ARGV, m + 2) }
end
local n = #keys
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local not_after = tonumber(argv[1])
if not_after and now > not_after then return { 'LATE', now } end
local out = {}
local function decide()
  local vals
  if cross then
    -- One key a read (a single-key MGET: nil for another type, as MGET).
    vals = {}
    for i = 1, n do vals[i] = call('MGET', keys[i])[1] end
  else
    vals = call('MGET', unpack(keys))
  end
  -- key → its value written in this call (false: deleted in this call).
  local latest = argv[2 * n + 2] and {}
  -- Checks of one limit share their argument strings (one Lua string each).
  local last_inc, last_burst, inc, burst
  for i = 1, n do
    local key, raw = keys[i], vals[i]
    if latest then
      local w = latest[key]
      if w ~= nil then raw = w end
    end
    local a, b = argv[2 * i], argv[2 * i + 1]
    if a ~= last_inc then last_inc, inc = a, tonumber(a) end
    if b ~= last_burst then last_burst, burst = b, tonumber(b) end
    local tat, stored = tat_read(key, raw, burst, now)
    if tat + inc - now > burst then
      out[i] = -1 - (tat - now) * 4
      if not stored then
        -- Maybe a key of another type (MGET cannot tell it from a missing
        -- one: deleting that is harmless), or a value that is not a TAT.
        -- Only a cost above the capacity is refused on a full bucket.
        call('DEL', key)
        if latest then latest[key] = false end
      end
    else
      local new, value = tat_write(key, tat, inc, now, stored)
      out[i] = (new - now) * 4
      if latest then latest[key] = value end
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
out[#out + 1] = now
return out
