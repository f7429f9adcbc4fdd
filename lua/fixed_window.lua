-- Fixed window: at most `limit` per `window` milliseconds.
--
-- The window opens with the key's first counted request (SET ... PX: the
-- count and its expiry at once) and closes when its expiry fires (Redis's
-- clock, never a server's, and no fleet-wide reset at the top of the
-- minute); INCRBY keeps the expiry, so a live window is never extended. A
-- counter some older code left without an expiry gets one at its next hit,
-- refused or not.
--
-- A stored value counts as a count when INCRBY takes it and it stays exact
-- in a Lua number: "0" or a positive integer of at most 15 digits, without
-- sign, spaces or leading zeros; and its expiry is at most one window away
-- (or missing: older code, repaired as above). A count above the limit is
-- kept (the limit was lowered): it refuses until its window ends, as a full
-- window does. Anything else (another type, text, a negative, fractional,
-- nan or inf count, an expiry beyond the window) is not fleetlimit's: the
-- window starts afresh (the key is overwritten, or deleted when nothing is
-- counted).
--
-- Read: `raw` is the key's value from the driver's MGET (false: no key, or
-- a key of another type). Returns whether `cost` fits, the count (nil: no
-- count of fleetlimit's) and the key's PTTL.
local function fixed_window_read(key, raw, limit, window, now, cost)
  local count, pttl = nil, -2
  if raw and (raw == '0' or (#raw <= 15 and string.find(raw, '^[1-9]%d*$'))) then
    pttl = call('PTTL', key)
    if pttl ~= -2 and pttl <= window then count = tonumber(raw) end
  end
  return cost <= 0 or limit - (count or 0) >= cost, count, pttl
end

-- Write: charges `cost` when `charge` (a refund never takes the count
-- below zero). Answers the count after it (−1 − count when `cost` did not
-- fit) and the window's PTTL in ms (−2: no window open).
-- `cost_text` and `window_text`: the arguments as sent (whole numbers
-- print as themselves), passed on as they are rather than printed again.
local function fixed_window_write(key, charge, enough, count, pttl, window, cost, window_text, cost_text)
  if not count then
    if charge and cost >= 0 and cost % 1 == 0 then
      -- A new window: whatever the key held is replaced, with its expiry.
      call('SET', key, cost == 0 and '0' or cost_text, 'PX', window_text)
      return cost, window
    end
    call('DEL', key)
    count, pttl = 0, -2
  end
  if charge then
    if cost >= 0 then
      count = call('INCRBY', key, cost_text)
    else
      local back = math.min(-cost, count)
      if back > 0 then count = call('DECRBY', key, back) end
    end
  end
  if pttl == -1 then
    call('PEXPIRE', key, window_text)
    pttl = window
  end
  if enough then return count, pttl end
  return -1 - count, pttl
end
