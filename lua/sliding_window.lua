-- Sliding window counter: at most `p1` per `p2` milliseconds, estimated
-- from two fixed windows: count = previous × (overlap of the sliding
-- window with it) + current. It mostly refuses the burst that a fixed
-- window admits at its boundary. A block of the general script (see
-- lua/decide.lua); the client works out remaining, wait and reset from the
-- state it answers (src/algorithm/sliding_window.rs).
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
-- Answers ms into the current window (−1 − that when the cost did not
-- fit), then its count and the previous window's after the decision, as
-- integers, or as text when fractional (a fractional cost).
if alg == 's' then
  -- Whole numbers below 2^53 (µs, a window in whole ms): % and / are
  -- exact, and cheaper than math.floor's calls.
  local now_ms = (now - now % 1000) / 1000
  local elapsed = now_ms % p2
  local idx = (now_ms - elapsed) / p2
  if not write then
    -- stored: the stored index's text when it is this window's, true for
    -- an older state, false for none; ptext: the previous count's text.
    -- A write reuses both, as Redis's number printing is costly.
    local raw, curr, prev, stored, ptext = vals[i], 0, 0, false, '0'
    if raw then
      -- Digits coerce with one strtod where tonumber takes two.
      local x, y, z = string.match(raw, '^(%d+) (%d+) (%d+)$')
      local sidx, sc, sp
      if x then
        sidx, sc, sp = x + 0, y + 0, z + 0
      else
        x, y, z = string.match(raw, '^(%S+) (%S+) (%S+)$')
        sidx, sc, sp = tonumber(x), tonumber(y), tonumber(z)
      end
      if sidx and sc and sp and sidx - sidx == 0 and sidx % 1 == 0 and sidx <= idx
          and sc >= 0 and sc <= 2 ^ 53 and sp >= 0 and sp <= 2 ^ 53 then
        stored = true
        if sidx == idx then
          curr, prev, stored, ptext = sc, sp, x, z
        elseif sidx == idx - 1 then
          prev, ptext = sc, y
        end
      end
    end
    local est = prev * (p2 - elapsed) / p2 + curr
    out[b], out[b + 1], out[b + 2], out[b + 3], out[b + 4] =
      cost <= 0 or p1 - est >= cost, curr, prev, stored, ptext
  else
    local curr, prev = out[b + 1], out[b + 2]
    if charge then
      -- A refund never below zero.
      curr = curr + cost
      if curr <= 0 then curr = 0 end
      -- Lua prints numbers with %.14g: exact for integers below 1e14.
      local itext, ctext = out[b + 3], curr
      if itext == true or not itext then
        itext = idx
        if idx >= 1e14 then itext = string.format('%d', idx) end
      end
      if curr == cost and cost > 0 then
        ctext = argv[2]
      elseif curr % 1 ~= 0 or curr >= 1e14 then
        ctext = string.format('%.17g', curr)
      end
      call('SET', key, itext .. ' ' .. ctext .. ' ' .. out[b + 4], 'PX', 2 * p2 - elapsed)
    elseif not out[b + 3] then
      call('DEL', key)
    end
    if curr % 1 ~= 0 then curr = string.format('%.17g', curr) end
    if prev % 1 ~= 0 then prev = string.format('%.17g', prev) end
    o = o + 3
    if enough then out[o - 2] = elapsed else out[o - 2] = -1 - elapsed end
    out[o - 1], out[o] = curr, prev
  end
end
