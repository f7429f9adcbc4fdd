-- Token bucket as GCRA: capacity `cap` (burst), refill `rate` per second.
--
-- State is one number per key: the bucket's "theoretical arrival time"
-- (TAT), in microseconds of Redis TIME. The bucket is full when TAT <= now;
-- it holds (now + cap × per − TAT) ÷ per tokens, where per = 1 ÷ rate is the
-- time one token takes to refill. Taking `cost` tokens moves TAT forward by
-- cost × per. The key is written with its expiry in one SET, so no key ever
-- lives without a TTL: 1 ms after the end of the second (Redis time) in
-- which the bucket is full again, so an expired (missing) key is a full
-- bucket. lua/token_bucket_lean.lua (the common case: a request counted
-- against a single token bucket) keeps the same state and expiry rule, so
-- either script may follow the other on one key.
--
-- A stored value counts as a TAT when it is a finite number at most a full
-- burst ahead of now, or further ahead (a larger burst when it was written,
-- Redis's clock stepped back) when the key's expiry, set at or after the
-- TAT by every write, is no earlier than the TAT, and at most 2^50 µs
-- (about 35 years) ahead; a TAT in the past is a full bucket. Anything else
-- (another type, text, nan, inf, -inf, 1e400, a far TAT with a shorter or
-- no expiry) is not fleetlimit's: the bucket is full and the key is
-- deleted, then written with its expiry when the request is admitted.
local token_bucket = {}

function token_bucket.read(key, cap, rate, now)
  local per = 1000000 / rate
  local burst = cap * per
  -- pcall: a key of another type answers an error table, not a failure.
  local raw = redis.pcall('GET', key)
  local tat = tonumber(raw)
  if raw and not (tat and tat - tat == 0
      and (tat <= now + burst
        or (tat - now <= 2 ^ 50 and redis.call('PTTL', key) * 1000 >= tat - now))) then
    -- Not a TAT fleetlimit wrote: a full bucket, and no trace of it stays.
    redis.call('DEL', key)
    tat = nil
  end
  tat = tat or now
  if tat < now then tat = now end
  return { per = per, burst = burst, tat = tat, now = now, avail = (now + burst - tat) / per }
end

-- Takes `cost` tokens (a negative cost is a refund, never past full).
function token_bucket.write(key, s, cost, now)
  local tat = s.tat + cost * s.per
  if tat < now then tat = now end
  s.tat = tat
  redis.call('SET', key, string.format('%.17g', tat), 'PXAT', math.ceil(tat / 1000000) * 1000 + 1)
end

-- Nothing to repair: every write carries its expiry.
function token_bucket.keep(key, s)
end

-- remaining, seconds until `cost` fits (when it does not), seconds to full.
function token_bucket.report(s, cost)
  local remaining = (s.now + s.burst - s.tat) / s.per
  local wait = 0
  if remaining < cost then wait = (cost - remaining) * s.per / 1000000 end
  return remaining, wait, (s.tat - s.now) / 1000000
end
