-- Concurrency: at most `max` requests of a key in flight at once, over the
-- whole fleet. `hold`: the longest one request holds its slot (max_hold,
-- ms), so an instance that dies holding slots leaks none of them.
--
-- State is one sorted set per key: member = the request's slot id (unique
-- fleet-wide), score = its deadline in µs of Redis TIME (now + hold when it
-- was taken). A slot counts until it is released (ZREM by the instance
-- that served the request, when the response is over) or its deadline
-- passes, whichever is first. A request takes ONE slot whatever its cost;
-- a refund (negative cost) takes and gives back nothing here.
--
-- Expiry: every write sets PEXPIRE hold + 1 ms. Every deadline in the set
-- is at most now + hold (those further ahead are dropped on read: a clock
-- stepped back, a lowered max_hold, or not fleetlimit's), so the key lives
-- until its last slot's deadline at most and never without an expiry.
--
-- A key of another type is not fleetlimit's: it is deleted and the key
-- starts empty. So one key's bad state changes the answer for that key only.
local concurrency = {}

function concurrency.read(key, max, hold, now)
  local hold_us = hold * 1000
  local count = 0
  -- pcall: a key of another type answers an error table, not a failure.
  local gone = redis.pcall('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
  if type(gone) == 'table' and gone.err then
    -- Not a set of slots fleetlimit wrote: the key starts empty.
    redis.call('DEL', key)
  else
    count = redis.call('ZCARD', key)
    if count > 0 then
      count = count - redis.call('ZREMRANGEBYSCORE', key, string.format('(%d', now + hold_us), '+inf')
    end
  end
  return { key = key, max = max, hold = hold_us, now = now, count = count, avail = max - count, unit = 1 }
end

-- Takes one slot named `slot` (a refund takes none).
function concurrency.write(key, s, cost, now, slot)
  if cost <= 0 then return end
  local deadline = now + s.hold
  s.count = s.count + redis.call('ZADD', key, string.format('%d', deadline), slot)
  s.avail = s.max - s.count
  redis.call('PEXPIRE', key, math.floor(s.hold / 1000) + 1)
  s.last = deadline
end

-- A set some older code left without an expiry gets one.
function concurrency.keep(key, s)
  if s.count > 0 and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, math.floor(s.hold / 1000) + 1)
  end
end

-- The earliest (0) or latest (-1) deadline in the set.
local function deadline_at(key, i)
  return tonumber(redis.call('ZRANGE', key, i, i, 'WITHSCORES')[2])
end

-- remaining, seconds until a slot is likely free (when none is), seconds
-- until every slot held now has passed its deadline. The set is read for
-- these only when they are needed (after a charge the last deadline is
-- the new slot's, and an admitted request waits for nothing).
function concurrency.report(s, cost)
  local wait, reset = 0, 0
  if s.count > 0 then
    reset = ((s.last or deadline_at(s.key, -1)) - s.now) / 1000000
    if not s.enough then
      -- As long again as the oldest slot has been held, but no later than
      -- its deadline, and at least a second.
      local first = deadline_at(s.key, 0)
      local age = s.now - (first - s.hold)
      wait = math.max(1000000, math.min(age, first - s.now)) / 1000000
    end
  end
  return s.max - s.count, wait, reset
end
