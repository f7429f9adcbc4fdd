//! The load harness: every contender measured over HTTP, side by side, in
//! one run, and the figures written to `docs/benchmarks.md`.
//!
//! ```sh
//! cargo bench --bench load              # LOAD_SECS=10 for longer runs
//! ```
//!
//! What one run does:
//!
//! 1. starts its own `redis-server` (from `PATH`, on a free loopback port,
//!    no persistence, in a temporary directory), killed when the harness
//!    ends, panics included ([`RedisServer`]'s `Drop`);
//! 2. for each contender, starts an axum server in-process on
//!    `127.0.0.1:0` on a dedicated tokio runtime with ONE worker thread
//!    (route `/`, handler `"ok"`, served with
//!    `into_make_service_with_connect_info::<SocketAddr>()`), and drives it
//!    with the load generator below: 64 keep-alive HTTP/1.1 connections on
//!    one current-thread runtime, each sending `GET /` with an `x-api-key`
//!    header back to back, for `LOAD_SECS` seconds (default 5) after a 1 s
//!    warm-up that is not recorded;
//! 3. runs three scenarios — normal traffic, abuse, Redis frozen — with the
//!    contenders alternating (A B C D E, then E D C B A) so that noise on
//!    the shared machine hits them all alike, and keeps each contender's
//!    better round (the one with more requests per second);
//! 4. measures what each rate-limit script costs Redis itself with
//!    `redis-benchmark` (skipped, with a note, if it is not installed);
//! 5. prints the tables and rewrites the section of `docs/benchmarks.md`
//!    between `<!-- load:begin -->` and `<!-- load:end -->`.
//!
//! Under `cargo test --benches` (no `--bench` argument) it only says how
//! to run it: a load run is minutes of both cores, not a test.
//!
//! `LOAD_ONLY=<part of a contender's name>` (several: `a|b`) (e.g. `LOAD_ONLY="fleetlimit
//! (Redis)"`) runs only the matching contenders, skips the script costs
//! and leaves the docs alone: for profiling one contender (`perf record
//! -p <pid>`; the server's threads are named `load-server*`, the
//! generator's `load-generator`).
//!
//! ## Why a load generator in Rust rather than `wrk`
//!
//! `wrk` is not installed here. A Debian package exists, but one binary
//! started by one command (`cargo bench --bench load`) that starts Redis,
//! the servers and the load, and alternates the contenders itself, is
//! simpler to run and to keep honest than a script gluing `wrk` runs
//! together. The trade-off: this generator is hyper's HTTP/1 client on one
//! tokio thread, not wrk's hand-tuned C event loop, so it spends more CPU
//! per request and, on this 2-core machine, takes more of the cores away
//! from the server and Redis than `wrk -t1` would. Absolute requests per
//! second are therefore lower than wrk would report; every contender pays
//! the same client cost, so the ratios between them are what to read.
//! Latencies are measured like wrk's: from just before the request is
//! written to the end of the response body, client-side queueing included.

use std::fmt::Write as _;
use std::future::IntoFuture;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener as StdTcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::routing::get;
use axum::serve::ListenerExt;
use axum::Router;
use bytes::Bytes;
use fleetlimit::store::RedisStore;
use fleetlimit::{Config, RateLimitLayer};
use fred::interfaces::ClientLike;
use fred::types::config::Config as FredConfig;
use fred::types::Builder as FredBuilder;
use http::header::{HeaderName, HOST};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;
use tower_governor::{GovernorError, GovernorLayer};

// ---------------------------------------------------------------------------
// The knobs.

/// Keep-alive connections of the load generator.
const CONNECTIONS: usize = 64;
/// Not recorded: connections, buckets, script caches and the breaker settle.
const WARMUP: Duration = Duration::from_secs(1);
/// Recorded, per run, unless `LOAD_SECS` says otherwise.
const DEFAULT_SECS: f64 = 5.0;
/// Rounds per scenario, alternating the order of the contenders.
const ROUNDS: usize = 2;
/// One request that takes longer than this counts as an error and its
/// connection is replaced (nothing here should come close).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Distinct API keys of ordinary callers.
const NORMAL_KEYS: usize = 10_000;
/// Distinct API keys of the abusers.
const ABUSERS: usize = 50;
/// Percentage of requests sent by the abusers in the abuse scenario.
const ABUSE_PERCENT: u64 = 90;

/// `[redis] pool_size` of fleetlimit and the size of the peer's fred pool.
const POOL_SIZE: usize = 4;
/// fleetlimit's `[redis] deadline` and the peer's `default_command_timeout`
/// in the normal and abuse scenarios.
const DEADLINE_MS: u64 = 50;

static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/benchmarks.md");
const BEGIN: &str = "<!-- load:begin -->";
const END: &str = "<!-- load:end -->";

// ---------------------------------------------------------------------------
// Contenders and scenarios.

/// One limit's numbers: a token bucket of `capacity` refilled at
/// `refill_per_sec`; for GCRA (the peer, governor) a burst of `capacity`
/// and one request per `1 / refill_per_sec` seconds: the same limit.
#[derive(Clone, Copy, Debug)]
struct Numbers {
    capacity: u16,
    refill_per_sec: u32,
}

impl Numbers {
    fn emission_interval(self) -> Duration {
        Duration::from_secs_f64(1.0 / f64::from(self.refill_per_sec))
    }
}

/// Normal traffic: every key stays far within this.
const WITHIN: Numbers = Numbers {
    capacity: 1000,
    refill_per_sec: 1000,
};
/// One hot key: far more than the generator can send.
const HOT: Numbers = Numbers {
    capacity: 60_000,
    refill_per_sec: 1_000_000,
};
/// Abuse: the abusers send hundreds per second against this.
const TIGHT: Numbers = Numbers {
    capacity: 10,
    refill_per_sec: 1,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Traffic {
    /// Uniform over the normal keys.
    Normal,
    /// `ABUSE_PERCENT` % from the abusers, the rest over the normal keys.
    Abuse,
    /// Every request on one hot key.
    Hot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    Bare,
    FleetMemory,
    FleetRedis {
        label: &'static str,
        on_redis_error: &'static str,
        deadline: &'static str,
        /// Hot-key leases (`lease_batch = LEASE_BATCH`).
        lease: bool,
    },
    Peer,
    Governor,
}

const BARE: Contender = Contender::Bare;
const FLEET_MEMORY: Contender = Contender::FleetMemory;
const FLEET_REDIS: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis)",
    on_redis_error: "open",
    deadline: "50ms",
    lease: false,
};
const FLEET_REDIS_LEASE: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis, leases)",
    on_redis_error: "open",
    deadline: "50ms",
    lease: true,
};
/// Tokens per lease in the hot-key scenario.
const LEASE_BATCH: u32 = 50;
const PEER: Contender = Contender::Peer;
const GOVERNOR: Contender = Contender::Governor;
const FROZEN_LOCAL: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis frozen, local)",
    on_redis_error: "local",
    deadline: "5ms",
    lease: false,
};
const FROZEN_OPEN: Contender = Contender::FleetRedis {
    label: "fleetlimit (Redis frozen, open)",
    on_redis_error: "open",
    deadline: "5ms",
    lease: false,
};

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Bare => "bare axum",
            Contender::FleetMemory => "fleetlimit (memory)",
            Contender::FleetRedis { label, .. } => label,
            Contender::Peer => "tower-rate-limit-fred",
            Contender::Governor => "tower_governor",
        }
    }

    fn uses_redis(self) -> bool {
        matches!(self, Contender::FleetRedis { .. } | Contender::Peer)
    }
}

struct Scenario {
    title: &'static str,
    about: String,
    numbers: Numbers,
    traffic: Traffic,
    contenders: Vec<Contender>,
    /// Redis is SIGSTOPped for each run (after the server connected).
    frozen: bool,
    /// Count the Redis script calls of the Redis contenders.
    count_scripts: bool,
    /// What the first ratio column divides by.
    baseline: Contender,
}

fn scenarios() -> Vec<Scenario> {
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
        },
    ]
}

// ---------------------------------------------------------------------------
// main

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("benches/load.rs: a load run, not a test; run it with `cargo bench --bench load`");
        return;
    }
    let secs = load_secs();
    let started = Instant::now();
    let load_before = loadavg();
    // Taken now, as close as can be to when the bench was built.
    let revision = git_revision();
    let sources = source_fingerprint();
    let redis = RedisServer::start();
    println!(
        "load harness: redis-server on {} (pid {}), {CONNECTIONS} connections, warm-up {} s, \
         {} s recorded per run, {ROUNDS} rounds per scenario",
        redis.url(),
        redis.pid(),
        WARMUP.as_secs(),
        secs.as_secs_f64()
    );

    // LOAD_ONLY=<part of a contender's name>: only those contenders, no
    // script costs, docs untouched (for profiling one contender).
    let only = std::env::var("LOAD_ONLY").ok().filter(|s| !s.is_empty());
    let mut sections = String::new();
    for (i, mut sc) in scenarios().into_iter().enumerate() {
        if let Some(only) = &only {
            // `a|b`: contenders whose name contains a or b.
            sc.contenders
                .retain(|c| only.split('|').any(|o| c.name().contains(o)));
            if sc.contenders.is_empty() {
                continue;
            }
        }
        let sc = &sc;
        let rows = run_scenario(sc, &redis, secs, i as u64);
        let table = scenario_table(sc, &rows);
        println!("\n### {}\n\n{table}", sc.title);
        let _ = write!(sections, "### {}\n\n{}\n\n{table}\n", sc.title, sc.about);
    }

    if let Some(only) = &only {
        println!("\nload harness: LOAD_ONLY={only:?}: a partial run; {DOCS} left as it was");
        return;
    }
    let scripts = match script_costs(&redis) {
        Some(rows) => {
            let table = script_table(&rows);
            println!("\n### Redis CPU per script call\n\n{table}");
            Some(table)
        }
        None => None,
    };
    drop(redis);

    let elapsed = started.elapsed();
    let load_after = loadavg();
    println!(
        "\nload harness: done in {:.0} s; writing {DOCS}",
        elapsed.as_secs_f64()
    );
    let mut revision = revision;
    if source_fingerprint() != sources {
        revision.push_str(
            " (src/ or lua/ changed while the harness ran; the figures are of the \
             build made before it started)",
        );
    }
    let run = RunInfo {
        secs,
        elapsed,
        load_before,
        load_after,
        revision,
    };
    write_docs(&docs_section(&run, &sections, scripts.as_deref()));
}

/// `LOAD_SECS`, else 5 s.
fn load_secs() -> Duration {
    let secs = match std::env::var("LOAD_SECS") {
        Ok(s) => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0 && *s <= 600.0)
            .unwrap_or_else(|| {
                panic!("LOAD_SECS must be a number of seconds in (0, 600], not {s:?}")
            }),
        Err(_) => DEFAULT_SECS,
    };
    Duration::from_secs_f64(secs)
}

// ---------------------------------------------------------------------------
// Running the scenarios.

/// What one contender gave in one run.
#[derive(Clone, Debug)]
struct Measured {
    contender: Contender,
    stats: Stats,
    cpu: CpuUse,
    script_calls_per_sec: Option<f64>,
    /// fleetlimit on Redis: the breaker's counters after the run.
    note: String,
}

fn run_scenario(sc: &Scenario, redis: &RedisServer, secs: Duration, id: u64) -> Vec<Measured> {
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
            let m = run_one(c, sc, redis, secs, seed);
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

fn run_one(
    c: Contender,
    sc: &Scenario,
    redis: &RedisServer,
    secs: Duration,
    seed: u64,
) -> Measured {
    // Every run starts from empty buckets (the script cache stays).
    redis.flushall();
    let server = Server::start(c, sc.numbers, redis.url());
    let frozen = sc.frozen.then(|| redis.freeze());
    let warm = Instant::now() + WARMUP;
    let end = warm + secs;
    let generator = spawn_generator(server.addr, sc.traffic, warm, end, seed);
    let count_scripts = sc.count_scripts && c.uses_redis();
    sleep_until(warm);
    if count_scripts {
        redis.reset_stats();
    }
    let cpu_before = CpuTimes::take(redis.pid());
    sleep_until(end);
    let cpu_after = CpuTimes::take(redis.pid());
    let script_calls_per_sec =
        count_scripts.then(|| redis.script_calls() as f64 / secs.as_secs_f64());
    let tally = generator.join().expect("the load generator panicked");
    drop(frozen);
    let note = server.stop();
    let generator_cpu = tally.cpu_ns;
    let stats = tally.stats(secs);
    let cpu = cpu_after.since(&cpu_before, secs, stats.requests, generator_cpu);
    Measured {
        contender: c,
        stats,
        cpu,
        script_calls_per_sec,
        note,
    }
}

/// CPU time (ns) used so far by the server's threads and `redis-server`,
/// from `/proc/…/schedstat` (`None` where that is not readable). The
/// generator's own thread measures itself ([`Tally::cpu_ns`]).
#[derive(Clone, Copy, Debug)]
struct CpuTimes {
    server: Option<u64>,
    redis: Option<u64>,
}

/// CPU use over the recorded seconds: µs per answered request, and the
/// share of one core each part kept busy.
#[derive(Clone, Copy, Debug, Default)]
struct CpuUse {
    server_us_per_req: Option<f64>,
    redis_us_per_req: Option<f64>,
    server_busy: Option<f64>,
    generator_busy: Option<f64>,
    redis_busy: Option<f64>,
}

impl CpuTimes {
    fn take(redis_pid: u32) -> Self {
        Self {
            server: threads_cpu_ns("self", |comm| comm.starts_with("load-server")),
            redis: threads_cpu_ns(&redis_pid.to_string(), |_| true),
        }
    }

    fn since(
        &self,
        before: &Self,
        secs: Duration,
        requests: u64,
        generator: Option<u64>,
    ) -> CpuUse {
        let delta = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_sub(b?) as f64);
        let per_req = |d: Option<f64>| {
            d.filter(|_| requests > 0)
                .map(|d| d / 1e3 / requests as f64)
        };
        let busy = |d: Option<f64>| d.map(|d| d / 1e9 / secs.as_secs_f64());
        let server = delta(self.server, before.server);
        let generator = generator.map(|g| g as f64);
        let redis = delta(self.redis, before.redis);
        CpuUse {
            server_us_per_req: per_req(server),
            redis_us_per_req: per_req(redis),
            server_busy: busy(server),
            generator_busy: busy(generator),
            redis_busy: busy(redis),
        }
    }
}

impl CpuUse {
    /// "server / generator / Redis" busy, in % of one core.
    fn busy(&self) -> String {
        let pct =
            |v: Option<f64>| v.map_or_else(|| "?".to_owned(), |v| format!("{:.0}", v * 100.0));
        format!(
            "{} / {} / {}",
            pct(self.server_busy),
            pct(self.generator_busy),
            pct(self.redis_busy)
        )
    }
}

/// The calling thread's CPU time, ns.
fn thread_self_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A figure with `prec` decimals, or "—".
fn opt(v: Option<f64>, prec: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| "—".to_owned(), |v| format!("{v:.prec$}"))
}

/// The CPU time (ns, first field of `schedstat`) of the threads of process
/// `pid` ("self" for this one) whose name passes `pick`; `None` if none
/// was found or `/proc` cannot be read.
fn threads_cpu_ns(pid: &str, pick: impl Fn(&str) -> bool) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = None;
    for task in tasks.flatten() {
        let dir = task.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if !pick(comm.trim_end()) {
            continue;
        }
        let ns = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        if let Some(ns) = ns {
            total = Some(total.unwrap_or(0) + ns);
        }
    }
    total
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

// ---------------------------------------------------------------------------
// The server side: one contender on a runtime with one worker thread.

/// The contender's server on its own thread; stopped (and joined) when
/// dropped.
struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<String>>,
}

impl Server {
    fn start(c: Contender, numbers: Numbers, redis_url: String) -> Self {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("load-server".into())
            .spawn(move || serve(c, numbers, &redis_url, &ready_tx, stop_rx))
            .expect("a server thread");
        let addr = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("the {} server did not start: {e}", c.name()));
        Self {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// Stops the server; returns what it had to say about the run.
    fn stop(mut self) -> String {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.thread
            .take()
            .map(|t| t.join().expect("the server thread panicked"))
            .unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Probe = Box<dyn FnOnce() -> String + Send>;

/// Builds the contender's app inside a runtime with one worker thread (so
/// its Redis pool's connection tasks run on that worker too), serves it
/// until told to stop, and returns the contender's note.
fn serve(
    c: Contender,
    numbers: Numbers,
    redis_url: &str,
    ready: &mpsc::Sender<SocketAddr>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> String {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("load-server-worker")
        .enable_all()
        .build()
        .expect("a server runtime");
    let note = rt.block_on(async move {
        let (app, probe) = build_app(c, numbers, redis_url).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("a local address");
        // The same for every contender: responses are one write anyway.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let server = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        );
        // Spawned, so that accepting runs on the worker thread too.
        let task = tokio::spawn(server.into_future());
        let _ = ready.send(addr);
        tokio::select! {
            _ = stop => {}
            r = task => panic!("the {} server stopped by itself: {r:?}", c.name()),
        }
        probe.map(|p| p()).unwrap_or_default()
    });
    // Connection tasks still alive (none should be) are dropped here.
    rt.shutdown_timeout(Duration::from_secs(1));
    note
}

fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// fleetlimit's configuration: one token-bucket limit keyed by the
/// `x-api-key` header on route `/`, Redis settings when `redis` is given
/// (the URL is set with `with_redis_url`).
fn fleet_config(numbers: Numbers, redis: Option<(&str, &str)>, lease: bool) -> Config {
    let mut toml = String::new();
    let mut on_redis_error = "open";
    if let Some((deadline, policy)) = redis {
        on_redis_error = policy;
        let _ = write!(
            toml,
            "[redis]\npool_size = {POOL_SIZE}\ndeadline = \"{deadline}\"\n\n"
        );
    }
    let _ = write!(
        toml,
        r#"[limits.per-key]
key = "header:x-api-key"
algorithm = "token-bucket"
capacity = {capacity}
refill = "{refill}/s"
{lease}

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "{on_redis_error}"
"#,
        capacity = numbers.capacity,
        refill = numbers.refill_per_sec,
        lease = if lease {
            format!("lease_batch = {LEASE_BATCH}")
        } else {
            String::new()
        },
    );
    Config::from_toml_str(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

async fn build_app(c: Contender, numbers: Numbers, redis_url: &str) -> (Router, Option<Probe>) {
    match c {
        Contender::Bare => (router(), None),
        Contender::FleetMemory => (
            router().layer(RateLimitLayer::in_memory(&fleet_config(
                numbers, None, false,
            ))),
            None,
        ),
        Contender::FleetRedis {
            on_redis_error,
            deadline,
            lease,
            ..
        } => {
            let cfg = fleet_config(numbers, Some((deadline, on_redis_error)), lease)
                .with_redis_url(redis_url);
            let layer = RateLimitLayer::new(cfg)
                .await
                .expect("fleetlimit's Redis layer");
            let probe_layer = layer.clone();
            let probe: Probe = Box::new(move || match probe_layer.breaker() {
                Some(b) => format!(
                    "breaker opened {}×, {} checks short-circuited, {} failed",
                    b.opened, b.short_circuited, b.failures
                ),
                None => String::new(),
            });
            (router().layer(layer), Some(probe))
        }
        Contender::Peer => {
            let config = FredConfig::from_url(redis_url).expect("a Redis URL");
            let pool = FredBuilder::from_config(config)
                .with_performance_config(|p| {
                    // As the peer's docs advise: fred waits forever otherwise.
                    p.default_command_timeout = Duration::from_millis(DEADLINE_MS);
                })
                .build_pool(POOL_SIZE)
                .expect("a fred pool");
            pool.init().await.expect("the peer's pool connects");
            let layer = tower_rate_limit_fred::RateLimitLayer::builder()
                .conn(pool)
                .key_resolver(PeerKey)
                .capacity(numbers.capacity)
                .emission_interval(numbers.emission_interval())
                .fail_open(true)
                .build();
            (router().layer(layer), None)
        }
        Contender::Governor => {
            let config = GovernorConfigBuilder::default()
                .key_extractor(GovernorKey)
                .period(numbers.emission_interval())
                .burst_size(u32::from(numbers.capacity))
                .finish()
                .expect("a governor configuration");
            (router().layer(GovernorLayer::new(config)), None)
        }
    }
}

/// The peer's key: the `x-api-key` header (401 without it), prefixed like
/// fleetlimit's keys so both write keys of about the same length.
#[derive(Clone, Copy, Debug)]
struct PeerKey;

impl tower_rate_limit_fred::KeyResolver for PeerKey {
    type ErrorBody = Body;

    fn key<T>(
        &self,
        req: &Request<T>,
    ) -> Result<Option<tower_rate_limit_fred::Key>, Response<Body>> {
        match req.headers().get(&X_API_KEY).and_then(|v| v.to_str().ok()) {
            Some(k) => Ok(Some(format!("peer:per-key:{{{k}}}").into())),
            None => {
                let mut res = Response::new(Body::empty());
                *res.status_mut() = StatusCode::UNAUTHORIZED;
                Err(res)
            }
        }
    }
}

/// governor's key: the `x-api-key` header.
#[derive(Clone, Copy, Debug)]
struct GovernorKey;

impl KeyExtractor for GovernorKey {
    type Key = HeaderValue;

    fn extract<T>(&self, req: &Request<T>) -> Result<HeaderValue, GovernorError> {
        req.headers()
            .get(&X_API_KEY)
            .cloned()
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

// ---------------------------------------------------------------------------
// The load generator: like `wrk -t1 -c64`, one current-thread runtime.

#[derive(Clone, Debug, Default)]
struct Tally {
    /// Recorded requests' latencies, µs.
    latencies_us: Vec<u32>,
    ok: u64,
    limited: u64,
    /// Any other status.
    other: u64,
    /// Transport errors and timeouts.
    errors: u64,
    /// CPU time of the generator's thread while recording.
    cpu_ns: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    requests: u64,
    rps: f64,
    p50_us: u32,
    p99_us: u32,
    share_429: f64,
    other: u64,
    errors: u64,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        self.ok += other.ok;
        self.limited += other.limited;
        self.other += other.other;
        self.errors += other.errors;
    }

    fn stats(mut self, secs: Duration) -> Stats {
        self.latencies_us.sort_unstable();
        let n = self.latencies_us.len();
        let pct = |p: f64| -> u32 {
            if n == 0 {
                return 0;
            }
            // Nearest rank.
            let rank = ((p * n as f64).ceil() as usize).clamp(1, n);
            self.latencies_us[rank - 1]
        };
        let answered = self.ok + self.limited + self.other;
        Stats {
            requests: answered,
            rps: answered as f64 / secs.as_secs_f64(),
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            share_429: if answered == 0 {
                0.0
            } else {
                self.limited as f64 / answered as f64
            },
            other: self.other,
            errors: self.errors,
        }
    }
}

struct Keys {
    normal: Vec<HeaderValue>,
    abusers: Vec<HeaderValue>,
    hot: HeaderValue,
}

impl Keys {
    fn new() -> Self {
        let header = |s: String| HeaderValue::from_str(&s).expect("an ASCII key");
        Self {
            normal: (0..NORMAL_KEYS)
                .map(|i| header(format!("key-{i:05}")))
                .collect(),
            abusers: (0..ABUSERS)
                .map(|i| header(format!("abuser-{i:02}")))
                .collect(),
            hot: header("hot-key".to_owned()),
        }
    }

    fn pick(&self, traffic: Traffic, rng: &mut Rng) -> &HeaderValue {
        match traffic {
            Traffic::Normal => &self.normal[rng.below(NORMAL_KEYS)],
            Traffic::Hot => &self.hot,
            Traffic::Abuse => {
                if (rng.below(100) as u64) < ABUSE_PERCENT {
                    &self.abusers[rng.below(ABUSERS)]
                } else {
                    &self.normal[rng.below(NORMAL_KEYS)]
                }
            }
        }
    }
}

/// xorshift64*, seeded through splitmix64: cheap and reproducible.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (((x >> 32) * n as u64) >> 32) as usize
    }
}

/// Starts the load on its own thread: requests from `warm` to `end` are
/// recorded; every connection stops at `end` (each request is bounded by
/// `REQUEST_TIMEOUT`).
fn spawn_generator(
    addr: SocketAddr,
    traffic: Traffic,
    warm: Instant,
    end: Instant,
    seed: u64,
) -> JoinHandle<Tally> {
    std::thread::Builder::new()
        .name("load-generator".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a generator runtime");
            rt.block_on(async move {
                let keys = Arc::new(Keys::new());
                let tasks: Vec<_> = (0..CONNECTIONS)
                    .map(|i| {
                        let keys = Arc::clone(&keys);
                        let seed = seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
                        tokio::spawn(connection(addr, keys, traffic, seed, warm, end))
                    })
                    .collect();
                // This thread's CPU time over the recorded seconds (read
                // here: the thread is gone by the time the harness could).
                tokio::time::sleep_until(warm.into()).await;
                let cpu_before = thread_self_cpu_ns();
                let mut total = Tally::default();
                for t in tasks {
                    total.merge(t.await.expect("a connection task panicked"));
                }
                total.cpu_ns = cpu_before
                    .zip(thread_self_cpu_ns())
                    .map(|(a, b)| b.saturating_sub(a));
                total
            })
        })
        .expect("a generator thread")
}

async fn connect(addr: SocketAddr) -> Option<SendRequest<Empty<Bytes>>> {
    let stream = tokio::time::timeout(REQUEST_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Some(sender)
}

async fn exchange(
    sender: &mut SendRequest<Empty<Bytes>>,
    req: Request<Empty<Bytes>>,
) -> Result<StatusCode, hyper::Error> {
    sender.ready().await?;
    let res = sender.send_request(req).await?;
    let status = res.status();
    res.into_body().collect().await?;
    Ok(status)
}

/// One keep-alive connection sending requests back to back until `end`.
async fn connection(
    addr: SocketAddr,
    keys: Arc<Keys>,
    traffic: Traffic,
    seed: u64,
    warm: Instant,
    end: Instant,
) -> Tally {
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let host = HeaderValue::from_str(&addr.to_string()).expect("an address");
    let mut sender = None;
    while Instant::now() < end {
        let mut s = match sender.take() {
            Some(s) => s,
            None => match connect(addr).await {
                Some(s) => s,
                None => {
                    if Instant::now() >= warm {
                        tally.errors += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let mut req = Request::new(Empty::<Bytes>::new());
        req.headers_mut().insert(HOST, host.clone());
        req.headers_mut()
            .insert(X_API_KEY.clone(), keys.pick(traffic, &mut rng).clone());
        let started = Instant::now();
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, exchange(&mut s, req)).await;
        let done = Instant::now();
        let recorded = started >= warm && done <= end;
        match outcome {
            Ok(Ok(status)) => {
                sender = Some(s);
                if recorded {
                    let us =
                        u32::try_from(done.duration_since(started).as_micros()).unwrap_or(u32::MAX);
                    tally.latencies_us.push(us);
                    match status {
                        StatusCode::OK => tally.ok += 1,
                        StatusCode::TOO_MANY_REQUESTS => tally.limited += 1,
                        _ => tally.other += 1,
                    }
                }
            }
            // The connection is dropped and replaced.
            _ => {
                if started >= warm {
                    tally.errors += 1;
                }
            }
        }
    }
    tally
}

// ---------------------------------------------------------------------------
// Redis: our own server, a minimal RESP client, redis-benchmark.

/// A `redis-server` of our own, killed (and its directory removed) when
/// dropped, also while unwinding from a panic.
struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl RedisServer {
    fn start() -> Self {
        let port = StdTcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let dir = std::env::temp_dir().join(format!(
            "fleetlimit-load-redis-{port}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be on PATH (apt-get install redis-server)");
        let server = Self { port, dir, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Reply::Simple(s)) = server.cmd(&["PING"]) {
                if s == "PONG" {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One command on a fresh connection (never used while frozen).
    fn cmd(&self, args: &[&str]) -> std::io::Result<Reply> {
        let stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            let _ = write!(out, "${}\r\n{a}\r\n", a.len());
        }
        (&stream).write_all(out.as_bytes())?;
        read_reply(&mut BufReader::new(&stream))
    }

    fn must(&self, args: &[&str]) -> Reply {
        match self.cmd(args) {
            Ok(Reply::Error(e)) => panic!("redis {args:?}: {e}"),
            Ok(r) => r,
            Err(e) => panic!("redis {args:?}: {e}"),
        }
    }

    fn flushall(&self) {
        self.must(&["FLUSHALL"]);
    }

    fn reset_stats(&self) {
        self.must(&["CONFIG", "RESETSTAT"]);
    }

    fn commandstats(&self) -> String {
        match self.must(&["INFO", "commandstats"]) {
            Reply::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
            r => panic!("INFO answered {r:?}"),
        }
    }

    /// `cmdstat_evalsha` + `cmdstat_eval` calls since the last reset.
    fn script_calls(&self) -> u64 {
        let stats = self.commandstats();
        ["evalsha", "eval"]
            .iter()
            .filter_map(|c| cmdstat(&stats, c))
            .map(|s| s.calls)
            .sum()
    }

    /// SIGSTOP until the guard is dropped.
    fn freeze(&self) -> Frozen {
        signal(self.pid(), "STOP");
        Frozen(self.pid())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        signal(self.pid(), "CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Redis is SIGSTOPped while this lives.
struct Frozen(u32);

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("load harness: kill -{sig} {pid} failed");
    }
}

/// A RESP reply, parsed in full (not every kind is looked at).
#[derive(Debug)]
#[allow(dead_code)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
}

fn read_reply(r: &mut impl BufRead) -> std::io::Result<Reply> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut line = String::new();
    r.read_line(&mut line)?;
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at_checked(1).ok_or_else(|| bad("empty reply"))?;
    let len = || rest.parse::<i64>().map_err(|_| bad("bad length"));
    Ok(match kind {
        "+" => Reply::Simple(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(len()?),
        "$" => match len()? {
            n if n < 0 => Reply::Nil,
            n => {
                let mut buf = vec![0; n as usize + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(n as usize);
                Reply::Bulk(buf)
            }
        },
        "*" => match len()? {
            n if n < 0 => Reply::Nil,
            n => Reply::Array((0..n).map(|_| read_reply(r)).collect::<Result<_, _>>()?),
        },
        _ => return Err(bad("unknown reply type")),
    })
}

#[derive(Clone, Copy, Debug)]
struct CmdStat {
    calls: u64,
    usec: u64,
    failed: u64,
}

/// `cmdstat_<name>:calls=..,usec=..,...` from `INFO commandstats`.
fn cmdstat(info: &str, name: &str) -> Option<CmdStat> {
    let prefix = format!("cmdstat_{name}:");
    let fields = info.lines().find_map(|l| l.strip_prefix(&prefix))?;
    let field = |f: &str| -> u64 {
        fields
            .split(',')
            .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some(CmdStat {
        calls: field("calls"),
        usec: field("usec"),
        failed: field("failed_calls") + field("rejected_calls"),
    })
}

// ---------------------------------------------------------------------------
// What each script costs Redis.

/// A script measured with `redis-benchmark`: `EVALSHA <sha> 1 <key> <args..>`,
/// `__rand_int__` in the key spreading the calls over 10,000 keys.
#[derive(Clone, Copy)]
struct ScriptCase {
    name: &'static str,
    text: Text,
    key: &'static str,
    args: &'static [&'static str],
    /// The SHA the library sends, when the script is the library's.
    library_sha: Option<fn() -> String>,
    /// Decisions per call: the key and its arguments are repeated this many
    /// times (`EVALSHA <sha> <n> <key>×n <args>×n`), for the coalesced script.
    batch: usize,
}

/// Where a script's text comes from.
#[derive(Clone, Copy)]
enum Text {
    /// Compiled in.
    Inline(&'static str),
    /// Files of this crate, concatenated, read at run time: a script that
    /// is not there (yet, or any more) is skipped with a note instead of
    /// breaking the build.
    File(&'static [&'static str]),
}

impl Text {
    fn load(self) -> Result<String, String> {
        match self {
            Text::Inline(t) => Ok(t.to_owned()),
            Text::File(paths) => paths
                .iter()
                .map(|path| {
                    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
                    std::fs::read_to_string(&full).map_err(|e| format!("{path}: {e}"))
                })
                .collect(),
        }
    }
}

/// The design documents' reference token bucket (a hash, `HMGET`/`HSET`/
/// `EXPIRE`): what the other scripts are compared with.
const REFERENCE_BUCKET: &str = r"local capacity = tonumber(ARGV[1])
local rate     = tonumber(ARGV[2])
local cost     = tonumber(ARGV[3])
local t   = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or capacity
local ts     = tonumber(b[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local allowed = 0
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', KEYS[1], math.ceil(capacity / rate) + 1)
return { allowed, tostring(tokens), tostring(wait) }
";

/// A fixed-window counter as a script: the cheapest useful script.
const INCR_EXPIRE: &str =
    "local n = redis.call('INCR', KEYS[1]) redis.call('EXPIRE', KEYS[1], 60) return n";

/// The peer's GCRA, as published in tower-rate-limit-fred 2.1.1
/// (`scripts/rate_limit.lua`, MIT-licensed script, modified there from
/// rwz/redis-gcra), re-typed here. ARGV: capacity, emission interval in ms.
const PEER_GCRA: &str = r#"redis.replicate_commands()

local key = KEYS[1]
local capacity = ARGV[1]
local emission_interval = ARGV[2] * 1000 -- ms to us
local window = capacity * emission_interval

local now = redis.call("TIME")
local sep_1_2025 = 1756684800 -- relative epoch to reduce int size; works for ~31.7 years
now = (now[1] - sep_1_2025) * 1000 * 1000 + now[2]
local tat = tonumber(redis.call("GET", key)) or now
local new_tat = math.max(tat, now) + emission_interval
local diff = now + window - new_tat

if diff < 0 then
  return {0, math.ceil(-diff / 1000 / 1000)}
end

redis.call("SET", key, new_tat, "PX", math.ceil((new_tat - now) / 1000))
return {1, 0}
"#;

/// fleetlimit's decision script, composed as `src/algorithm/mod.rs` does.
const FLEETLIMIT_DECIDE: &str = concat!(
    include_str!("../lua/token_bucket.lua"),
    include_str!("../lua/token_bucket_general.lua"),
    include_str!("../lua/fixed_window.lua"),
    include_str!("../lua/sliding_window.lua"),
    include_str!("../lua/decide.lua"),
);

/// fleetlimit's lean script, composed as `src/algorithm/token_bucket.rs`
/// does.
const FLEETLIMIT_LEAN: &[&str] = &["lua/token_bucket.lua", "lua/token_bucket_lean.lua"];

/// fleetlimit's scripts, each with the arguments of one token-bucket limit
/// (burst 1000, 1000/s, cost 1). Add a leaner script here and it is
/// measured and reported with the others.
const FLEETLIMIT_SCRIPTS: &[ScriptCase] = &[
    ScriptCase {
        name: "fleetlimit decision script (lua/*.lua concatenated, one token bucket)",
        text: Text::Inline(FLEETLIMIT_DECIDE),
        key: "rl:per-key:{key-__rand_int__}",
        // cost, then per limit: algorithm, capacity, refill/s, shadow
        args: &["1", "t", "1000", "1000", "0"],
        library_sha: Some(RedisStore::script_sha),
        batch: 1,
    },
    ScriptCase {
        name: "fleetlimit lean script, 1 decision per call (lua/token_bucket_lean.lua)",
        text: Text::File(FLEETLIMIT_LEAN),
        key: "rl:per-key:{key-__rand_int__}",
        // per decision: cost × µs per token, capacity × µs per token
        args: &["1000", "1000000"],
        library_sha: Some(RedisStore::lean_script_sha),
        batch: 1,
    },
    ScriptCase {
        name: "fleetlimit lean script, 4 decisions per call (coalesced)",
        text: Text::File(FLEETLIMIT_LEAN),
        key: "rl:per-key:{key-__rand_int__}",
        args: &["1000", "1000000"],
        library_sha: Some(RedisStore::lean_script_sha),
        batch: 4,
    },
    ScriptCase {
        name: "fleetlimit lean script, 16 decisions per call (coalesced)",
        text: Text::File(FLEETLIMIT_LEAN),
        key: "rl:per-key:{key-__rand_int__}",
        args: &["1000", "1000000"],
        library_sha: Some(RedisStore::lean_script_sha),
        batch: 16,
    },
];

fn script_cases() -> Vec<ScriptCase> {
    let mut cases = vec![
        ScriptCase {
            name: "reference token bucket (design documents)",
            text: Text::Inline(REFERENCE_BUCKET),
            key: "ref:{key-__rand_int__}",
            args: &["1000", "1000", "1"],
            library_sha: None,
            batch: 1,
        },
        ScriptCase {
            name: "INCR + EXPIRE",
            text: Text::Inline(INCR_EXPIRE),
            key: "incr:{key-__rand_int__}",
            args: &[],
            library_sha: None,
            batch: 1,
        },
    ];
    cases.extend_from_slice(FLEETLIMIT_SCRIPTS);
    cases.push(ScriptCase {
        name: "tower-rate-limit-fred 2.1.1 GCRA",
        text: Text::Inline(PEER_GCRA),
        key: "peer:{key-__rand_int__}",
        args: &["1000", "1"],
        library_sha: None,
        batch: 1,
    });
    cases
}

struct ScriptRow {
    name: &'static str,
    batch: usize,
    us_per_call: f64,
    bench_rps: Option<f64>,
    note: String,
}

/// µs of Redis CPU per call of each script (`usec` ÷ `calls` of
/// `cmdstat_evalsha`), each measured twice in alternating order, the
/// lower kept. `None` when `redis-benchmark` is missing.
fn script_costs(redis: &RedisServer) -> Option<Vec<ScriptRow>> {
    const REQUESTS: &str = "200000";
    if Command::new("redis-benchmark")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        println!(
            "\nload harness: redis-benchmark not found (Debian package redis-tools); \
             skipping the script costs"
        );
        return None;
    }
    println!("\nRedis CPU per script call (redis-benchmark -P 16 -n {REQUESTS} -r 10000)");
    let cases = script_cases();
    let mut rows: Vec<Option<ScriptRow>> = (0..cases.len()).map(|_| None).collect();
    let mut skipped: Vec<Option<String>> = vec![None; cases.len()];
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..cases.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let case = &cases[i];
            let text = match case.text.load() {
                Ok(t) => t,
                Err(e) => {
                    println!("  round {} {:<58} skipped: {e}", round + 1, case.name);
                    skipped[i] = Some(e);
                    continue;
                }
            };
            redis.flushall();
            let sha = match redis.must(&["SCRIPT", "LOAD", &text]) {
                Reply::Bulk(b) => String::from_utf8(b).expect("a hex SHA"),
                r => panic!("SCRIPT LOAD answered {r:?}"),
            };
            let mut note = String::new();
            if let Some(library) = case.library_sha {
                if library() != sha {
                    note = format!(
                        "the library's script_sha() is {}, not the SHA of lua/*.lua as \
                         concatenated here ({sha}): measured the latter",
                        library()
                    );
                }
            }
            redis.reset_stats();
            let out = Command::new("redis-benchmark")
                .args(["-h", "127.0.0.1", "-p", &redis.port.to_string()])
                .args(["-P", "16", "-n", REQUESTS, "-r", "10000", "--csv"])
                .args(["EVALSHA", &sha, &case.batch.to_string()])
                .args(std::iter::repeat_n(case.key, case.batch))
                .args(std::iter::repeat_n(case.args, case.batch).flatten())
                .stderr(Stdio::null())
                .output()
                .expect("redis-benchmark runs");
            let stats = cmdstat(&redis.commandstats(), "evalsha");
            let bench_rps = String::from_utf8_lossy(&out.stdout)
                .lines()
                .nth(1)
                .and_then(|l| l.split(',').nth(1))
                .and_then(|v| v.trim_matches('"').parse::<f64>().ok());
            let Some(stats) = stats.filter(|s| s.calls > 0) else {
                panic!("{}: no EVALSHA calls counted", case.name);
            };
            if stats.failed > 0 {
                let _ = write!(note, "{} of {} calls failed", stats.failed, stats.calls);
            }
            let us_per_call = stats.usec as f64 / stats.calls as f64;
            println!(
                "  round {} {:<58} {:>6.2} µs/call  ({} calls{})",
                round + 1,
                case.name,
                us_per_call,
                stats.calls,
                if note.is_empty() {
                    String::new()
                } else {
                    format!("; {note}")
                }
            );
            if rows[i].as_ref().is_none_or(|r| us_per_call < r.us_per_call) {
                rows[i] = Some(ScriptRow {
                    name: case.name,
                    batch: case.batch,
                    us_per_call,
                    bench_rps,
                    note,
                });
            }
        }
    }
    Some(
        rows.into_iter()
            .zip(skipped)
            .zip(&cases)
            .map(|((r, skip), case)| {
                r.unwrap_or_else(|| ScriptRow {
                    name: case.name,
                    batch: case.batch,
                    us_per_call: f64::NAN,
                    bench_rps: None,
                    note: format!("not measured: {}", skip.unwrap_or_default()),
                })
            })
            .collect(),
    )
}

// ---------------------------------------------------------------------------
// Tables and docs/benchmarks.md.

fn thousands(n: f64) -> String {
    let s = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn scenario_table(sc: &Scenario, rows: &[Measured]) -> String {
    let rps_of = |c: Contender| {
        rows.iter()
            .find(|r| r.contender == c)
            .map(|r| r.stats.rps)
            .filter(|v| *v > 0.0)
    };
    let baseline = rps_of(sc.baseline);
    let peer = rps_of(PEER);
    let ratio = |x: f64, base: Option<f64>| opt(base.map(|b| x / b), 2);

    let mut head = vec![
        "contender".to_owned(),
        "req/s".to_owned(),
        "p50 µs".to_owned(),
        "p99 µs".to_owned(),
        "429 share".to_owned(),
        format!("req/s ÷ {}", sc.baseline.name()),
    ];
    if peer.is_some() {
        head.push("req/s ÷ tower-rate-limit-fred".to_owned());
    }
    head.push("server CPU µs/req".to_owned());
    head.push("Redis CPU µs/req".to_owned());
    if sc.count_scripts {
        head.push("script calls/s".to_owned());
        head.push("script calls per request".to_owned());
    }
    head.push("busy % of a core: server / generator / Redis".to_owned());
    head.push("errors + other statuses".to_owned());

    let mut t = format!("| {} |\n|---|", head.join(" | "));
    t.push_str(&"--:|".repeat(head.len() - 1));
    t.push('\n');
    let mut notes = String::new();
    for r in rows {
        let s = &r.stats;
        let mut cells = vec![
            r.contender.name().to_owned(),
            thousands(s.rps),
            s.p50_us.to_string(),
            s.p99_us.to_string(),
            format!("{:.1} %", s.share_429 * 100.0),
            ratio(s.rps, baseline),
        ];
        if peer.is_some() {
            cells.push(if r.contender == BARE {
                "—".to_owned()
            } else {
                ratio(s.rps, peer)
            });
        }
        cells.push(opt(r.cpu.server_us_per_req, 1));
        cells.push(if r.contender.uses_redis() {
            opt(r.cpu.redis_us_per_req, 1)
        } else {
            "—".to_owned()
        });
        if sc.count_scripts {
            cells.push(
                r.script_calls_per_sec
                    .map_or_else(|| "—".to_owned(), thousands),
            );
            cells.push(opt(r.script_calls_per_sec.map(|c| c / s.rps.max(1e-9)), 2));
        }
        cells.push(r.cpu.busy());
        cells.push((s.errors + s.other).to_string());
        let _ = writeln!(t, "| {} |", cells.join(" | "));
        if !r.note.is_empty() {
            let _ = writeln!(notes, "- {}: {}.", r.contender.name(), r.note);
        }
    }
    if !notes.is_empty() {
        let _ = write!(t, "\nIn the reported run:\n\n{notes}");
    }
    let generator_bound: Vec<&str> = rows
        .iter()
        .filter(|r| r.cpu.generator_busy.is_some_and(|b| b >= 0.9))
        .map(|r| r.contender.name())
        .collect();
    if !generator_bound.is_empty() {
        let _ = write!(
            t,
            "\nThe load generator kept ≥ 90 % of a core busy for: {}. Their req/s is \
             (close to) the generator's ceiling, not their server's, so their req/s \
             ratios say little; compare their server CPU µs/req instead.\n",
            generator_bound.join(", ")
        );
    }
    t
}

fn script_table(rows: &[ScriptRow]) -> String {
    let reference = rows
        .first()
        .map(|r| r.us_per_call)
        .filter(|v| v.is_finite());
    let num = |v: f64| {
        if v.is_finite() {
            format!("{v:.2}")
        } else {
            "—".to_owned()
        }
    };
    let mut t = String::from(
        "| script | µs of Redis CPU per call | µs per decision | decision ÷ reference token bucket | redis-benchmark calls/s |\n\
         |---|--:|--:|--:|--:|\n",
    );
    let mut notes = String::new();
    for r in rows {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} |",
            r.name,
            num(r.us_per_call),
            num(r.us_per_call / r.batch as f64),
            reference.map_or_else(
                || "—".to_owned(),
                |b| num(r.us_per_call / r.batch as f64 / b)
            ),
            r.bench_rps.map_or_else(|| "—".to_owned(), thousands)
        );
        if !r.note.is_empty() {
            let _ = writeln!(notes, "- {}: {}.", r.name, r.note);
        }
    }
    if !notes.is_empty() {
        let _ = write!(t, "\n{notes}");
    }
    t
}

/// What the docs say about the run itself.
struct RunInfo {
    secs: Duration,
    elapsed: Duration,
    load_before: String,
    load_after: String,
    revision: String,
}

fn docs_section(run: &RunInfo, scenarios: &str, scripts: Option<&str>) -> String {
    let RunInfo {
        secs,
        elapsed,
        load_before,
        load_after,
        revision,
    } = run;
    let mut s = String::new();
    let _ = writeln!(s, "{BEGIN}");
    let _ = writeln!(
        s,
        "## Load (HTTP, side by side)\n\n\
         Written by `benches/load.rs`, which rewrites this section (up to the end \
         marker) on every run of\n\n\
         ```sh\n\
         cargo bench --bench load\n\
         ```\n\n\
         (`LOAD_SECS` sets the recorded seconds per run). It starts its own \
         `redis-server`; each contender is an axum server (route `/`, handler \
         `\"ok\"`, `into_make_service_with_connect_info::<SocketAddr>()`) on a tokio \
         runtime with **one** worker thread, driven by an in-process Rust load \
         generator on one current-thread runtime (like `wrk -t1 -c{CONNECTIONS}`): \
         {CONNECTIONS} keep-alive HTTP/1.1 connections sending `GET /` with an \
         `x-api-key` header back to back. Every limiter is keyed by that header and \
         given the same numbers (fleetlimit: `header:x-api-key` token bucket; \
         tower-rate-limit-fred and tower_governor: GCRA with burst = capacity and \
         emission interval = 1 / refill rate). On Redis, fleetlimit has `[redis] \
         pool_size = {POOL_SIZE}, deadline = \"{DEADLINE_MS}ms\"` and \
         tower-rate-limit-fred a fred pool of {POOL_SIZE} with \
         `default_command_timeout` = {DEADLINE_MS} ms and `fail_open(true)`; both \
         pools run on the server's one worker thread. Requests are recorded from \
         the end of a {} s warm-up for {} s; the contenders run in turn, then in \
         the reverse order, and each one's better round (more requests per \
         second) is reported. Latency is client-side, from writing the request to \
         the end of the response body. `server CPU µs/req` is the CPU time of the \
         server's threads (`/proc/self/task/*/schedstat`) over the recorded \
         seconds ÷ the requests answered in them, `Redis CPU µs/req` the same for \
         `redis-server`, and `busy %` the share of one core that the server, the \
         generator and Redis kept busy (a server near 100 % is the bottleneck; a \
         generator near 100 % with a server well below it means the generator \
         is). Server, generator and Redis share the machine's two cores with \
         whatever else runs on it, so requests per second move from run to run; \
         CPU per request moves less. Read the ratios and the CPU figures rather \
         than the absolute rates.\n",
        WARMUP.as_secs(),
        secs.as_secs_f64()
    );
    let _ = writeln!(s, "### This run\n");
    let _ = writeln!(s, "- date: {} (UTC)", utc_now());
    let _ = writeln!(
        s,
        "- machine: `nproc` = {}, CPU {}; load average {load_before} before the run, \
         {load_after} after it; harness niceness {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model(),
        niceness()
    );
    let _ = writeln!(s, "- `{}`", command_line("rustc", &["--version"]));
    let _ = writeln!(s, "- `{}`", command_line("redis-server", &["--version"]));
    let _ = writeln!(s, "- fleetlimit at {revision}");
    let _ = writeln!(
        s,
        "- {CONNECTIONS} connections, {} s warm-up + {} s recorded per run, {ROUNDS} \
         rounds per scenario; the whole run took {:.0} s\n",
        WARMUP.as_secs(),
        secs.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    s.push_str(scenarios);
    s.push_str("### Redis CPU per script call\n\n");
    match scripts {
        Some(table) => {
            let _ = writeln!(
                s,
                "`redis-benchmark -P 16 -n 200000 -r 10000` (50 clients) sending \
                 `EVALSHA <sha> 1 <key with __rand_int__> <args>` of each script \
                 (`SCRIPT LOAD`ed first, every key space empty before), on the same \
                 `redis-server`; µs per call is `usec` ÷ `calls` of `cmdstat_evalsha` \
                 in `INFO commandstats` after `CONFIG RESETSTAT`: Redis's own time for \
                 the whole script, its inner commands included. Every check is one \
                 bucket of burst 1000 refilled at 1000/s, cost 1 (fleetlimit's lean \
                 script takes them as 1000 µs per token and 1,000,000 µs of burst). \
                 The lean script is measured with 1, 4 and 16 checks per call \
                 (`EVALSHA <sha> <n> <key>×n <args>×n`, as the layer sends when n \
                 checks are in flight together; every `__rand_int__` is drawn on its \
                 own): its µs per decision is per call ÷ n (scenario (a) above shows how \
                 many checks the layer's calls carried: 1 ÷ script calls per request). \
                 Two rounds in alternating order, the lower figure kept.\n\n{table}"
            );
        }
        None => {
            s.push_str("Skipped: `redis-benchmark` (Debian package redis-tools) was not found.\n")
        }
    }
    let mut s = s.trim_end().to_owned();
    let _ = writeln!(s, "\n\n{END}");
    s
}

fn write_docs(section: &str) {
    let old = std::fs::read_to_string(DOCS).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => {
            let after = &old[e + END.len()..];
            format!("{}{}{}", &old[..b], section.trim_end(), after)
        }
        _ => {
            let mut s = old.trim_end().to_owned();
            if !s.is_empty() {
                s.push_str("\n\n");
            }
            s.push_str(section);
            s
        }
    };
    let new = if new.ends_with('\n') { new } else { new + "\n" };
    std::fs::write(DOCS, new).expect("docs/benchmarks.md is writable");
}

fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{cmd}: unavailable"))
}

fn git_revision() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    let rev = command_line("git", &["-C", dir, "rev-parse", "--short", "HEAD"]);
    if rev.starts_with("git:") {
        return "an unknown revision (no git)".to_owned();
    }
    let dirty = Command::new("git")
        .args(["-C", dir, "status", "--porcelain", "--", "src", "lua"])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    if dirty {
        format!("commit `{rev}` plus uncommitted changes to src/ or lua/")
    } else {
        format!("commit `{rev}`")
    }
}

/// HEAD and the state of src/ and lua/ against it, to notice sources that
/// change during the run (the bench binary was built before it).
fn source_fingerprint() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    [
        &["rev-parse", "HEAD"][..],
        &["diff", "HEAD", "--", "src", "lua"],
        &["status", "--porcelain", "--", "src", "lua"],
    ]
    .iter()
    .map(|args| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(*args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    })
    .collect()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// This process's nice value (field 19 of /proc/self/stat).
fn niceness() -> String {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // The command name (field 2) may hold spaces: count after ')'.
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().nth(16).map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `YYYY-MM-DD HH:MM`, UTC, without a date crate (Howard Hinnant's
/// days-to-civil).
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let (hh, mm) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02}")
}
