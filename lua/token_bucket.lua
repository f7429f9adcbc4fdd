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
-- The TAT is stored as an 8-byte little-endian double (struct.pack '<d'):
-- nothing to print or parse, and a smaller value in Redis. Earlier code
-- wrote it as decimal text, which is still read (a value of any length but
-- 8 is read as text, and no TAT in text is 8 bytes long: it has 16 digits
-- or more), so a rolling upgrade keeps every bucket (docs/operations.md).
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
-- at most 2^50 µs (about 35 years, so the lean script's answer stays an
-- exact integer) ahead; a TAT in the past is a full bucket. Anything else
-- (another type, words, nan, inf, -inf, 1e400, a far TAT with a shorter or
-- no expiry) is not fleetlimit's: the bucket is full, and the key is
-- written with its expiry when the request is admitted, or deleted when it
-- is not. So one key's bad state changes the answer for that key only.
-- The drivers' shorthands. The two functions below name what they use
-- through the globals instead: a function that captures locals (upvalues)
-- is built with them on every call, which cost a call of one check ~3,000
-- of Redis's instructions, more than the globals' lookups.
local call, rpcall, ceil = redis.call, redis.pcall, math.ceil

-- The TAT the bucket at `key` starts from at `now` (`burst` in µs), given
-- `raw`, the key's value as read (false or nil: no key, or a key of
-- another type), and the stored TAT (nil: none fleetlimit wrote; the
-- caller overwrites or deletes the key).
local function tat_read(key, raw, burst, now)
  local stored
  if raw then
    if #raw == 8 then stored = struct.unpack('<d', raw) else stored = tonumber(raw) end
  end
  if stored and stored - stored == 0 and (stored <= now + burst
      or (stored - now <= 1125899906842624 and redis.call('PTTL', key) * 1000 >= stored - now)) then
    if stored > now then return stored, stored end
    return now, stored
  end
  return now, nil
end

-- Writes the TAT after taking `inc` µs of tokens from `tat` and returns it,
-- and the value written.
-- `kept`: the TAT the key holds, whose expiry (set by this rule) stands
-- while the new TAT falls in the same second (KEEPTTL spares most writes
-- setting one); nil always sets it.
local function tat_write(key, tat, inc, now, kept)
  local new = tat + inc
  if new < now then new = now end
  local second = math.ceil(new / 1000000)
  local value = struct.pack('<d', new)
  if kept and second == math.ceil(kept / 1000000) then
    redis.call('SET', key, value, 'KEEPTTL')
  else
    redis.call('SET', key, value, 'PXAT', string.format('%d', second * 1000 + 1001))
  end
  return new, value
end
