//! One connection (`-c1`): what fleetlimit adds to a request's latency at
//! rest, next to one Redis round trip of the same script, measured by
//! `redis-benchmark -c 1` in the same run.

use std::fmt::Write as _;
use std::process::{Command, Stdio};

use crate::contenders::{BARE, FLEET_REDIS, PEER};
use crate::figures::opt;
use crate::knobs::RTT_CALLS;
use crate::redis::{RedisServer, Reply};
use crate::scenarios::Measured;
use crate::scripts::{FLEETLIMIT_SCRIPTS, ScriptCase};

/// One Redis round trip of fleetlimit's lean script, one decision per call.
#[derive(Clone, Debug)]
pub struct Rtt {
    pub script: &'static str,
    pub p50_us: f64,
    pub p99_us: Option<f64>,
    pub command: String,
}

/// The lean script's one-decision case, as the script costs measure it.
fn lean_case() -> Option<&'static ScriptCase> {
    FLEETLIMIT_SCRIPTS
        .iter()
        .find(|c| c.name.contains("lean") && c.batch == 1)
}

/// `redis-benchmark -c 1 -n RTT_CALLS --csv EVALSHA <lean sha> 1 <key> <args>`:
/// one client, one call at a time, so its p50 is one round trip of the
/// script (client, loopback, Redis running it). `None` without
/// `redis-benchmark` or the lean script.
pub fn redis_rtt(redis: &RedisServer) -> Option<Rtt> {
    let case = lean_case()?;
    let text = case.text.load().ok()?;
    redis.flushall();
    let sha = match redis.must(&["SCRIPT", "LOAD", &text]) {
        Reply::Bulk(b) => String::from_utf8(b).ok()?,
        _ => return None,
    };
    let port = redis.port().to_string();
    let n = RTT_CALLS.to_string();
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port, "-c", "1", "-n", &n])
        .args(["-r", "10000", "--csv", "EVALSHA", &sha, "1", case.key])
        .args(case.head)
        .args(case.args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let csv = String::from_utf8_lossy(&out.stdout);
    let mut lines = csv.lines();
    let head: Vec<String> = lines
        .next()?
        .split(',')
        .map(|h| h.trim_matches('"').to_owned())
        .collect();
    let row: Vec<String> = lines
        .next()?
        .split(',')
        .map(|v| v.trim_matches('"').to_owned())
        .collect();
    let field = |name: &str| -> Option<f64> {
        let i = head.iter().position(|h| h == name)?;
        row.get(i)?.parse::<f64>().ok().map(|ms| ms * 1000.0)
    };
    let p50_us = field("p50_latency_ms")?;
    Some(Rtt {
        script: case.name,
        p50_us,
        p99_us: field("p99_latency_ms"),
        command: format!(
            "redis-benchmark -c 1 -n {n} -r 10000 --csv EVALSHA <sha> 1 {} {}",
            case.key,
            // As sent: the head (an empty "not after" first) then the
            // arguments, an empty one written as the shell takes it.
            (case.head.iter().chain(case.args))
                .map(|a| if a.is_empty() { "\"\"" } else { a })
                .collect::<Vec<_>>()
                .join(" ")
        ),
    })
}

/// fleetlimit's p50 − bare axum's, and the same for the peer, from the
/// one-connection rows.
pub struct Added {
    pub fleet_us: Option<f64>,
    pub peer_us: Option<f64>,
}

pub fn added(rows: &[Measured]) -> Added {
    let p50 = |c| {
        rows.iter()
            .find(|m| m.contender == c)
            .map(|m| f64::from(m.stats.p50_us))
    };
    let bare = p50(BARE);
    Added {
        fleet_us: bare.zip(p50(FLEET_REDIS)).map(|(b, f)| f - b),
        peer_us: bare.zip(p50(PEER)).map(|(b, p)| p - b),
    }
}

pub fn c1_summary(rows: &[Measured], rtt: Option<&Rtt>) -> String {
    let a = added(rows);
    let mut s = String::new();
    match rtt {
        Some(r) => {
            let _ = writeln!(
                s,
                "One Redis round trip of the same script ({}): `{}` gives p50 {:.0} µs, \
                 p99 {} µs.\n",
                r.script,
                r.command,
                r.p50_us,
                opt(r.p99_us, 0)
            );
            let _ = writeln!(
                s,
                "| added to bare axum's p50 | µs | ÷ Redis round trip p50 |\n|---|--:|--:|"
            );
            for (name, v) in [(FLEET_REDIS.name(), a.fleet_us), (PEER.name(), a.peer_us)] {
                let _ = writeln!(
                    s,
                    "| {name} | {} | {} |",
                    opt(v, 0),
                    opt(v.map(|v| v / r.p50_us), 2)
                );
            }
        }
        None => {
            let _ = writeln!(
                s,
                "No Redis round trip measured (`redis-benchmark` missing or no lean script \
                 in benches/load/scripts.rs). fleetlimit adds {} µs to bare axum's p50.",
                opt(a.fleet_us, 0)
            );
        }
    }
    s
}
