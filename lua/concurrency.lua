-- Concurrency: at most `p1` requests of a key in flight at once, over the
-- whole fleet. `p2`: the longest one request holds its slot (max_hold,
-- ms), so an instance that dies holding slots leaks none of them. A block
-- of the general script (see lua/decide.lua).
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
-- Scores go to Redis as text: `now_text` (TIME's own digits) and a deadline
-- printed with %d once (Redis prints a Lua number with %.17g, at several
-- times the cost). Deadlines are whole µs.
--
-- State: the slots taken, and the deadline of a slot taken now. Answers
-- the slots taken after the decision (−1 − that when none was free), then,
-- in µs from now, the latest deadline in the set and, when none was free,
-- the earliest (0 without slots). The set is read for these only when
-- they are needed (after a charge the latest is the new slot's).
if alg == 'c' then
  if not write then
    if not now_text then now_text = t[1] .. string.sub('00000' .. t[2], -6) end
    local deadline = string.format('%d', now + p2 * 1000)
    local count = 0
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
    out[b], out[b + 1], out[b + 2] = cost <= 0 or p1 - count >= 1, count, deadline
  else
    local count, last, first = out[b + 1], 0, 0
    if charge and cost > 0 then
      count = count + call('ZADD', key, out[b + 2], argv[3])
      call('PEXPIRE', key, string.format('%d', p2 + 1))
      last = p2 * 1000
    elseif count > 0 then
      -- A set some older code left without an expiry gets one.
      if call('PTTL', key) == -1 then call('PEXPIRE', key, string.format('%d', p2 + 1)) end
      last = call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2] - now
    end
    if not enough and count > 0 then
      first = call('ZRANGE', key, '0', '0', 'WITHSCORES')[2] - now
    end
    o = o + 3
    if enough then out[o - 2] = count else out[o - 2] = -1 - count end
    out[o - 1], out[o] = last, first
  end
end
