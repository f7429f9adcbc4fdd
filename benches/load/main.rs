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

mod contenders;
mod cpu;
mod figures;
mod generator;
mod knobs;
mod redis;
mod report;
mod scenarios;
mod scripts;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use knobs::{CONNECTIONS, DEFAULT_SECS, ROUNDS, WARMUP};
use redis::RedisServer;
use report::{
    docs_section, git_revision, loadavg, scenario_table, script_table, source_fingerprint,
    write_docs, RunInfo, DOCS,
};
use scenarios::{run_scenario, scenarios};
use scripts::script_costs;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("benches/load: a load run, not a test; run it with `cargo bench --bench load`");
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
