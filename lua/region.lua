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
--   gen              hash: `rule:<region>|<fingerprint>` → ms of its last
--                    publication (src/region/agreement.rs); `born`, ms
--                    of its creation; `id`, this Redis's generation of the exchange's
--                    state (created when first read); `restart` = 1 when
--                    it replaced one an instance or a region knew: then a
--                    key absent from `share` is unclaimed (decided as 0)
--                    until a claim writes what the others' records prove
--   seen             hash: region → the generation its last push or claim
--                    came from (a push of an older one is refused)
-- Each key written keeps an expiry (ARGV[1], ms).
--
-- ARGV[2] names the step:
--   read     KEYS: hashes; ARGV[3]: how many of the first KEYS to keep
--            alive; ARGV[4] (optional): the index of the gen hash among
--            KEYS, created first with id ARGV[6] if missing, marked a
--            restart if ARGV[5] (the id the caller knew, "" none) differs;
--            ARGV[7] (optional): a `rule:<region>|<fingerprint>` field
--            set to now (ms), after dropping those older than ARGV[8] ms
--            → HGETALL of each
--   count    KEYS: demand; ARGV: (key, amount) pairs → 1
--   give     KEYS: share, held, gen; ARGV: key, share as read ("" none),
--            new share, default share, generation id as read, hold µs,
--            then (region, amount) pairs → 1, or 0 when the share or the
--            generation changed since it was read, or the key is unclaimed
--   release  KEYS: held, pending; ARGV: the given keys' prefix → the
--            pending totals, after moving what is due (and dropping what
--            waited over half the expiry: lost, never counted twice)
--   peek     KEYS: share; ARGV: key, got key → { share, got } ("": none)
--   apply    KEYS: share, gen, seen; ARGV: key, got key, total, share as
--            read, got as read, new share, default share, giver, giver's
--            generation → 1, or 0 when either changed, the key is
--            unclaimed, there is no generation yet (a Redis restarted
--            empty, not read by its instances yet), or the giver's
--            generation is older than one seen
--   fence    KEYS: seen; ARGV: claimer, its generation, given prefix, got
--            prefix, then keys → { given, got } per key (toward and from
--            the claimer), after recording its generation (older ones'
--            pushes refused from then on)
--   claim    KEYS: share, gen; ARGV: key, share, generation id, got
--            prefix, given prefix, then (region, given by it, got from
--            here) triples → 1, or 0 when claimed already or the
--            generation changed
--   note     KEYS: gen; ARGV: `rule:` fields (other regions' rules) → 1,
--            each set to now (ms)
--   mark     KEYS: gen; ARGV: id → 1 when it was marked a restart (a
--            region knew an older generation), 0 when the id changed
--   ack      KEYS: pending; ARGV: field, total → 1 when it was pending
local ttl, step = ARGV[1], ARGV[2]
local function now()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end
local function keep(n)
  for i = 1, n do redis.call('PEXPIRE', KEYS[i], ttl) end
end
-- Under a restart generation (gen in KEYS[2]) an absent share is
-- unclaimed, not the split: every share is written.
local function set_share(key, new, default, gen)
  if new == default and not (gen and redis.call('HGET', gen, 'restart')) then
    redis.call('HDEL', KEYS[1], key)
  else
    redis.call('HSET', KEYS[1], key, new)
  end
end
local function unclaimed(key, gen)
  return redis.call('HGET', gen, 'restart') and not redis.call('HGET', KEYS[1], key)
end
if step == 'read' then
  local g = tonumber(ARGV[4] or '0')
  if g > 0 then
    local gen, known = KEYS[g], ARGV[5]
    local id = redis.call('HGET', gen, 'id')
    if not id then
      redis.call('HSET', gen, 'id', ARGV[6], 'born', math.floor(now() / 1000))
      redis.call('PEXPIRE', gen, ttl)
    end
    if known ~= '' and known ~= (id or ARGV[6]) then
      redis.call('HSET', gen, 'restart', 1)
    end
    if ARGV[7] then
      -- This instance's rule, published; rules not published for ARGV[8]
      -- ms dropped.
      local ms = math.floor(now() / 1000)
      local fields = redis.call('HGETALL', gen)
      for i = 1, #fields, 2 do
        if string.sub(fields[i], 1, 5) == 'rule:' and ms - (tonumber(fields[i + 1]) or 0) > tonumber(ARGV[8]) then
          redis.call('HDEL', gen, fields[i])
        end
      end
      redis.call('HSET', gen, ARGV[7], ms)
    end
  end
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
  if redis.call('HGET', KEYS[3], 'id') ~= ARGV[7] or unclaimed(key, KEYS[3]) then return 0 end
  set_share(key, ARGV[5], ARGV[6], KEYS[3])
  local after = string.format('%d', now() + tonumber(ARGV[8]))
  for i = 9, #ARGV, 2 do
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
  -- No generation: a Redis restarted empty that none of its instances
  -- has read yet (they mark it a restart): nothing is counted before.
  if not redis.call('HGET', KEYS[2], 'id') or unclaimed(key, KEYS[2]) then return 0 end
  local seen = redis.call('HGET', KEYS[3], ARGV[10])
  if seen and seen ~= ARGV[11] then return 0 end
  redis.call('HSET', KEYS[3], ARGV[10], ARGV[11])
  set_share(key, ARGV[8], ARGV[9], KEYS[2])
  redis.call('SET', got, ARGV[5], 'PX', ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
  keep(1)
  return 1
elseif step == 'fence' then
  redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ttl)
  local out = {}
  for i = 7, #ARGV do
    local field = ARGV[i] .. '|' .. ARGV[3]
    out[#out + 1] = { redis.call('GET', ARGV[5] .. field) or '0', redis.call('GET', ARGV[6] .. field) or '0' }
  end
  return out
elseif step == 'claim' then
  local key = ARGV[3]
  if redis.call('HGET', KEYS[2], 'id') ~= ARGV[5] or not unclaimed(key, KEYS[2]) then return 0 end
  redis.call('HSET', KEYS[1], key, ARGV[4])
  -- The totals go on from the other regions' records: what they gave is
  -- received, what they received from here is given.
  for i = 8, #ARGV, 3 do
    local field = key .. '|' .. ARGV[i]
    redis.call('SET', ARGV[6] .. field, ARGV[i + 1], 'PX', ttl)
    redis.call('SET', ARGV[7] .. field, ARGV[i + 2], 'PX', ttl)
  end
  keep(2)
  return 1
elseif step == 'note' then
  local ms = math.floor(now() / 1000)
  for i = 3, #ARGV do redis.call('HSET', KEYS[1], ARGV[i], ms) end
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
elseif step == 'mark' then
  if redis.call('HGET', KEYS[1], 'id') ~= ARGV[3] then return 0 end
  redis.call('HSET', KEYS[1], 'restart', 1)
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
