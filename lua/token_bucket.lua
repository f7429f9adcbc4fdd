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
