-- Token bucket: capacity `cap` (burst), refill `rate` tokens per second.
--
-- State is one string "<tokens> <microseconds>", written with SET ... PX so
-- the value and its expiry are a single write: no key ever lives without a
-- TTL. A missing key is a full bucket, which is why the expiry (time to
-- refill fully, plus a second) loses nothing.
local token_bucket = {}

function token_bucket.read(key, cap, rate, now)
  local per_us = rate / 1000000
  local tokens = cap
  local v = redis.call('GET', key)
  if v then
    local sp = string.find(v, ' ', 1, true)
    if sp then
      local stored = tonumber(string.sub(v, 1, sp - 1))
      local at = tonumber(string.sub(v, sp + 1))
      if stored and at then
        local elapsed = now - at
        if elapsed < 0 then elapsed = 0 end
        tokens = math.min(cap, stored + elapsed * per_us)
      end
    end
  end
  return { cap = cap, per_us = per_us, avail = tokens, tokens = tokens }
end

-- Takes `cost` tokens (a negative cost is a refund, capped at capacity).
function token_bucket.write(key, s, cost, now)
  s.tokens = math.min(s.cap, s.tokens - cost)
  local ttl = math.ceil((s.cap - s.tokens) / s.per_us / 1000) + 1000
  redis.call('SET', key, string.format('%.17g %.17g', s.tokens, now), 'PX', ttl)
end

-- Nothing to repair: every write carries its expiry.
function token_bucket.keep(key, s)
end

-- remaining, seconds until `cost` fits (when it does not), seconds to full.
function token_bucket.report(s, cost)
  local wait = 0
  if s.tokens < cost then wait = (cost - s.tokens) / s.per_us / 1000000 end
  return s.tokens, wait, (s.cap - s.tokens) / s.per_us / 1000000
end
