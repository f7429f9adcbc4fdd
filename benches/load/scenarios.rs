//! The scenarios, and running one: every contender in turn, twice.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::contenders::{
    BARE, Contender, FLEET_MEMORY, FLEET_REDIS, FLEET_REDIS_IN_FLIGHT, FLEET_REDIS_LEASE,
    FROZEN_LOCAL, FROZEN_OPEN, GOVERNOR, LEASE_BATCH, Numbers, PEER, Server,
};
use crate::cpu::{CpuTimes, CpuUse, ServerThreads};
use crate::figures::{opt, thousands};
use crate::generator::{CLOSED, Load, Stats, Traffic, spawn_generator};
use crate::knobs::{
    ABUSE_PERCENT, ABUSERS, CONNECTIONS, NORMAL_KEYS, OPEN_LOOP_INTERVAL, ROUNDS, WARMUP,
};
use crate::redis::RedisServer;

/// Normal traffic: every key stays far within this.
pub const WITHIN: Numbers = Numbers {
    capacity: 1000,
    refill_per_sec: 1000,
};
/// One hot key: far more than the generator can send.
pub const HOT: Numbers = Numbers {
    capacity: 60_000,
    refill_per_sec: 1_000_000,
};
/// Abuse: the abusers send hundreds per second against this.
pub const TIGHT: Numbers = Numbers {
    capacity: 10,
    refill_per_sec: 1,
};

pub struct Scenario {
    pub title: &'static str,
    pub about: String,
    pub numbers: Numbers,
    pub traffic: Traffic,
    pub contenders: Vec<Contender>,
    /// Redis is SIGSTOPped for each run (after the server connected).
    pub frozen: bool,
    /// Count the Redis script calls of the Redis contenders.
    pub count_scripts: bool,
    /// What the first ratio column divides by.
    pub baseline: Contender,
    /// Connections, closed loop (the open-loop runs set their own).
    pub load: Load,
}

pub fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            title: "(a) normal: 10,000 keys, all within their limits",
            about: format!(
                "Every request picks one of {} API keys uniformly at random; \
                 each key's limit is a burst of {} refilled at {}/s, so nothing is \
                 refused: this is the cost of admitting. `script calls/s` as in (b): \
                 fewer than one per request where fleetlimit coalesces the checks in \
                 flight together into one call.",
                thousands(NORMAL_KEYS as f64),
                WITHIN.capacity,
                WITHIN.refill_per_sec
            ),
            numbers: WITHIN,
            traffic: Traffic::Normal,
            contenders: vec![BARE, FLEET_MEMORY, FLEET_REDIS, PEER, GOVERNOR],
            frozen: false,
            count_scripts: true,
            baseline: BARE,
            load: CLOSED,
        },
        Scenario {
            title: "(b) abuse: 90 % of requests from 50 keys far over their limits",
            about: format!(
                "{ABUSE_PERCENT} % of requests come from {ABUSERS} keys, the rest from \
                 {} ordinary keys; every key's limit is a burst of {} refilled \
                 at {}/s, so nearly every abuser request is refused and the ordinary ones \
                 are not. `script calls/s` is `cmdstat_evalsha` + `cmdstat_eval` calls \
                 from `INFO commandstats` over the recorded seconds (after `CONFIG \
                 RESETSTAT` at the end of the warm-up).",
                thousands(NORMAL_KEYS as f64),
                TIGHT.capacity,
                TIGHT.refill_per_sec
            ),
            numbers: TIGHT,
            traffic: Traffic::Abuse,
            contenders: vec![BARE, FLEET_MEMORY, FLEET_REDIS, PEER, GOVERNOR],
            frozen: false,
            count_scripts: true,
            baseline: BARE,
            load: CLOSED,
        },
        Scenario {
            title: "(c) Redis frozen (SIGSTOP): fleetlimit's degraded modes",
            about: "The normal scenario's traffic and limits, with `redis-server` stopped by \
                 SIGSTOP once the server has connected (connections stay open, nothing \
                 answers) and continued after the run. fleetlimit on Redis with \
                 `deadline = \"5ms\"` and `on_redis_error = \"local\"` (in-process \
                 buckets of limit ÷ fleet size, here 1) or `\"open\"` (served unlimited); \
                 its circuit breaker opens after a few failed checks. fleetlimit (memory) \
                 is the same limit on in-process buckets only, in the same conditions. \
                 Ratios are to fleetlimit (memory)."
                .to_owned(),
            numbers: WITHIN,
            traffic: Traffic::Normal,
            contenders: vec![FROZEN_LOCAL, FROZEN_OPEN, FLEET_MEMORY],
            frozen: true,
            count_scripts: false,
            baseline: FLEET_MEMORY,
            load: CLOSED,
        },
        Scenario {
            title: "(d) one hot key: leases",
            about: format!(
                "Every request carries the same API key, whose limit (a burst of {} \
                 refilled at {}/s) admits all of them. fleetlimit on Redis as in (a), \
                 then with `lease_batch = {LEASE_BATCH}` (the key is far above the \
                 default `lease_above` of 50/s): one script call takes {LEASE_BATCH} \
                 tokens, spent locally. `script calls/s` as in (b).",
                HOT.capacity, HOT.refill_per_sec
            ),
            numbers: HOT,
            traffic: Traffic::Hot,
            contenders: vec![FLEET_REDIS, FLEET_REDIS_LEASE],
            frozen: false,
            count_scripts: true,
            baseline: FLEET_REDIS,
            load: CLOSED,
        },
        Scenario {
            title: "(e) a concurrency limit beside a token bucket",
            about: format!(
                "The normal scenario's traffic ({} keys). fleetlimit on Redis as in (a), \
                 then with the route's limit a concurrency limit instead (`algorithm = \
                 \"concurrency\"`, `max_in_flight = {}`: nothing refused): each request \
                 takes a slot in the general script (no lean script, no coalescing) and \
                 gives it back with a `ZREM` when its response ends. `script calls/s` as \
                 in (b) (the `ZREM`s are not script calls).",
                thousands(NORMAL_KEYS as f64),
                WITHIN.capacity
            ),
            numbers: WITHIN,
            traffic: Traffic::Normal,
            contenders: vec![FLEET_REDIS, FLEET_REDIS_IN_FLIGHT],
            frozen: false,
            count_scripts: true,
            baseline: FLEET_REDIS,
            load: CLOSED,
        },
        Scenario {
            title: "(f) one connection: the latency fleetlimit adds at rest",
            about: "The normal scenario's traffic and limits on ONE keep-alive connection \
                 (closed loop, like `wrk -c1`): each request waits for the one before, so \
                 p50 is a request's latency through an idle server, and fleetlimit's \
                 p50 − bare axum's is what deciding on Redis adds to it: one round trip to \
                 Redis and the layer's own work. It is set beside one Redis round trip of \
                 the same script measured by `redis-benchmark -c 1` right after."
                .to_owned(),
            numbers: WITHIN,
            traffic: Traffic::Normal,
            contenders: vec![BARE, FLEET_REDIS, PEER],
            frozen: false,
            count_scripts: true,
            baseline: BARE,
            load: Load::closed(1),
        },
    ]
}

/// The open-loop runs: scenario (a)'s traffic and limits at fixed rates.
pub fn open_loop() -> Scenario {
    Scenario {
        title: "(g) fixed rate (open loop): latency at 50 % and 80 % of the peaks",
        about: format!(
            "Scenario (a)'s traffic and limits, sent at a fixed total rate spread evenly \
             over enough keep-alive connections that each sends at most once per {} ms \
             ({CONNECTIONS} at least). A request's latency counts from when it was \
             scheduled if its connection was still busy with the previous one then \
             (nothing is hidden by sending less: no coordinated omission), else from when \
             it was written (the generator's timer wakes up to 1 ms late, which is not the \
             server's doing). fleetlimit (Redis) and tower-rate-limit-fred run at the same \
             offered rates, 50 % and 80 % of tower-rate-limit-fred's closed-loop peak in \
             (a) of this run, then fleetlimit at 50 % and 80 % of its own peak in (a). \
             One round each.",
            OPEN_LOOP_INTERVAL.as_millis()
        ),
        numbers: WITHIN,
        traffic: Traffic::Normal,
        contenders: vec![FLEET_REDIS, PEER],
        frozen: false,
        count_scripts: true,
        baseline: PEER,
        load: CLOSED,
    }
}

// Running the scenarios.

/// What one contender gave in one run.
#[derive(Clone, Debug)]
pub struct Measured {
    pub contender: Contender,
    pub stats: Stats,
    pub cpu: CpuUse,
    pub script_calls_per_sec: Option<f64>,
    /// Redis's time inside those calls (`usec` of `INFO commandstats`), µs
    /// per second.
    pub script_usec_per_sec: Option<f64>,
    /// fleetlimit on Redis: the breaker's counters after the run.
    pub note: String,
}

pub fn run_scenario(sc: &Scenario, redis: &RedisServer, secs: Duration, id: u64) -> Vec<Measured> {
    println!("\n{}", sc.title);
    let mut best: Vec<Option<Measured>> = vec![None; sc.contenders.len()];
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..sc.contenders.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let c = sc.contenders[i];
            let seed = (id << 32) ^ ((round as u64) << 16) ^ i as u64;
            let m = run_one(c, sc, sc.load, redis, secs, seed);
            println!(
                "  round {} {:<34} {:>7} answered {:>7.0} req/s  p50 {:>5} µs  p99 {:>6} µs  \
                 429 {:>5.1} %  errors/other {}  CPU µs/req server {} Redis {}  busy {}{}{}",
                round + 1,
                c.name(),
                m.stats.requests,
                m.stats.rps,
                m.stats.p50_us,
                m.stats.p99_us,
                m.stats.share_429 * 100.0,
                m.stats.errors + m.stats.other,
                opt(m.cpu.server_us_per_req, 1),
                opt(m.cpu.redis_us_per_req, 1),
                m.cpu.busy(),
                m.script_calls_per_sec
                    .map(|n| format!("  script calls {n:.0}/s"))
                    .unwrap_or_default(),
                if m.note.is_empty() {
                    String::new()
                } else {
                    format!("  [{}]", m.note)
                },
            );
            if best[i].as_ref().is_none_or(|b| m.stats.rps > b.stats.rps) {
                best[i] = Some(m);
            }
        }
    }
    best.into_iter()
        .map(|m| m.expect("every contender ran"))
        .collect()
}

pub fn run_one(
    c: Contender,
    sc: &Scenario,
    load: Load,
    redis: &RedisServer,
    secs: Duration,
    seed: u64,
) -> Measured {
    // Every run starts from empty buckets (the script cache stays).
    redis.flushall();
    let server = Server::start(c, sc.numbers, redis.url());
    let frozen = sc.frozen.then(|| redis.freeze());
    let count_scripts = sc.count_scripts && c.uses_redis();
    let run = measure(
        vec![server.addr],
        &ServerThreads::InProcess,
        sc.traffic,
        load,
        redis,
        secs,
        seed,
        count_scripts,
    );
    drop(frozen);
    let note = server.stop();
    let Run {
        stats,
        cpu,
        script_calls_per_sec,
        script_usec_per_sec,
    } = run;
    Measured {
        contender: c,
        stats,
        cpu,
        script_calls_per_sec,
        script_usec_per_sec,
        note,
    }
}

/// What one load on running servers gave.
pub struct Run {
    pub stats: Stats,
    pub cpu: CpuUse,
    pub script_calls_per_sec: Option<f64>,
    pub script_usec_per_sec: Option<f64>,
}

/// Loads servers already running at `addrs` for a warm-up and `secs`
/// recorded seconds, and measures the answers and the CPU they took.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    addrs: Vec<SocketAddr>,
    server: &ServerThreads,
    traffic: Traffic,
    load: Load,
    redis: &RedisServer,
    secs: Duration,
    seed: u64,
    count_scripts: bool,
) -> Run {
    let warm = Instant::now() + WARMUP;
    let end = warm + secs;
    let generator = spawn_generator(addrs, traffic, load, warm, end, seed);
    sleep_until(warm);
    if count_scripts {
        redis.reset_stats();
    }
    let cpu_before = CpuTimes::take(server, redis.pid());
    sleep_until(end);
    let cpu_after = CpuTimes::take(server, redis.pid());
    let per_sec = |n: u64| n as f64 / secs.as_secs_f64();
    let (script_calls_per_sec, script_usec_per_sec) = if count_scripts {
        let (calls, usec) = redis.script_stats();
        (Some(per_sec(calls)), Some(per_sec(usec)))
    } else {
        (None, None)
    };
    let tally = generator.join().expect("the load generator panicked");
    let generator_cpu = tally.cpu_ns;
    let stats = tally.stats(secs);
    let cpu = cpu_after.since(&cpu_before, secs, stats.requests, generator_cpu);
    Run {
        stats,
        cpu,
        script_calls_per_sec,
        script_usec_per_sec,
    }
}

pub fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}
