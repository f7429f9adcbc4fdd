#!/usr/bin/env bash
# Redis memory per live token bucket, as the layer writes them: the
# quickstart binary (release) on a redis-server of its own, one token bucket
# keyed by `x-api-key` (limit `per-key`, as in examples/quickstart.toml),
# 100,000 distinct API keys requested once each; then `MEMORY USAGE` of
# every bucket key (SAMPLES 0), and used_memory's growth, per key.
#
#   benches/redis_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${PORT:-7421}
HTTP=${HTTP:-7422}
KEYS=${KEYS:-100000}
. benches/redis_common.sh

redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >"$dir/redis.log" 2>&1 &
pids+=("$!")
wait_ping "$PORT"

cat >"$dir/limits.toml" <<TOML
[redis]
url = "redis://127.0.0.1:$PORT"
deadline = "500ms"

[limits.per-key]
key = "header:x-api-key"
capacity = 1000
refill = "1/h"

[[routes]]
path = "/"
methods = ["GET"]
limits = ["per-key"]
TOML
FLEETLIMIT_ADDR=127.0.0.1:$HTTP "$bin" "$dir/limits.toml" >"$dir/app.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$HTTP/" -H 'x-api-key: warm' && break; sleep 0.1; done
redis-cli -p "$PORT" FLUSHALL >/dev/null
before=$(redis-cli -p "$PORT" INFO memory | tr -d '\r' | sed -n 's/^used_memory:\([0-9]*\)/\1/p')

cat >"$dir/keys.lua" <<LUA
local n = tonumber(os.getenv("FROM")) or 0
request = function()
  -- (wrk builds one request it never sends: hence one more.)
  if n <= $KEYS then n = n + 1 end
  return wrk.format("GET", "/", { ["x-api-key"] = "caller-" .. n })
end
LUA
# Until every caller has its bucket (then the last one again), bounded.
for _ in $(seq 1 30); do
    FROM=$(redis-cli -p "$PORT" DBSIZE | tr -d '\r') \
        wrk -t1 -c1 -d10s -s "$dir/keys.lua" "http://127.0.0.1:$HTTP/" >/dev/null
    [ "$(redis-cli -p "$PORT" DBSIZE | tr -d '\r')" -ge "$KEYS" ] && break
done

after=$(redis-cli -p "$PORT" INFO memory | tr -d '\r' | sed -n 's/^used_memory:\([0-9]*\)/\1/p')
keys=$(redis-cli -p "$PORT" DBSIZE | tr -d '\r')
redis-cli -p "$PORT" EVAL "
local total, n, cursor = 0, 0, '0'
repeat
  local r = redis.call('SCAN', cursor, 'COUNT', 1000)
  cursor = r[1]
  for _, k in ipairs(r[2]) do
    total = total + redis.call('MEMORY', 'USAGE', k, 'SAMPLES', 0)
    n = n + 1
  end
until cursor == '0'
return { n, total, tostring(total / n) }" 0 | tr '\n' ' ' | awk -v keys="$keys" -v grown=$((after - before)) '{
    printf "%d keys; MEMORY USAGE %.1f bytes per key; used_memory grew %.1f bytes per key\n",
        $1, $3, grown / keys }'
redis-cli -p "$PORT" --scan | head -1 | xargs -I{} sh -c 'printf "a key: %s (%d bytes), value %s bytes, encoding %s\n" "{}" "$(printf %s "{}" | wc -c)" "$(redis-cli -p '"$PORT"' STRLEN "{}")" "$(redis-cli -p '"$PORT"' OBJECT ENCODING "{}")"'
