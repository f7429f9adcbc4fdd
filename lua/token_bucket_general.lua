-- The token bucket's two steps in the general script (lua/decide.lua), on
-- lua/token_bucket.lua's `tat_read` and `tat_write`. Kept out of the lean
-- script, which would build them on every call for nothing.
--
-- Read: `raw` is the key's value from the driver's MGET (false: no key, or
-- a key of another type). Returns whether `cost` fits, then the state the
-- write step takes: the TAT the bucket starts from, the stored TAT (nil:
-- none fleetlimit wrote) and the µs one token takes (`cap` carries the
-- slack, see src/algorithm/token_bucket.rs). Compared as the lean script
-- and the Rust side do.
local function token_bucket_read(key, raw, cap, rate, now, cost)
  local per = 1000000 / rate
  local burst = cap * per
  local tat, stored = tat_read(key, raw, burst, now)
  return cost <= 0 or tat + cost * per - now <= burst, tat, stored, per
end

-- Write: takes `cost` tokens when `charge`, always setting the expiry (the
-- general script repairs a key whose expiry something else removed). A
-- key left unwritten that holds no TAT of fleetlimit's (maybe another
-- type: MGET cannot tell) is deleted. Answers as the lean script does, so
-- the client decodes both alike: 4 × (TAT − now) in quarter µs when
-- `cost` fit (after the charge, if any), −1 − 4 × (TAT − now) when not.
local function token_bucket_write(key, charge, enough, tat, stored, per, now, cost)
  if charge then
    tat = tat_write(key, tat, cost * per, now, nil)
  elseif not stored then
    call('DEL', key)
  end
  if enough then return (tat - now) * 4 end
  return -1 - (tat - now) * 4
end
