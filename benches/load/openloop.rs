//! The open loop (fixed rate): requests sent on a schedule whatever the
//! server's answers, latency counted from when each request should have
//! gone (no coordinated omission), and the open-loop runs at 50 % and 80 %
//! of the closed-loop peaks of scenario (a).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;

use crate::contenders::{Contender, FLEET_REDIS, PEER};
use crate::figures::{opt, run_line, thousands};
use crate::generator::{Keys, Load, Rng, Tally, Traffic, connect, exchange, request};
use crate::knobs::{OPEN_LOOP_PERCENTS, REQUEST_TIMEOUT};
use crate::redis::RedisServer;
use crate::scenarios::{Measured, Scenario, run_one};

/// One keep-alive connection sending request k at `first + k × every`.
///
/// A request whose time comes while the previous one is still out waits
/// for it (HTTP/1.1, no pipelining), and its latency counts from its
/// scheduled time: the server's slowness is not hidden by sending less
/// (coordinated omission). A request whose connection was idle at its
/// scheduled time counts from when it was actually written: tokio's timer
/// wakes up to 1 ms late, and that delay is the generator's, not the
/// server's (connections are many enough that each one's interval is
/// several times that: `OPEN_LOOP_INTERVAL`). Requests scheduled from
/// `warm` to `end` are recorded, those still out at `end` included.
pub async fn paced_connection(
    addr: SocketAddr,
    keys: Arc<Keys>,
    traffic: Traffic,
    seed: u64,
    (first, every): (Instant, Duration),
    warm: Instant,
    end: Instant,
) -> Tally {
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let host = HeaderValue::from_str(&addr.to_string()).expect("an address");
    let mut sender = None;
    let mut next = first;
    let mut prev_done = Instant::now();
    while next < end && Instant::now() < end {
        let mut s = match sender.take() {
            Some(s) => s,
            None => match connect(addr).await {
                Some(s) => s,
                None => {
                    if next >= warm {
                        tally.errors += 1;
                    }
                    next += every;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let idle_when_due = prev_done <= next;
        if next > Instant::now() {
            tokio::time::sleep_until(next.into()).await;
        }
        let req = request(&host, keys.pick(traffic, &mut rng));
        let written = Instant::now();
        let from = if idle_when_due { written } else { next };
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, exchange(&mut s, req)).await;
        let done = Instant::now();
        prev_done = done;
        let recorded = next >= warm;
        next += every;
        match outcome {
            Ok(Ok(status)) => {
                sender = Some(s);
                if recorded {
                    tally.record(status, done.duration_since(from));
                }
            }
            _ => {
                if recorded {
                    tally.errors += 1;
                }
            }
        }
    }
    tally
}

/// One open-loop run: a contender at a fixed offered rate.
#[derive(Clone, Debug)]
pub struct OpenRun {
    /// What the rate is a share of, e.g. "80 % of tower-rate-limit-fred's peak".
    pub label: String,
    pub percent: u32,
    pub offered: f64,
    pub measured: Measured,
    pub connections: usize,
}

/// fleetlimit (Redis) and tower-rate-limit-fred at 50 % and 80 % of the
/// peer's closed-loop peak in `peaks` (the same offered rate for both),
/// then fleetlimit at 50 % and 80 % of its own peak.
pub fn run_open_loop(
    sc: &Scenario,
    peaks: &[Measured],
    redis: &RedisServer,
    secs: Duration,
) -> Vec<OpenRun> {
    let peak = |c: Contender| {
        peaks
            .iter()
            .find(|m| m.contender == c)
            .map(|m| m.stats.rps)
            .filter(|r| *r > 0.0)
    };
    let (Some(peer_peak), Some(own_peak)) = (peak(PEER), peak(FLEET_REDIS)) else {
        println!("\nopen loop: no peak of scenario (a) to take a share of; skipped");
        return Vec::new();
    };
    println!("\n{}", sc.title);
    let mut plan: Vec<(Contender, u32, f64, String)> = Vec::new();
    for (k, pct) in OPEN_LOOP_PERCENTS.into_iter().enumerate() {
        let rate = peer_peak * f64::from(pct) / 100.0;
        let of = format!("{pct} % of {}'s peak", PEER.name());
        // Alternate which of the two goes first.
        let pair = if k % 2 == 0 {
            [FLEET_REDIS, PEER]
        } else {
            [PEER, FLEET_REDIS]
        };
        for c in pair {
            plan.push((c, pct, rate, of.clone()));
        }
    }
    for pct in OPEN_LOOP_PERCENTS {
        let rate = own_peak * f64::from(pct) / 100.0;
        plan.push((FLEET_REDIS, pct, rate, format!("{pct} % of its own peak")));
    }
    plan.into_iter()
        .enumerate()
        .map(|(i, (c, percent, rate, label))| {
            let load = Load::open(rate);
            let seed = (0x0BE4 << 32) ^ i as u64;
            let m = run_one(c, sc, load, redis, secs, seed);
            print_open(c, &label, rate, load, &m);
            OpenRun {
                label,
                percent,
                offered: rate,
                measured: m,
                connections: load.connections,
            }
        })
        .collect()
}

pub fn print_open(c: Contender, label: &str, rate: f64, load: Load, m: &Measured) {
    println!(
        "  {:<24} at {:<38} offered {:>7.0} achieved {:>7.0} req/s ({} conn)  {}",
        c.name(),
        label,
        rate,
        m.stats.rps,
        load.connections,
        run_line(&m.stats, &m.cpu, "server"),
    );
}

/// Achieved below this share of the offered rate: the run fell behind its
/// schedule, and its latencies are mostly time spent waiting to be sent.
pub const BEHIND: f64 = 0.97;

/// A note naming the runs that fell behind, or nothing.
pub fn behind_note(runs: &[(String, f64, f64)]) -> String {
    let behind: Vec<String> = runs
        .iter()
        .filter(|(_, offered, achieved)| *achieved < offered * BEHIND)
        .map(|(name, offered, achieved)| {
            format!(
                "{name} ({} of {} req/s)",
                thousands(*achieved),
                thousands(*offered)
            )
        })
        .collect();
    if behind.is_empty() {
        return String::new();
    }
    format!(
        "\nFell behind the schedule (achieved < {:.0} % of offered; the server, the \
         generator or Redis did not get the CPU for that rate on the shared machine, so \
         the latencies are mostly queueing): {}.\n",
        BEHIND * 100.0,
        behind.join("; ")
    )
}

pub fn open_loop_table(runs: &[OpenRun]) -> String {
    let mut t = String::from(
        "| contender | offered rate | offered req/s | connections | achieved req/s | p50 µs | \
         p90 µs | p99 µs | p99.9 µs | server CPU µs/req | Redis CPU µs/req | errors + other \
         statuses |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for r in runs {
        let (m, s) = (&r.measured, &r.measured.stats);
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            m.contender.name(),
            r.label,
            thousands(r.offered),
            r.connections,
            thousands(s.rps),
            s.p50_us,
            s.p90_us,
            s.p99_us,
            s.p999_us,
            opt(m.cpu.server_us_per_req, 1),
            opt(m.cpu.redis_us_per_req, 1),
            s.errors + s.other,
        ));
    }
    let rates: Vec<(String, f64, f64)> = runs
        .iter()
        .map(|r| {
            let name = format!("{} at {}", r.measured.contender.name(), r.label);
            (name, r.offered, r.measured.stats.rps)
        })
        .collect();
    t.push_str(&behind_note(&rates));
    t
}
