-- fleetlimit: every limit of one request, decided in one atomic call.
--
-- KEYS[i]        the key of limit i (all in one hash slot on a cluster)
-- ARGV[1]        not after: the latest Redis time (µs) at which this call
--                may change anything, when its caller stops waiting ("":
--                no bound); a call run later changes nothing
--                (src/store/redis/clock.rs)
-- ARGV[2]        cost: units each limit must give (negative: a refund)
-- ARGV[3]        the request's slot id (concurrency limits; "" without one)
-- ARGV[4i..4i+3] for limit i: algorithm ("t" token bucket, "f" fixed
--                window, "s" sliding window, "c" concurrency), its two
--                parameters, and "1" when the limit is in shadow mode
--
-- All or nothing: when any enforced limit lacks room, none is charged.
-- Shadow limits are counted when they have room and never refuse.
-- The clock is Redis TIME: one clock for the whole fleet.
--
-- Redis runs this whole text on every call, and every function or table
-- it builds costs on every call. So the algorithms are not functions: the
-- script is this file, then one block per algorithm (lua/token_bucket_
-- general.lua, fixed_window.lua, sliding_window.lua, concurrency.lua:
-- `if alg == <code> then ... end`), then lua/decide_end.lua, all inside
-- the two passes below. For limit i, in the block of its algorithm:
--   pass 1 (`write` false) reads its key (a string-valued key's value is
--     `vals[i]`, from one MGET: false for a missing key or one of another
--     type) and sets out[b] to whether the cost fits, then its state in
--     out[b + 1 ..] (4 values at most);
--   pass 2 (`write` true; `enough`: whether the cost fit) reads its state
--     back, charges the cost when `charge` (admitted, and the cost fit), or
--     deletes a key that holds nothing of fleetlimit's, then appends its
--     answer to `out` (after `o`, moving `o` on).
-- One table holds both, so the call builds one: the answers (3 a limit
-- at most, after the verdict) never reach a later limit's state (5 a
-- limit), only the limit's own, which its block reads first.
-- `p1`, `p2` are the limit's parameters as numbers, `s1`, `s2` as sent.
-- Returns { allowed (1 or 0), then each limit's answer: integers, which
-- Redis passes as they are (it truncates any other Lua number), then now
-- (µs) }; the client works out remaining, wait and reset
-- (Rule::script_answer). Run after its bound: { 'LATE', now }.
local keys, argv = KEYS, ARGV
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local not_after = tonumber(argv[1])
if not_after and now > not_after then return { 'LATE', now } end
local now_text
local cost = tonumber(argv[2])
local n = #keys
local vals
-- The reply, and each limit's state between the passes (5 values from
-- b = 5i − 4). Sized for one limit.
local out = { false, false, false, false, false }
local o = 1
local allowed = true
-- Limits of one shape share their argument strings: read each once.
local s1, s2, p1, p2

for pass = 1, 2 do
  local write = pass == 2
  for i = 1, n do
    local a, b = 4 * i, 5 * i - 4
    local alg, key = argv[a], keys[i]
    if argv[a + 1] ~= s1 then s1 = argv[a + 1]; p1 = tonumber(s1) end
    if argv[a + 2] ~= s2 then s2 = argv[a + 2]; p2 = tonumber(s2) end
    local enough = out[b]
    local charge = write and allowed and enough
    if not write then
      out[b] = nil
      if alg ~= 'c' and not vals then vals = call('MGET', unpack(keys)) end
    end
