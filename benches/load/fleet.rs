//! The fleet: `FLEET_PROCESSES` server processes on one Redis, each the
//! bench binary itself re-executed with `LOAD_SERVE=<contender>` (it prints
//! its port, serves until its standard input closes, and is killed when
//! the [`Fleet`] is dropped, panics included).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::contenders::{BARE, Contender, FLEET_REDIS, serve};
use crate::cpu::ServerThreads;
use crate::figures::{opt, run_line, thousands};
use crate::generator::{CLOSED, Load, Traffic};
use crate::knobs::{FLEET_PROCESSES, OPEN_LOOP_PERCENTS, SEED_CHECKS_PER_SEC};
use crate::openloop::{BEHIND, behind_note};
use crate::redis::RedisServer;
use crate::scenarios::{Run, WITHIN, measure};

/// Set in a child's environment: which contender it serves.
pub const SERVE_ENV: &str = "LOAD_SERVE";
/// Set in a child's environment: the Redis URL.
pub const REDIS_ENV: &str = "LOAD_REDIS_URL";

fn contender(which: &str) -> Contender {
    match which {
        "bare" => BARE,
        "fleetlimit" => FLEET_REDIS,
        other => panic!("{SERVE_ENV}={other:?}: neither \"bare\" nor \"fleetlimit\""),
    }
}

/// The child's side: serve the contender as the in-process servers do (one
/// worker thread), print the port, stop when standard input closes.
pub fn serve_child(which: &str) {
    let c = contender(which);
    let url = std::env::var(REDIS_ENV).unwrap_or_default();
    let (ready_tx, ready_rx) = mpsc::channel::<SocketAddr>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        if let Ok(addr) = ready_rx.recv() {
            println!("{}", addr.port());
        }
        // Until the parent closes our stdin (or dies).
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = stop_tx.send(());
    });
    serve(c, WITHIN, &url, &ready_tx, stop_rx);
}

/// The server processes; killed (and reaped) when dropped.
pub struct Fleet {
    children: Vec<Child>,
    pub addrs: Vec<SocketAddr>,
}

impl Fleet {
    pub fn start(which: &str, redis: &RedisServer) -> Self {
        let exe = std::env::current_exe().expect("the bench binary's path");
        let mut fleet = Fleet {
            children: Vec::new(),
            addrs: Vec::new(),
        };
        for _ in 0..FLEET_PROCESSES {
            let mut child = Command::new(&exe)
                .env(SERVE_ENV, which)
                .env(REDIS_ENV, redis.url())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("a server process");
            let stdout = child.stdout.take().expect("a piped stdout");
            fleet.children.push(child);
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(stdout).read_line(&mut line);
                let _ = tx.send(line);
            });
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("a {which} server process did not start: {e}"));
            let port: u16 = line
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("a {which} server process said {line:?}"));
            fleet.addrs.push(SocketAddr::from(([127, 0, 0, 1], port)));
        }
        fleet
    }

    pub fn threads(&self) -> ServerThreads {
        ServerThreads::Processes(self.children.iter().map(Child::id).collect())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.children {
            // Closing stdin lets it stop by itself; the kill makes sure.
            drop(c.stdin.take());
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct FleetResult {
    /// fleetlimit ×N, closed loop: the fleet's peak.
    pub peak: Run,
    /// fleetlimit ×N at `percent` % of that peak.
    pub open: Run,
    /// bare axum ×N at the same rate.
    pub bare: Run,
    pub rate: f64,
    pub percent: u32,
    pub open_connections: usize,
}

impl FleetResult {
    /// Redis CPU per decision at the fleet's open-loop load (every answer,
    /// admitted or refused, is one decision).
    pub fn redis_us_per_decision(&self) -> Option<f64> {
        self.open.cpu.redis_us_per_req
    }

    pub fn checks_per_call(&self) -> Option<f64> {
        self.open
            .script_calls_per_sec
            .filter(|c| *c > 0.0)
            .map(|c| self.open.stats.rps / c)
    }

    /// The share of one Redis core the seed's checks per second would take
    /// at this cost per decision.
    pub fn seed_core_share(&self) -> Option<f64> {
        self.redis_us_per_decision()
            .map(|us| SEED_CHECKS_PER_SEC * us / 1e6)
    }

    /// fleetlimit's p99 − bare axum's at the same rate; `None` when the
    /// bare fleet fell behind that rate (its p99 is then queueing, no
    /// baseline).
    pub fn p99_added_us(&self) -> Option<f64> {
        (self.bare.stats.rps >= self.rate * BEHIND)
            .then(|| f64::from(self.open.stats.p99_us) - f64::from(self.bare.stats.p99_us))
    }
}

pub fn run_fleet(redis: &RedisServer, secs: Duration) -> FleetResult {
    println!("\n(h) a fleet of {FLEET_PROCESSES} server processes on one Redis");
    let percent = *OPEN_LOOP_PERCENTS.last().expect("a load");
    redis.flushall();
    let fleet = Fleet::start("fleetlimit", redis);
    let go = |fleet: &Fleet, load: Load, seed: u64, scripts: bool| {
        measure(
            fleet.addrs.clone(),
            &fleet.threads(),
            Traffic::Normal,
            load,
            redis,
            secs,
            seed,
            scripts,
        )
    };
    let peak = go(&fleet, CLOSED, 0xF1, true);
    print_run("fleetlimit, closed loop", None, CLOSED, &peak);
    let rate = peak.stats.rps * f64::from(percent) / 100.0;
    let load = Load::open(rate);
    let open = go(&fleet, load, 0xF2, true);
    print_run("fleetlimit, open loop", Some(rate), load, &open);
    drop(fleet);
    let fleet = Fleet::start("bare", redis);
    let bare = go(&fleet, load, 0xF3, false);
    print_run("bare axum, open loop", Some(rate), load, &bare);
    drop(fleet);
    FleetResult {
        peak,
        open,
        bare,
        rate,
        percent,
        open_connections: load.connections,
    }
}

fn print_run(what: &str, rate: Option<f64>, load: Load, r: &Run) {
    println!(
        "  {FLEET_PROCESSES} × {what:<24} offered {:>7} achieved {:>7.0} req/s ({} conn)  {}{}",
        rate.map_or_else(|| "—".to_owned(), |r| format!("{r:.0}")),
        r.stats.rps,
        load.connections,
        run_line(&r.stats, &r.cpu, "servers"),
        r.script_calls_per_sec
            .map(|c| format!("  script calls {c:.0}/s"))
            .unwrap_or_default()
    );
}

pub fn fleet_table(f: &FleetResult) -> String {
    let mut t = String::from(
        "| servers | load | offered req/s | achieved req/s | p50 µs | p90 µs | p99 µs | p99.9 µs \
         | servers' CPU µs/req | Redis CPU µs/decision | checks per script call | busy % of a \
         core: servers / generator / Redis | errors + other statuses |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    let rows = [
        (
            FLEET_REDIS.name(),
            format!("closed loop (peak), {} connections", CLOSED.connections),
            None,
            &f.peak,
        ),
        (
            FLEET_REDIS.name(),
            format!(
                "{} % of that peak, open loop, {} connections",
                f.percent, f.open_connections
            ),
            Some(f.rate),
            &f.open,
        ),
        (
            BARE.name(),
            format!(
                "the same rate, open loop, {} connections",
                f.open_connections
            ),
            Some(f.rate),
            &f.bare,
        ),
    ];
    for (name, load, offered, r) in rows {
        let s = &r.stats;
        let per_call = r
            .script_calls_per_sec
            .filter(|c| *c > 0.0)
            .map(|c| s.rps / c);
        let _ = writeln!(
            t,
            "| {FLEET_PROCESSES} × {name} | {load} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            offered.map_or_else(|| "—".to_owned(), thousands),
            thousands(s.rps),
            s.p50_us,
            s.p90_us,
            s.p99_us,
            s.p999_us,
            opt(r.cpu.server_us_per_req, 1),
            if r.script_calls_per_sec.is_some() {
                opt(r.cpu.redis_us_per_req, 2)
            } else {
                "—".to_owned()
            },
            opt(per_call, 2),
            r.cpu.busy(),
            s.errors + s.other,
        );
    }
    let added = match f.p99_added_us() {
        Some(us) => format!("{us:.0} µs added (goal < 2,000 µs)"),
        None => "no added figure: bare axum fell behind the rate (no baseline)".to_owned(),
    };
    let _ = writeln!(
        t,
        "\nAt {} % load: Redis CPU {} µs per decision and {} checks per script call, so \
         {} checks/s would keep {} of one Redis core busy (goal ≤ 60 %); p99 {} µs against \
         bare axum's {} µs at the same rate: {added}.",
        f.percent,
        opt(f.redis_us_per_decision(), 2),
        opt(f.checks_per_call(), 2),
        thousands(SEED_CHECKS_PER_SEC),
        f.seed_core_share()
            .map_or_else(|| "?".to_owned(), |s| format!("{:.0} %", s * 100.0)),
        f.open.stats.p99_us,
        f.bare.stats.p99_us,
    );
    t.push_str(&behind_note(&[
        (
            format!("{FLEET_PROCESSES} × {}", FLEET_REDIS.name()),
            f.rate,
            f.open.stats.rps,
        ),
        (
            format!("{FLEET_PROCESSES} × {}", BARE.name()),
            f.rate,
            f.bare.stats.rps,
        ),
    ]));
    t
}
