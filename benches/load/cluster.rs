//! `LOAD_ONLY=cluster`: the seed's server on a 3-primary Redis Cluster
//! (issues 27 and 41). fleetlimit (Redis) with `batch_window = "1ms"`,
//! 10,000 requests a second open loop over 10,000 keys on a route of one
//! limit: how evenly the primaries share the decisions, how many checks a
//! script call carries (a primary's checks of every slot it owns go in one
//! call, src/store/redis/per_node.rs), and each primary's CPU per decision
//! beside a standalone Redis's in the same run (the same server, the same
//! window), which sizes the primaries 200,000, 1,000,000 and 5,000,000
//! checks a second need.
//!
//! Decisions per primary: its `MGET` calls (`INFO commandstats` counts the
//! commands scripts run): the scripts read each key of a call across slots,
//! and a call of one check's key, with one `MGET` of its own.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::contenders::{FLEET_REDIS_W1, Server};
use crate::cpu::threads_cpu_ns;
use crate::figures::{opt, thousands};
use crate::generator::{Load, Traffic, spawn_generator};
use crate::knobs::{SEED_CHECKS_PER_SEC, WARMUP};
use crate::redis::{RedisServer, Reply, cmdstat};
use crate::scenarios::{open_loop, run_one, sleep_until};
use crate::window::SEED_SERVER_RATE;

/// Checks a second the sizing table is written for.
const SIZES: [f64; 3] = [SEED_CHECKS_PER_SEC, 1_000_000.0, 5_000_000.0];

/// Three `redis-server --cluster-enabled yes` joined by `redis-cli
/// --cluster create` (no replicas); killed when dropped.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// `None` (said why) when the cluster cannot be made here.
    pub fn start() -> Option<Self> {
        let args = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"];
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_with(&args)).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let cli = std::env::var("FLEETLIMIT_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into());
        let created = Command::new(&cli)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !created.is_ok_and(|s| s.success()) {
            println!("cluster: `{cli} --cluster create` failed; skipped");
            return None;
        }
        let c = Self { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        let ok = |n: &RedisServer| match n.cmd(&["CLUSTER", "INFO"]) {
            Ok(Reply::Bulk(b)) => String::from_utf8_lossy(&b).contains("cluster_state:ok"),
            _ => false,
        };
        while !c.nodes.iter().all(ok) {
            if Instant::now() > deadline {
                println!("cluster: never reached cluster_state:ok; skipped");
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(c)
    }

    /// `redis-cluster://` with one seed node: fred learns the others from
    /// it (`CLUSTER SLOTS`).
    pub fn url(&self) -> String {
        format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port)
    }
}

/// One primary's share of a run.
pub struct Primary {
    pub port: u16,
    pub calls: u64,
    /// Its decisions: the `MGET`s its scripts ran (see the module's doc).
    pub decisions: u64,
    pub cpu_us: Option<f64>,
}

/// The same server on the standalone Redis, in the same run.
pub struct Standalone {
    pub rps: f64,
    pub checks_per_call: Option<f64>,
    pub redis_us: Option<f64>,
}

/// One run: what the generator saw and each primary's part.
pub struct ClusterRun {
    pub requests: u64,
    pub rps: f64,
    pub p50_us: u32,
    pub p99_us: u32,
    pub failed: u64,
    pub primaries: Vec<Primary>,
    pub standalone: Standalone,
}

pub fn run_cluster(redis: &RedisServer, secs: Duration) -> Option<ClusterRun> {
    let sc = open_loop();
    let load = Load::open(SEED_SERVER_RATE);
    let alone = run_one(FLEET_REDIS_W1, &sc, load, redis, secs, 0xC0);
    let standalone = Standalone {
        rps: alone.stats.rps,
        checks_per_call: alone
            .script_calls_per_sec
            .filter(|c| *c > 0.0)
            .map(|c| alone.stats.rps / c),
        redis_us: alone.cpu.redis_us_per_req,
    };
    let cluster = Cluster::start()?;
    let server = Server::start(FLEET_REDIS_W1, sc.numbers, cluster.url());
    let warm = Instant::now() + WARMUP;
    let end = warm + secs;
    let generator = spawn_generator(vec![server.addr], Traffic::Normal, load, warm, end, 0xC1);
    sleep_until(warm);
    let cpu = |n: &RedisServer| threads_cpu_ns(&n.pid().to_string(), |_| true);
    for n in &cluster.nodes {
        n.reset_stats();
    }
    let before: Vec<Option<u64>> = cluster.nodes.iter().map(cpu).collect();
    sleep_until(end);
    let primaries = cluster
        .nodes
        .iter()
        .zip(before)
        .map(|(n, before)| Primary {
            port: n.port,
            calls: n.script_stats().0,
            decisions: cmdstat(&n.commandstats(), "mget").map_or(0, |s| s.calls),
            cpu_us: cpu(n)
                .zip(before)
                .map(|(a, b)| a.saturating_sub(b) as f64 / 1e3),
        })
        .collect();
    let tally = generator.join().expect("the load generator panicked");
    let note = server.stop();
    let stats = tally.stats(secs);
    println!("cluster: {note}");
    Some(ClusterRun {
        requests: stats.requests,
        rps: stats.rps,
        p50_us: stats.p50_us,
        p99_us: stats.p99_us,
        failed: stats.errors + stats.other,
        primaries,
        standalone,
    })
}

pub fn cluster_table(r: &ClusterRun) -> String {
    let calls: u64 = r.primaries.iter().map(|p| p.calls).sum();
    let decisions: u64 = r.primaries.iter().map(|p| p.decisions).sum();
    let even = decisions as f64 / r.primaries.len() as f64;
    let cpu: Option<f64> = r.primaries.iter().map(|p| p.cpu_us).sum();
    let per_decision = cpu
        .filter(|_| decisions > 0)
        .map(|us| us / decisions as f64);
    let alone = &r.standalone;
    let ratio = per_decision.zip(alone.redis_us).map(|(c, s)| c / s);
    let spread = r
        .primaries
        .iter()
        .map(|p| (p.decisions as f64 / even.max(1e-9) - 1.0).abs())
        .fold(0.0, f64::max);
    let mut t = format!(
        "fleetlimit (Redis, batch window 1 ms) at {} req/s open loop on 3 primaries: achieved {} \
         req/s, p50 {} µs, p99 {} µs, {} failed or other statuses; {} script calls for {} \
         requests: **{} checks a call** (goal ≥ 8). Primary CPU per decision {} µs against {} µs \
         for the standalone Redis with the same server and window in this run ({} req/s, {} \
         checks a call): **{}×** (goal ≤ 1.3). Decisions per primary at most **{:.1} %** from \
         even (goal ≤ 15 %).\n\n\
         | primary | script calls | decisions (`MGET`s) | checks a call | share ÷ even | Redis CPU µs per decision |\n|---|--:|--:|--:|--:|--:|\n",
        thousands(SEED_SERVER_RATE),
        thousands(r.rps),
        r.p50_us,
        r.p99_us,
        r.failed,
        thousands(calls as f64),
        thousands(r.requests as f64),
        opt((calls > 0).then(|| r.requests as f64 / calls as f64), 1),
        opt(per_decision, 2),
        opt(alone.redis_us, 2),
        thousands(alone.rps),
        opt(alone.checks_per_call, 1),
        opt(ratio, 2),
        spread * 100.0,
    );
    for p in &r.primaries {
        let per = p
            .cpu_us
            .filter(|_| p.decisions > 0)
            .map(|us| us / p.decisions as f64);
        t.push_str(&format!(
            "| 127.0.0.1:{} | {} | {} | {} | {:.2} | {} |\n",
            p.port,
            thousands(p.calls as f64),
            thousands(p.decisions as f64),
            opt(
                (p.calls > 0).then(|| p.decisions as f64 / p.calls as f64),
                1
            ),
            p.decisions as f64 / even.max(1e-9),
            opt(per, 2),
        ));
    }
    t.push_str(
        "\n| checks a second | primaries at one core each, by this run's cost per decision |\n|--:|--:|\n",
    );
    for rate in SIZES {
        let cores = per_decision.map(|us| rate * us / 1e6);
        t.push_str(&format!(
            "| {} | {} ({} cores) |\n",
            thousands(rate),
            opt(cores.map(f64::ceil), 0),
            opt(cores, 1),
        ));
    }
    t
}
