-- Sliding window counter: at most `limit` per `window` milliseconds,
-- estimated from two fixed windows: count = previous × (overlap of the
-- sliding window with it) + current. It mostly refuses the burst that a
-- fixed window admits at its boundary.
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
-- count, a future window) is not fleetlimit's: the key is deleted and both
-- windows start afresh.
local sliding_window = {}

function sliding_window.read(key, limit, window, now)
  local now_ms = math.floor(now / 1000)
  local idx = math.floor(now_ms / window)
  local elapsed = now_ms - idx * window
  local curr, prev = 0, 0
  -- pcall: a key of another type answers an error table, not a failure.
  local v = redis.pcall('GET', key)
  if v then
    local sidx, sc, sp
    if type(v) == 'string' then
      local a, b, c = string.match(v, '^(%S+) (%S+) (%S+)$')
      sidx, sc, sp = tonumber(a), tonumber(b), tonumber(c)
    end
    if sidx and sc and sp and sidx - sidx == 0 and sidx == math.floor(sidx) and sidx <= idx
        and sc >= 0 and sc <= 2 ^ 53 and sp >= 0 and sp <= 2 ^ 53 then
      if sidx == idx then
        curr, prev = sc, sp
      elseif sidx == idx - 1 then
        prev = sc
      end
    else
      -- Not a state fleetlimit wrote: both windows start afresh.
      redis.call('DEL', key)
    end
  end
  local s = { limit = limit, window = window, idx = idx, elapsed = elapsed, curr = curr, prev = prev }
  s.avail = limit - sliding_window.estimate(s)
  return s
end

function sliding_window.estimate(s)
  return s.prev * (s.window - s.elapsed) / s.window + s.curr
end

function sliding_window.write(key, s, cost, now)
  s.curr = math.max(0, s.curr + cost)
  local ttl = 2 * s.window - s.elapsed
  redis.call('SET', key, string.format('%d %.17g %.17g', s.idx, s.curr, s.prev), 'PX', ttl)
end

function sliding_window.keep(key, s)
end

function sliding_window.report(s, cost)
  local est = sliding_window.estimate(s)
  local w = s.window
  local wait = 0
  if est + cost > s.limit then
    if s.curr + cost <= s.limit then
      -- The previous window's weight has to fade a little more.
      wait = (w - s.elapsed) - (s.limit - s.curr - cost) * w / s.prev
    elseif s.curr > 0 then
      -- Only after this window ends, once its count fades in turn.
      wait = (w - s.elapsed) + math.max(0, w * (1 - (s.limit - cost) / s.curr))
    else
      wait = w - s.elapsed
    end
  end
  local reset = 0
  if s.curr > 0 then
    reset = 2 * w - s.elapsed
  elseif s.prev > 0 then
    reset = w - s.elapsed
  end
  return s.limit - est, wait / 1000, reset / 1000
end
