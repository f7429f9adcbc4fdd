-- The token bucket's block in the general script (see lua/decide.lua), on
-- lua/token_bucket.lua's `tat_read` and `tat_write`. `p1` is the capacity
-- with the slack (src/algorithm/token_bucket.rs), `p2` the refill per
-- second. Decides as the lean script and the Rust side do, and answers as
-- the lean script does, so the client decodes both alike: 4 × (TAT − now)
-- in quarter µs when the cost fit (after the charge, if any), or
-- −1 − 4 × (TAT − now) when not.
if alg == 't' then
  local per = 1000000 / p2
  if not write then
    local burst = p1 * per
    local tat, stored = tat_read(key, vals[i], burst, now)
    out[b], out[b + 1], out[b + 2] = cost <= 0 or tat + cost * per - now <= burst, tat, stored
  else
    local tat = out[b + 1]
    if charge then
      -- Always sets the expiry: the general script repairs a key whose
      -- expiry something else removed.
      tat = tat_write(key, tat, cost * per, now, nil)
    elseif not out[b + 2] then
      -- Not a TAT fleetlimit wrote (maybe a key of another type: MGET
      -- cannot tell it from a missing one, and deleting that is harmless).
      call('DEL', key)
    end
    o = o + 1
    if enough then out[o] = (tat - now) * 4 else out[o] = -1 - (tat - now) * 4 end
  end
end
