-- Token bucket as GCRA: capacity `cap` (burst), refill `rate` per second.
--
-- State is one number per key: the bucket's "theoretical arrival time"
-- (TAT), in microseconds of Redis TIME. The bucket is full when TAT <= now;
-- it holds (now + cap × per − TAT) ÷ per tokens, where per = 1 ÷ rate is the
-- time one token takes to refill. Taking `cost` tokens moves TAT forward by
-- cost × per. The key is written with SET … PX = time until full, so the
-- value and its expiry are one write, no key ever lives without a TTL, and
-- an expired (missing) key is exactly a full bucket.
--
-- lua/token_bucket_one.lua is the same arithmetic for the common case of a
-- request counted against a single token bucket.
local token_bucket = {}

function token_bucket.read(key, cap, rate, now)
  local per = 1000000 / rate
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  return { per = per, burst = cap * per, tat = tat, now = now, avail = (now + cap * per - tat) / per }
end

-- Takes `cost` tokens (a negative cost is a refund, never past full).
function token_bucket.write(key, s, cost, now)
  local tat = s.tat + cost * s.per
  if tat < now then tat = now end
  s.tat = tat
  redis.call('SET', key, string.format('%.17g', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
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
