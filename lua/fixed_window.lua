-- Fixed window: at most `limit` per `window` milliseconds.
--
-- INCRBY, then PEXPIRE ... NX: the window opens with the key's first
-- counted request and closes when its expiry fires (Redis's clock, never a
-- server's, and no fleet-wide reset at the top of the minute). NX means a
-- counter some older code left without an expiry is repaired at its next
-- hit, refused or not, and a live window is never extended.
--
-- A stored value counts as a count when INCRBY takes it and it stays exact
-- in a Lua number: "0" or a positive integer of at most 15 digits, without
-- sign, spaces or leading zeros; and its expiry is at most one window away
-- (or missing: older code, repaired as above). A count above the limit is
-- kept (the limit was lowered): it refuses until its window ends, as a full
-- window does. Anything else (another type, text, a negative, fractional,
-- nan or inf count, an expiry beyond the window) is not fleetlimit's: the
-- key is deleted and the window starts afresh.
local fixed_window = {}

function fixed_window.read(key, limit, window, now)
  local count, pttl = 0, -2
  -- pcall: a key of another type answers an error table, not a failure.
  local raw = redis.pcall('GET', key)
  if raw then
    if type(raw) == 'string' and (raw == '0' or (#raw <= 15 and string.find(raw, '^[1-9]%d*$'))) then
      count = tonumber(raw)
      pttl = redis.call('PTTL', key)
    end
    if pttl == -2 or pttl > window then
      -- Not a count fleetlimit wrote (or another algorithm's state, the
      -- limit was changed): the window starts afresh.
      redis.call('DEL', key)
      count, pttl = 0, -2
    end
  end
  return { limit = limit, window = window, count = count, pttl = pttl, avail = limit - count }
end

function fixed_window.write(key, s, cost, now)
  if cost >= 0 then
    s.count = redis.call('INCRBY', key, cost)
  else
    -- A refund never takes the count below zero.
    local back = math.min(-cost, s.count)
    if back <= 0 then return end
    s.count = redis.call('DECRBY', key, back)
  end
  redis.call('PEXPIRE', key, s.window, 'NX')
  s.pttl = redis.call('PTTL', key)
end

-- A refusal writes nothing, but still repairs a key without an expiry.
function fixed_window.keep(key, s)
  if s.pttl == -1 then
    redis.call('PEXPIRE', key, s.window, 'NX')
    s.pttl = s.window
  end
end

function fixed_window.report(s, cost)
  local left = 0
  if s.pttl > 0 then left = s.pttl / 1000 end
  local wait = 0
  if s.count + cost > s.limit then wait = left end
  return s.limit - s.count, wait, left
end
