# Sourced by benches/redis_calls.sh and benches/redis_memory.sh: a
# temporary directory and the processes to stop on exit, the quickstart
# binary ($BIN: another build of it, e.g. an older commit's), and a wait
# for a server's PING.
dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT

bin=${BIN:-}
if [ -z "$bin" ]; then
    cargo build -q --release --features redis --example quickstart
    bin=${CARGO_TARGET_DIR:-target}/release/examples/quickstart
fi

wait_ping() { # $1: port
    for _ in $(seq 1 100); do
        redis-cli -p "$1" PING >/dev/null 2>&1 && return 0
        sleep 0.2
    done
}
