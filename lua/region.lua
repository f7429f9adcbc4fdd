-- The exchange's bookkeeping in one region's Redis (src/region/exchange.rs),
-- for one global limit: every key below shares the limit's hash tag, so a
-- call touches one slot. Shares and amounts are integers: millionths of the
-- limit. Per limit:
--   share            hash: store key → this region's share (absent: the
--                    configured split)
--   held             hash: "<key>|<region>" → "<amount>:<not before, µs of
--                    TIME>", quota taken from this region for another
--   given:<key>|<to> this region's total given to a region (a string key)
--   pending          hash: "<key>|<region>" → "<total>:<µs>", totals given
--                    and not yet acknowledged by the receiver
--   got:<key>|<from> the total this region received from a region
--   demand:<epoch>   hash: store key → what was asked in that interval
-- Each key written keeps an expiry (ARGV[1], ms).
--
-- ARGV[2] names the step:
--   read     KEYS: hashes; ARGV[3]: how many of the first KEYS to keep
--            alive → HGETALL of each
--   count    KEYS: demand; ARGV: (key, amount) pairs → 1
--   give     KEYS: share, held; ARGV: key, share as read ("" none), new
--            share, default share, hold µs, then (region, amount) pairs
--            → 1, or 0 when the share changed since it was read
--   release  KEYS: held, pending; ARGV: the given keys' prefix → the
--            pending totals, after moving what is due (and dropping what
--            waited over half the expiry: lost, never counted twice)
--   peek     KEYS: share; ARGV: key, got key → { share, got } ("": none)
--   apply    KEYS: share; ARGV: key, got key, total, share as read, got as
--            read, new share, default share → 1, or 0 when either changed
--   ack      KEYS: pending; ARGV: field, total → 1 when it was pending
local ttl, step = ARGV[1], ARGV[2]
local function now()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end
local function keep(n)
  for i = 1, n do redis.call('PEXPIRE', KEYS[i], ttl) end
end
local function set_share(key, new, default)
  if new == default then
    redis.call('HDEL', KEYS[1], key)
  else
    redis.call('HSET', KEYS[1], key, new)
  end
end
if step == 'read' then
  local out = {}
  for i = 1, #KEYS do out[i] = redis.call('HGETALL', KEYS[i]) end
  keep(tonumber(ARGV[3]))
  return out
elseif step == 'count' then
  for i = 3, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
  keep(1)
  return 1
elseif step == 'give' then
  local key = ARGV[3]
  if (redis.call('HGET', KEYS[1], key) or '') ~= ARGV[4] then return 0 end
  set_share(key, ARGV[5], ARGV[6])
  local after = string.format('%d', now() + tonumber(ARGV[7]))
  for i = 8, #ARGV, 2 do
    local field = key .. '|' .. ARGV[i]
    local amount = tonumber(ARGV[i + 1])
    local old = redis.call('HGET', KEYS[2], field)
    local held = old and tonumber(string.match(old, '^(%d+):'))
    if held then amount = amount + held end
    redis.call('HSET', KEYS[2], field, string.format('%d', amount) .. ':' .. after)
  end
  keep(2)
  return 1
elseif step == 'release' then
  local t = now()
  local held = redis.call('HGETALL', KEYS[1])
  for i = 1, #held, 2 do
    local amount, after = string.match(held[i + 1], '^(%d+):(%d+)$')
    if not amount then
      -- Not the exchange's: dropped (quota lost for a while, never doubled).
      redis.call('HDEL', KEYS[1], held[i])
    elseif tonumber(after) <= t then
      local given = ARGV[3] .. held[i]
      local total = redis.call('INCRBY', given, amount)
      redis.call('PEXPIRE', given, ttl)
      redis.call('HSET', KEYS[2], held[i], total .. ':' .. string.format('%d', t))
      redis.call('HDEL', KEYS[1], held[i])
    end
  end
  -- A total pushed for half the receiver's memory of totals is dropped:
  -- pushed later, it could be counted again.
  local pending = redis.call('HGETALL', KEYS[2])
  local out = {}
  for i = 1, #pending, 2 do
    local since = tonumber(string.match(pending[i + 1], ':(%d+)$'))
    if not since or t - since > tonumber(ttl) * 500 then
      redis.call('HDEL', KEYS[2], pending[i])
    else
      out[#out + 1] = pending[i]
      out[#out + 1] = pending[i + 1]
    end
  end
  keep(2)
  return out
elseif step == 'peek' then
  return { redis.call('HGET', KEYS[1], ARGV[3]) or '', redis.call('GET', ARGV[4]) or '' }
elseif step == 'apply' then
  local key, got = ARGV[3], ARGV[4]
  if (redis.call('HGET', KEYS[1], key) or '') ~= ARGV[6] then return 0 end
  if (redis.call('GET', got) or '') ~= ARGV[7] then return 0 end
  set_share(key, ARGV[8], ARGV[9])
  redis.call('SET', got, ARGV[5], 'PX', ttl)
  keep(1)
  return 1
elseif step == 'ack' then
  local v = redis.call('HGET', KEYS[1], ARGV[3])
  if v and string.match(v, '^(%d+):') == ARGV[4] then
    redis.call('HDEL', KEYS[1], ARGV[3])
    return 1
  end
  return 0
end
return redis.error_reply('unknown step ' .. tostring(step))
