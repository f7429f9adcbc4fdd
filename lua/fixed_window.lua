-- Fixed window: at most `p1` per `p2` milliseconds. A block of the general
-- script (see lua/decide.lua).
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
-- State: the count (nil: none of fleetlimit's) and the key's PTTL. Answers
-- the count after the decision (−1 − count when the cost did not fit) and
-- the window's PTTL in ms (−2: no window open). The cost and the window go
-- to Redis as the argument strings (whole numbers print as themselves).
if alg == 'f' then
  if not write then
    local raw, count, pttl = vals[i], nil, -2
    if raw and (raw == '0' or (#raw <= 15 and string.find(raw, '^[1-9]%d*$'))) then
      pttl = call('PTTL', key)
      if pttl ~= -2 and pttl <= p2 then count = tonumber(raw) end
    end
    out[b], out[b + 1], out[b + 2] = cost <= 0 or p1 - (count or 0) >= cost, count, pttl
  else
    local count, pttl = out[b + 1], out[b + 2]
    if not count and charge and cost >= 0 and cost % 1 == 0 then
      -- A new window: whatever the key held is replaced, with its expiry.
      call('SET', key, cost == 0 and '0' or argv[2], 'PX', s2)
      count, pttl = cost, p2
    else
      if not count then
        call('DEL', key)
        count, pttl = 0, -2
      end
      if charge then
        if cost >= 0 then
          count = call('INCRBY', key, argv[2])
        else
          -- A refund never takes the count below zero.
          local back = math.min(-cost, count)
          if back > 0 then count = call('DECRBY', key, back) end
        end
      end
      if pttl == -1 then
        call('PEXPIRE', key, s2)
        pttl = p2
      end
    end
    o = o + 2
    if enough then out[o - 1] = count else out[o - 1] = -1 - count end
    out[o] = pttl
  end
end
