-- The token bucket's steps in the general script (lua/decide.lua), on
-- lua/token_bucket.lua's `tat_read` and `tat_write`. Kept out of the lean
-- script, which would build them on every call for nothing.
local token_bucket = {}

function token_bucket.read(key, cap, rate, now)
  local per = 1000000 / rate
  local burst = cap * per
  -- pcall: a key of another type answers an error table, not a failure.
  local raw = rpcall('GET', key)
  local tat, stored = tat_read(key, raw, burst, now)
  if raw and not stored then
    -- Not a TAT fleetlimit wrote: a full bucket, and no trace of it stays.
    call('DEL', key)
  end
  return { per = per, burst = burst, tat = tat, now = now, avail = (now + burst - tat) / per }
end

-- Takes `cost` tokens. Always sets the expiry: the general script repairs
-- a key whose expiry something else removed.
function token_bucket.write(key, s, cost, now)
  s.tat = tat_write(key, s.tat, cost * s.per, now, nil)
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
