-- Fixed window: at most `limit` per `window` milliseconds.
--
-- INCRBY, then PEXPIRE ... NX: the window opens with the key's first
-- counted request and closes when its expiry fires (Redis's clock, never a
-- server's, and no fleet-wide reset at the top of the minute). NX means a
-- counter some older code left without an expiry is repaired at its next
-- hit, refused or not, and a live window is never extended.
local fixed_window = {}

function fixed_window.read(key, limit, window, now)
  local raw = redis.call('GET', key)
  local count = tonumber(raw or '0')
  if not count then
    -- Another algorithm's state (the limit was changed): start afresh.
    redis.call('DEL', key)
    count = 0
  end
  local pttl = -2
  if count > 0 then pttl = redis.call('PTTL', key) end
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
