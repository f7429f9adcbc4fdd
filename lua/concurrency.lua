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
--
-- Scores go to Redis as text: `now_text` (TIME's own digits), and a
-- deadline printed with %d once (Redis prints a Lua number with %.17g, at
-- several times the cost). Deadlines are whole µs.
--
-- Read: returns whether a slot is free, how many are taken, and the
-- deadline a slot taken now gets (as text).
local function concurrency_read(key, max, hold, now, now_text, cost)
  local count = 0
  local deadline = string.format('%d', now + hold * 1000)
  -- pcall: a key of another type answers an error table, not a failure.
  local gone = rpcall('ZREMRANGEBYSCORE', key, '-inf', now_text)
  if type(gone) == 'table' then
    -- Not a set of slots fleetlimit wrote: the key starts empty.
    call('DEL', key)
  else
    count = call('ZCARD', key)
    if count > 0 then
      count = count - call('ZREMRANGEBYSCORE', key, '(' .. deadline, '+inf')
    end
  end
  return cost <= 0 or max - count >= 1, count, deadline
end

-- Write: takes one slot named `slot` when `charge` (a refund takes none).
-- Answers the slots taken after it (−1 − that when none was free), then,
-- in µs from now, the latest deadline in the set and, when none was free,
-- the earliest (0 without slots). The set is read for these only when
-- they are needed (after a charge the latest is the new slot's).
local function concurrency_write(key, charge, enough, count, deadline, hold, now, cost, slot)
  local last, first = 0, 0
  if charge and cost > 0 then
    count = count + call('ZADD', key, deadline, slot)
    call('PEXPIRE', key, string.format('%d', hold + 1))
    last = hold * 1000
  elseif count > 0 then
    -- A set some older code left without an expiry gets one.
    if call('PTTL', key) == -1 then call('PEXPIRE', key, string.format('%d', hold + 1)) end
    last = call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2] - now
  end
  if not enough then
    if count > 0 then first = call('ZRANGE', key, '0', '0', 'WITHSCORES')[2] - now end
    return -1 - count, last, first
  end
  return count, last, 0
end
