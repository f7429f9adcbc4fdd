#!/usr/bin/env bash
# Instructions Redis runs per decision for what the layer sends, counted by
# callgrind inside EVALSHA, EVAL and FCALL of a redis-server of its own,
# beside one INCR + EXPIRE script call on the same server in the same run.
#
#   benches/redis_calls.sh            # one client, one request at a time
#   WINDOW=1ms benches/redis_calls.sh # [redis] batch_window = "1ms", wrk -c 64
#
# The quickstart binary (release) serves `/` behind one token bucket far
# above the traffic, keyed by `x-api-key` over 100 warm keys, with
# `[redis] deadline = "500ms"` (valgrind runs Redis ~50 times slower).
# Checks decided = the SETs the scripts ran (each admitted check writes its
# key once); calls = EVALSHA + EVAL. Needs valgrind, wrk and redis-benchmark.
# COUNT=all counts the whole process; NATIVE=1 prints CPU µs, not Ir;
# KEEP=dir keeps each callgrind dump there.
# REDIS_SERVER=valkey-server counts Valkey instead. Writes nothing but a
# temporary directory, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${PORT:-7411}
HTTP=${HTTP:-7412}
SECONDS_RUN=${SECONDS_RUN:-20}
SERVER=${REDIS_SERVER:-redis-server}
WINDOW=${WINDOW:-}
. benches/redis_common.sh

# COUNT=all: every instruction of the process (its event loop, reading
# and writing the sockets), not only the scripts'; NATIVE=1: no valgrind,
# Redis's own CPU time (INFO cpu, user + system) per check instead.
case "${NATIVE:-}${COUNT:-}" in
    1*) run=() ;;
    all) run=(valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out") ;;
    *) run=(valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out"
        --toggle-collect=evalShaCommand --toggle-collect=evalCommand
        --toggle-collect=fcallCommand) ;;
esac
"${run[@]}" "$SERVER" --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
    >"$dir/redis.log" 2>&1 &
vg=$!
pids+=("$vg")
wait_ping "$PORT"

cat >"$dir/limits.toml" <<EOF
[redis]
url = "redis://127.0.0.1:$PORT"
deadline = "500ms"
${WINDOW:+batch_window = \"$WINDOW\"}

[limits.far-above]
key = "header:x-api-key"
capacity = 1000000000
refill = "1000000/s"

[[routes]]
path = "/"
methods = ["GET"]
limits = ["far-above"]
EOF
FLEETLIMIT_ADDR=127.0.0.1:$HTTP "$bin" "$dir/limits.toml" >"$dir/app.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$HTTP/" -H 'x-api-key: k0' && break
    sleep 0.2
done

cat >"$dir/keys.lua" <<'EOF'
local n = 0
request = function()
  n = n % 100 + 1
  return wrk.format("GET", "/", { ["x-api-key"] = "k" .. n })
end
EOF

cpu_us() { # Redis's CPU time so far, µs
    redis-cli -p "$PORT" INFO cpu | tr -d '\r' | awk -F: '
        $1 == "used_cpu_user" || $1 == "used_cpu_sys" { t += $2 } END { printf "%.0f", t * 1e6 }'
}
count() { # $1: a label, $2: the command whose calls are the checks
    local ir
    if [ -n "${NATIVE:-}" ]; then
        ir=$(($(cpu_us) - cpu0)) # "Ir" is then µs of CPU
    else
        callgrind_control -d "$vg" >/dev/null 2>&1
        local f
        f=$(ls -t "$dir"/cg.out.* | head -1)
        ir=$(sed -n 's/^summary: \([0-9]*\).*/\1/p' "$f")
        # KEEP=dir: the dump stays there, for callgrind_annotate.
        [ -n "${KEEP:-}" ] && cp "$f" "$KEEP/cg.$2.$(date +%s)"
        rm -f "$dir"/cg.out.*
    fi
    redis-cli -p "$PORT" INFO commandstats | tr -d '\r' | awk -F'[:=,]' \
        -v l="$1" -v ir="$ir" -v check="cmdstat_$2" '
        $1 == "cmdstat_evalsha" || $1 == "cmdstat_eval" || $1 == "cmdstat_fcall" { calls += $3 }
        $1 == check { checks = $3 }
        END { printf "%-30s Ir %d, calls %d, checks %d: Ir per check %.1f, checks per call %.2f\n",
            l, ir, calls, checks, ir / checks, checks / calls }'
}
reset() {
    redis-cli -p "$PORT" CONFIG RESETSTAT >/dev/null
    if [ -n "${NATIVE:-}" ]; then
        cpu0=$(cpu_us)
    else
        callgrind_control -z "$vg" >/dev/null 2>&1
    fi
}

# Warm: every key written once, the scripts loaded.
wrk -t1 -c1 -d2s -s "$dir/keys.lua" "http://127.0.0.1:$HTTP/" >/dev/null
reset
if [ -n "$WINDOW" ]; then
    wrk -t2 -c64 -d"${SECONDS_RUN}s" -s "$dir/keys.lua" "http://127.0.0.1:$HTTP/" >"$dir/wrk.txt"
    label="layer, batch_window $WINDOW"
else
    wrk -t1 -c1 -d"${SECONDS_RUN}s" -s "$dir/keys.lua" "http://127.0.0.1:$HTTP/" >"$dir/wrk.txt"
    label="layer, one at a time"
fi
count "$label" set

# The baseline: one INCR + EXPIRE script call per decision, 100 keys.
incr="local n = redis.call('INCR', KEYS[1]) redis.call('EXPIRE', KEYS[1], 60) return n"
sha=$(redis-cli -p "$PORT" SCRIPT LOAD "$incr")
redis-benchmark -p "$PORT" -c 1 -n 200 -r 100 EVALSHA "$sha" 1 'incr:{key-__rand_int__}' >/dev/null
reset
redis-benchmark -p "$PORT" -c 1 -n 4000 -r 100 EVALSHA "$sha" 1 'incr:{key-__rand_int__}' >/dev/null
count "INCR + EXPIRE (baseline)" incr
