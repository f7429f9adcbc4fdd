-- Sliding window counter: at most `limit` per `window` milliseconds,
-- estimated from two fixed windows: count = previous × (overlap of the
-- sliding window with it) + current. It mostly refuses the burst that a
-- fixed window admits at its boundary. The client works out remaining,
-- wait and reset from the state the script answers
-- (src/algorithm/sliding_window.rs).
--
-- State is one string "<window index> <current> <previous>" written with
-- SET ... PX until the end of the next window (after which this window
-- no longer weighs anything), so every write carries its expiry.
--
-- A stored value counts as a state when it has that shape, its index is a
-- whole number no later than the current window's, and both counts are
-- numbers from 0 to 2^53 (a count above the limit is kept: the limit was
-- lowered; it fades as usual). An index older than the previous window's
-- weighs nothing. Anything else (another type, text, nan, inf, a negative
-- count, a future window) is not fleetlimit's: both windows start afresh
-- (the key is overwritten, or deleted when nothing is counted).
--
-- Read: `raw` is the key's value from the driver's MGET (false: no key, or
-- a key of another type). Returns whether `cost` fits, the two counts and
-- whether the key holds a state of fleetlimit's.
local function sliding_window_read(key, raw, limit, window, now, cost)
  local now_ms = math.floor(now / 1000)
  local idx = math.floor(now_ms / window)
  local elapsed = now_ms - idx * window
  local curr, prev, stored = 0, 0, false
  if raw then
    local a, b, c = string.match(raw, '^(%S+) (%S+) (%S+)$')
    local sidx, sc, sp = tonumber(a), tonumber(b), tonumber(c)
    if sidx and sc and sp and sidx - sidx == 0 and sidx == math.floor(sidx) and sidx <= idx
        and sc >= 0 and sc <= 2 ^ 53 and sp >= 0 and sp <= 2 ^ 53 then
      stored = true
      if sidx == idx then
        curr, prev = sc, sp
      elseif sidx == idx - 1 then
        prev = sc
      end
    end
  end
  local est = prev * (window - elapsed) / window + curr
  return cost <= 0 or limit - est >= cost, curr, prev, stored
end

-- Write: charges `cost` when `charge` (a refund never below zero).
-- Answers ms into the current window (−1 − that when `cost` did not fit),
-- then its count and the previous window's, as integers (Redis truncates
-- a Lua number), or as text when fractional (a fractional cost).
local function sliding_window_write(key, charge, enough, curr, prev, stored, window, now, cost)
  local now_ms = math.floor(now / 1000)
  local idx = math.floor(now_ms / window)
  local elapsed = now_ms - idx * window
  if charge then
    curr = math.max(0, curr + cost)
    call('SET', key, string.format('%d %.17g %.17g', idx, curr, prev), 'PX', 2 * window - elapsed)
  elseif not stored then
    call('DEL', key)
  end
  if curr % 1 ~= 0 then curr = string.format('%.17g', curr) end
  if prev % 1 ~= 0 then prev = string.format('%.17g', prev) end
  if enough then return elapsed, curr, prev end
  return -1 - elapsed, curr, prev
end
