-- The exchange's bookkeeping in one region's Redis (src/region/exchange.rs),
-- for one global limit: every key below shares the limit's hash tag, so a
-- call touches one slot. Shares and amounts are integers: parts per million
-- of the limit. A region's own share of a store key is in `share` (absent:
-- the configured split); what it took from itself for another region waits
-- in `held` ("<key>|<region>" → "<ppm>:<not before, µs of TIME>"), then is
-- added to `given` (cumulative); what it received is in `got` (cumulative,
-- "<key>|<from region>"). Every hash keeps an expiry (ARGV[1], ms).
--
-- ARGV[2] names the step:
--   read     KEYS: any hashes         → HGETALL of each
--   give     KEYS: share, held        ARGV: key, share as read ("" none),
--            new share, default share, hold µs, then (region, ppm) pairs
--            → 1, or 0 when the share changed since it was read
--   release  KEYS: held, given        → `given` after moving what is due
--   apply    KEYS: share, got         ARGV: key, from, given total, share
--            as read, got as read ("" none), new share, default share
--            → 1, or 0 when either changed since it was read
--   count    KEYS: demand             ARGV: (key, amount) pairs → 1
--   peek     KEYS: share, got         ARGV: key, from → { share, got },
--            each "" when none
local ttl, step = ARGV[1], ARGV[2]
local function now()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end
local function keep()
  for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl) end
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
  return out
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
  keep()
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
      redis.call('HINCRBY', KEYS[2], held[i], amount)
      redis.call('HDEL', KEYS[1], held[i])
    end
  end
  keep()
  return redis.call('HGETALL', KEYS[2])
elseif step == 'apply' then
  local key, field = ARGV[3], ARGV[3] .. '|' .. ARGV[4]
  if (redis.call('HGET', KEYS[1], key) or '') ~= ARGV[6] then return 0 end
  if (redis.call('HGET', KEYS[2], field) or '') ~= ARGV[7] then return 0 end
  set_share(key, ARGV[8], ARGV[9])
  redis.call('HSET', KEYS[2], field, ARGV[5])
  keep()
  return 1
elseif step == 'peek' then
  return { redis.call('HGET', KEYS[1], ARGV[3]) or '',
           redis.call('HGET', KEYS[2], ARGV[3] .. '|' .. ARGV[4]) or '' }
elseif step == 'count' then
  for i = 3, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
  keep()
  return 1
end
return redis.error_reply('unknown step ' .. tostring(step))
