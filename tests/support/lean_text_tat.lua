-- The lean script as fleetlimit sent it before the token bucket's TAT was
-- stored as 8 bytes (lua/token_bucket.lua then lua/token_bucket_lean.lua
-- at fd92df3, unchanged): the old release in tests/rolling_upgrade.rs.
-- Token bucket as GCRA: capacity `cap` (burst), refill `rate` per second.
-- The one Lua home of the token bucket's state rule (read, validity,
-- expiry) and arithmetic, first in both scripts (src/algorithm/): the
-- lean one follows it with lua/token_bucket_lean.lua, the general one
-- with lua/token_bucket_general.lua (the steps lua/decide.lua calls). So
-- either script may follow the other on one key.
--
-- State is one number per key: the bucket's "theoretical arrival time"
-- (TAT), in microseconds of Redis TIME. The bucket is full when TAT <= now;
-- it holds (now + cap × per − TAT) ÷ per tokens, where per = 1 ÷ rate is the
-- time one token takes to refill. Taking `cost` tokens moves TAT forward by
-- cost × per (a refund moves it back, never past now: full).
--
-- Expiry: a key expires 1 ms after the end of the second (Redis time)
-- AFTER the one in which its bucket is full again, so a missing (expired)
-- key is a full bucket, and it is set in the same SET as the TAT, so no
-- key ever lives without one. The extra second costs memory only (a key
-- lives 1 to 2 s past full instead of 0 to 1 s): a key requested about
-- once a second or more is rewritten in place instead of expired and
-- created again every second, and a TAT ≤ now answers as a missing key.
--
-- A stored value counts as a TAT when it is a finite number at most a full
-- burst (the check's own) ahead of now, or further ahead (a larger burst
-- when it was written, Redis's clock stepped back) when the key's expiry,
-- set at or after the TAT by every write, is no earlier than the TAT, and
-- at most FAR µs (about 35 years, so the lean script's answer stays an
-- exact integer) ahead; a TAT in the past is a full bucket. Anything else
-- (another type, text, nan, inf, -inf, 1e400, a far TAT with a shorter or
-- no expiry) is not fleetlimit's: the bucket is full, and the key is
-- written with its expiry when the request is admitted, or deleted when it
-- is not. So one key's bad state changes the answer for that key only.
local FAR = 2 ^ 50
local call, rpcall, ceil, format = redis.call, redis.pcall, math.ceil, string.format

-- The TAT the bucket at `key` starts from at `now` (`burst` in µs), given
-- `raw`, the key's value as read (false or nil: no key, or a key of
-- another type), and the stored TAT (nil: none fleetlimit wrote; the
-- caller overwrites or deletes the key).
local function tat_read(key, raw, burst, now)
  local stored = tonumber(raw)
  if stored and stored - stored == 0 and (stored <= now + burst
      or (stored - now <= FAR and call('PTTL', key) * 1000 >= stored - now)) then
    if stored > now then return stored, stored end
    return now, stored
  end
  return now, nil
end

-- Writes the TAT after taking `inc` µs of tokens from `tat` and returns it.
-- `kept`: the TAT the key holds, whose expiry (set by this rule) stands
-- while the new TAT falls in the same second (KEEPTTL spares most writes
-- setting one); nil always sets it.
local function tat_write(key, tat, inc, now, kept)
  local new = tat + inc
  if new < now then new = now end
  local second = ceil(new / 1000000)
  -- The TAT's text: its whole µs by %d and its quarter by hand, exact (a
  -- TAT is a whole number of quarter µs below 2^53) and read back as the
  -- same number, for less than Redis 7.0's %.17g of a Lua number.
  local frac = new % 1
  local text = format('%d', new - frac)
  if frac == 0.5 then text = text .. '.5'
  elseif frac == 0.25 then text = text .. '.25'
  elseif frac == 0.75 then text = text .. '.75'
  elseif frac ~= 0 then text = new end
  if kept and second == ceil(kept / 1000000) then
    call('SET', key, text, 'KEEPTTL')
  else
    call('SET', key, text, 'PXAT', format('%d', second * 1000 + 1001))
  end
  return new
end
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
-- written as its whole µs by %d and its quarter by hand (tat_write):
-- exact, for less than Redis 7.0's %.17g of a Lua number. A write keeps
-- the key's TTL while its TAT stays in the same second.
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
--                      checks then read each key's latest TAT from this
--                      call's own writes (a table the call otherwise skips)
-- Returns one integer per check, in quarter µs: 4 × (TAT − now) after the
-- charge when admitted (≥ 0), or −1 − 4 × (TAT − now) when refused (nothing
-- written), then now (µs). TAT and now are whole multiples of 0.25 µs (a
-- double's step at this magnitude), so both are exact. When a command
-- fails, the answers are fewer: those before the failing check, then its
-- error text, then now. Run after its bound: { 'LATE', now }.
local keys, argv = KEYS, ARGV
local n = #keys
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local not_after = tonumber(argv[1])
if not_after and now > not_after then return { 'LATE', now } end
local out = {}
local function decide()
  local vals = call('MGET', unpack(keys))
  -- key → its TAT written in this call (false: deleted in this call).
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
      local new = tat_write(key, tat, inc, now, stored)
      out[i] = (new - now) * 4
      if latest then latest[key] = new end
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
