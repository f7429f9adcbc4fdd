//! The load harness: every contender measured over HTTP, side by side, in
//! one run, and the figures written to `docs/bench/load.md` and
//! `docs/benchmarks.md`.
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
//!    header back to back, for `LOAD_SECS` seconds (default 3) after a 1 s
//!    warm-up that is not recorded;
//! 3. runs the closed-loop scenarios — normal traffic, abuse, Redis
//!    frozen, one hot key, a concurrency limit, one connection (`-c1`,
//!    beside one Redis round trip of the same script by `redis-benchmark
//!    -c 1`) — with the contenders alternating (A B C D E, then E D C B A)
//!    so that noise on the shared machine hits them all alike, and keeps
//!    each contender's better round (the one with more requests per second);
//! 4. the open loop (openloop.rs): fixed rates at 50 % and 80 % of the
//!    peaks of scenario (a), latency from each request's scheduled time;
//! 5. a fleet (fleet.rs): 4 server processes (this binary re-executed) on
//!    the one Redis: its peak, 80 % of it, and bare axum at the same rate;
//! 6. one server of the seed's fleet (window.rs): 10,000 requests a
//!    second, open loop, without and with a batch window, beside bare axum;
//! 7. the in-process overhead (inprocess.rs): the routers of
//!    `benches/hot_path.rs`, timed in turns;
//! 8. measures what each rate-limit script costs Redis itself with
//!    `redis-benchmark` (skipped, with a note, if it is not installed);
//! 9. prints the tables, computes issue 15's goals (goals.rs), appends them
//!    to `docs/bench/runs.tsv`, writes the charts (`docs/bench/*.svg`,
//!    charts.rs), writes every table to `docs/bench/load.md` (the whole
//!    file) and rewrites the section of `docs/benchmarks.md` between
//!    `<!-- load:begin -->` and `<!-- load:end -->`: the run, the goals of
//!    the last three runs side by side, the charts.
//!
//! A whole run stays under 6 minutes: hence 3 recorded seconds per run.
//!
//! Under `cargo test --benches` (no `--bench` argument) it only says how
//! to run it: a load run is minutes of both cores, not a test.
//!
//! `LOAD_ONLY=scripts` runs only the script costs, `LOAD_ONLY=c1` only the
//! one-connection scenario and its Redis round trip, `LOAD_ONLY=fleet` only
//! the fleet, `LOAD_ONLY=window` only the batch window at the seed's rate
//! (window.rs), `LOAD_ONLY=cluster` only the seed's server on a 3-primary
//! Cluster (cluster.rs) (docs untouched).
//! `LOAD_ONLY=<part of a contender's name>` (several: `a|b`) (e.g. `LOAD_ONLY="fleetlimit
//! (Redis)"`) runs only the matching contenders of the closed-loop
//! scenarios, skips the rest and leaves the docs alone: for profiling one contender (`perf record
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

mod c1;
mod charts;
mod cluster;
mod contenders;
mod cpu;
mod figures;
mod fleet;
mod generator;
mod goals;
#[path = "../common/hot_routers.rs"]
#[allow(dead_code)]
mod hot_routers;
mod inprocess;
mod knobs;
mod openloop;
#[path = "../common/peer.rs"]
mod peer;
mod redis;
mod report;
mod scenarios;
mod scripts;
mod window;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use c1::{c1_summary, redis_rtt};
use charts::{Bar, Line};
use cluster::{cluster_table, run_cluster};
use contenders::{
    BARE, Contender, FLEET_MEMORY, FLEET_REDIS, FLEET_REDIS_IN_FLIGHT, FLEET_REDIS_LEASE,
    FROZEN_LOCAL, FROZEN_OPEN, GOVERNOR, PEER,
};
use fleet::{FleetResult, SERVE_ENV, fleet_table, run_fleet};
use goals::{Inputs, figures, goals_table, record_run, worst_script};
use inprocess::{in_process, in_process_text};
use knobs::{CONNECTIONS, DEFAULT_SECS, FLEET_PROCESSES, ROUNDS, WARMUP};
use openloop::{OpenRun, open_loop_table, run_open_loop};
use redis::RedisServer;
use report::{
    DOCS, REPORT, RunInfo, docs_section, git_revision, loadavg, report, scenario_table,
    script_table, short_head, source_fingerprint, utc_now, write_docs, write_report,
};
use scenarios::{Measured, open_loop, run_scenario, scenarios};
use scripts::script_costs;
use window::{run_window, window_about, window_table};

/// One part of a run, alone: its table.
type Part = fn(&RedisServer, Duration) -> String;

fn main() {
    // A server process of the fleet scenario (fleet.rs), not a run.
    if let Ok(which) = std::env::var(SERVE_ENV) {
        fleet::serve_child(&which);
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        println!("benches/load: a load run, not a test; run it with `cargo bench --bench load`");
        return;
    }
    let secs = load_secs();
    let started = Instant::now();
    let load_before = loadavg();
    // Taken now, as close as can be to when the bench was built.
    let revision = git_revision();
    let head = short_head();
    let sources = source_fingerprint();
    let redis = RedisServer::start();
    // LOAD_ONLY=scripts: the script costs alone, docs untouched.
    let only = std::env::var("LOAD_ONLY").ok().filter(|s| !s.is_empty());
    if only.as_deref() == Some("scripts") {
        if let Some(rows) = script_costs(&redis) {
            println!("\n### Redis CPU per script call\n\n{}", script_table(&rows));
        }
        println!("\nload harness: LOAD_ONLY=scripts: {DOCS} left as it was");
        return;
    }
    // LOAD_ONLY=fleet / window / c1: that part alone, docs untouched.
    let part: Option<(&str, Part)> = match only.as_deref() {
        Some("fleet") => Some(("(h) fleet", |r, secs| fleet_table(&run_fleet(r, secs)))),
        Some("window") => Some(("(i) batch window", |r, secs| {
            window_table(&run_window(r, secs))
        })),
        Some("cluster") => Some(("the seed's server on a 3-primary Cluster", |r, secs| {
            run_cluster(r, secs).map_or_else(|| "skipped".into(), |r| cluster_table(&r))
        })),
        _ => None,
    };
    if let Some((title, run)) = part {
        println!("\n### {title}\n\n{}", run(&redis, secs));
        println!(
            "\nload harness: LOAD_ONLY={}: {DOCS} left as it was",
            only.unwrap_or_default()
        );
        return;
    }
    if only.as_deref() == Some("c1") {
        for (i, sc) in scenarios().into_iter().enumerate() {
            if sc.load.connections == 1 {
                let rows = run_scenario(&sc, &redis, secs, i as u64);
                let rtt = redis_rtt(&redis);
                println!(
                    "\n### {}\n\n{}\n{}",
                    sc.title,
                    scenario_table(&sc, &rows),
                    c1_summary(&rows, rtt.as_ref())
                );
            }
        }
        println!("\nload harness: LOAD_ONLY=c1: {DOCS} left as it was");
        return;
    }
    println!(
        "load harness: redis-server on {} (pid {}), {CONNECTIONS} connections, warm-up {} s, \
         {} s recorded per run, {ROUNDS} rounds per scenario",
        redis.url(),
        redis.pid(),
        WARMUP.as_secs(),
        secs.as_secs_f64()
    );

    // LOAD_ONLY=<part of a contender's name>: only those contenders, no
    // open loop, fleet, script costs, docs untouched (for profiling one
    // contender).
    let mut sections = String::new();
    let mut measured: Vec<(&'static str, Vec<Measured>)> = Vec::new();
    let mut rtt = None;
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
        let mut table = scenario_table(sc, &rows);
        if sc.load.connections == 1 && only.is_none() {
            rtt = redis_rtt(&redis);
            table.push('\n');
            table.push_str(&c1_summary(&rows, rtt.as_ref()));
        }
        println!("\n### {}\n\n{table}", sc.title);
        let _ = write!(sections, "### {}\n\n{}\n\n{table}\n", sc.title, sc.about);
        measured.push((sc.title, rows));
    }

    if let Some(only) = &only {
        println!("\nload harness: LOAD_ONLY={only:?}: a partial run; {DOCS} left as it was");
        return;
    }
    let rows_of = |tag: &str| {
        measured
            .iter()
            .find(|(t, _)| t.starts_with(tag))
            .map(|(_, r)| r.as_slice())
    };

    let open_sc = open_loop();
    let open = run_open_loop(&open_sc, rows_of("(a)").unwrap_or_default(), &redis, secs);
    let table = open_loop_table(&open);
    println!("\n### {}\n\n{table}", open_sc.title);
    let _ = write!(
        sections,
        "### {}\n\n{}\n\n{table}\n",
        open_sc.title, open_sc.about
    );

    let fleet = run_fleet(&redis, secs);
    let table = fleet_table(&fleet);
    println!("\n### (h) fleet\n\n{table}");
    let _ = write!(
        sections,
        "### (h) a fleet: {FLEET_PROCESSES} server processes on one Redis\n\n{}\n\n{table}\n",
        fleet_about()
    );

    let table = window_table(&run_window(&redis, secs));
    println!("\n### (i) batch window\n\n{table}");
    let _ = write!(
        sections,
        "### (i) one server of the seed's fleet: the batch window\n\n{}\n\n{table}\n",
        window_about()
    );

    let inproc = in_process();
    let text = in_process_text(&inproc);
    println!("\n### In-process overhead\n\n{text}");
    let _ = write!(sections, "### In-process overhead (hot path)\n\n{text}\n");

    let script_rows = script_costs(&redis);
    let scripts = script_rows.as_deref().map(|rows| {
        let mut table = script_table(rows);
        if let Some((r, name)) = worst_script(rows) {
            let _ = write!(
                table,
                "\nCostliest fleetlimit script per limit decided (limits decided per call: \
                 the checks or limits per call): {name}, {r:.2}× the \
                 reference token bucket (median of the rounds' ratios).\n"
            );
        }
        println!("\n### Redis CPU per script call\n\n{table}");
        table
    });
    drop(redis);

    let elapsed = started.elapsed();
    let load_after = loadavg();
    println!(
        "\nload harness: done in {:.0} s; writing {REPORT} and {DOCS}",
        elapsed.as_secs_f64()
    );
    let mut revision = revision;
    if source_fingerprint() != sources {
        revision.push_str(
            " (src/ or lua/ changed while the harness ran; the figures are of the \
             build made before it started)",
        );
    }

    let inputs = Inputs {
        normal: rows_of("(a)"),
        abuse: rows_of("(b)"),
        c1: rows_of("(f)"),
        rtt: rtt.as_ref(),
        open: &open,
        fleet: Some(&fleet),
        in_process: Some(&inproc),
        scripts: script_rows.as_deref(),
    };
    let figs = figures(&inputs);
    let date = utc_now();
    let runs = record_run(&date, &head, &figs);
    let mut goals = goals_table(&figs, &runs);
    println!("\n### Goals\n\n{goals}");
    goals.push('\n');
    goals.push_str(&charts(&measured, &open, &fleet));

    let run = RunInfo {
        secs,
        elapsed,
        load_before,
        load_after,
        revision,
        date,
    };
    write_report(&report(&run, &sections, scripts.as_deref()));
    write_docs(&docs_section(&run, &goals));
}

fn fleet_about() -> String {
    format!(
        "{FLEET_PROCESSES} server processes (the bench binary re-executed with `{SERVE_ENV}`, \
         each an axum server on one worker thread as above, fleetlimit with the same \
         configuration as in (a)) on the one `redis-server`; the generator spreads its \
         connections over the {FLEET_PROCESSES}. First the closed loop (the fleet's peak), then \
         the open loop at 80 % of that peak, then {FLEET_PROCESSES} bare axum processes at the \
         same rate: the p99 fleetlimit adds. `servers' CPU` is the CPU time of every thread \
         of the {FLEET_PROCESSES} processes (`/proc/<pid>/task/*/schedstat`) ÷ requests; Redis \
         CPU per decision is `redis-server`'s CPU time ÷ answers (each answer, admitted or \
         refused, is one decision); checks per script call are answers ÷ \
         `cmdstat_evalsha` + `cmdstat_eval` calls. The share of one Redis core 200,000 \
         checks/s would take is 200,000 × µs per decision ÷ 10⁶, from the open-loop run \
         (less coalescing than at the peak: the conservative figure)."
    )
}

/// Colour of a contender in the bar charts (the same in every chart, and
/// each variant of fleetlimit on Redis its own).
fn colour(c: Contender) -> usize {
    [
        BARE,
        FLEET_MEMORY,
        FLEET_REDIS,
        PEER,
        GOVERNOR,
        FLEET_REDIS_LEASE,
        FLEET_REDIS_IN_FLIGHT,
        FROZEN_LOCAL,
        FROZEN_OPEN,
    ]
    .iter()
    .position(|x| *x == c)
    .unwrap_or(0)
}

/// Writes the SVG charts and returns the docs' links to them.
fn charts(measured: &[(&str, Vec<Measured>)], open: &[OpenRun], fleet: &FleetResult) -> String {
    let tag = |title: &str| title.split(' ').next().unwrap_or("").to_owned();
    let mut rps = Vec::new();
    let mut cpu = Vec::new();
    for (title, rows) in measured {
        for m in rows {
            let label = format!("{} {}", tag(title), m.contender.name());
            rps.push(Bar {
                label: label.clone(),
                parts: vec![m.stats.rps],
                colour: colour(m.contender),
            });
            let redis = if m.contender.uses_redis() {
                m.cpu.redis_us_per_req.unwrap_or(0.0)
            } else {
                0.0
            };
            cpu.push(Bar {
                label,
                parts: vec![m.cpu.server_us_per_req.unwrap_or(f64::NAN), redis],
                colour: colour(m.contender),
            });
        }
    }
    // The fleet's peak (closed loop), beside the single servers'.
    let (c, r) = (FLEET_REDIS, &fleet.peak);
    let label = format!("(h) {FLEET_PROCESSES} × {}", c.name());
    rps.push(Bar {
        label: label.clone(),
        parts: vec![r.stats.rps],
        colour: colour(c),
    });
    cpu.push(Bar {
        label,
        parts: vec![
            r.cpu.server_us_per_req.unwrap_or(f64::NAN),
            r.cpu.redis_us_per_req.unwrap_or(0.0),
        ],
        colour: colour(c),
    });
    let rps_svg = charts::bars(
        "rps.svg",
        "Requests per second, closed loop (best round)",
        "req/s",
        &["req/s"],
        &rps,
    );
    let cpu_svg = charts::bars(
        "cpu.svg",
        "CPU per request: server + Redis (µs)",
        "µs of CPU per request",
        &["server", "Redis"],
        &cpu,
    );
    let mut lines: Vec<Line> = open
        .iter()
        .map(|r| {
            let s = &r.measured.stats;
            Line {
                label: format!(
                    "{} at {} ({} req/s)",
                    r.measured.contender.name(),
                    r.label,
                    figures::thousands(r.offered)
                ),
                us: [s.p50_us, s.p90_us, s.p99_us, s.p999_us].map(f64::from),
            }
        })
        .collect();
    for (name, r) in [
        (FLEET_REDIS.name(), &fleet.open),
        (BARE.name(), &fleet.bare),
    ] {
        let s = &r.stats;
        lines.push(Line {
            label: format!(
                "(h) {FLEET_PROCESSES} × {name} at {} % of the fleet's peak ({} req/s)",
                fleet.percent,
                figures::thousands(fleet.rate)
            ),
            us: [s.p50_us, s.p90_us, s.p99_us, s.p999_us].map(f64::from),
        });
    }
    let lat_svg = charts::percentiles(
        "latency.svg",
        "Open loop (fixed rate): latency percentiles",
        &lines,
    );
    format!(
        "\n![req/s per contender and scenario]({rps_svg})\n\n\
         ![server and Redis CPU per request]({cpu_svg})\n\n\
         ![open-loop latency percentiles]({lat_svg})\n"
    )
}

/// `LOAD_SECS`, else `DEFAULT_SECS`.
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
