//! (i) The seed's server, one of twenty: 10,000 requests a second, open
//! loop, over 10,000 keys, through fleetlimit on Redis without a batch
//! window and with windows of 0.5 and 1 ms, beside bare axum at the same
//! rate: checks per script call, Redis's CPU per decision (what sizes the
//! seed's 200,000 checks a second on one Redis core), and the latency the
//! layer adds (issue 27, goal 5).

use std::time::Duration;

use crate::contenders::{BARE, Contender, FLEET_REDIS, FLEET_REDIS_W1, FLEET_REDIS_W05};
use crate::figures::{opt, thousands};
use crate::generator::Load;
use crate::knobs::{NORMAL_KEYS, SEED_CHECKS_PER_SEC};
use crate::openloop::{behind_note, print_open};
use crate::redis::RedisServer;
use crate::scenarios::{Measured, open_loop, run_one};

/// One server of the seed's fleet: 20 servers × 10,000 requests a second.
pub const SEED_SERVER_RATE: f64 = 10_000.0;

const CONTENDERS: [Contender; 4] = [BARE, FLEET_REDIS, FLEET_REDIS_W05, FLEET_REDIS_W1];

/// Two rounds, the contenders' order reversed in the second.
pub fn run_window(redis: &RedisServer, secs: Duration) -> Vec<(usize, Measured)> {
    let sc = open_loop();
    println!(
        "\n(i) batch window: {} req/s open loop, {} keys",
        thousands(SEED_SERVER_RATE),
        thousands(NORMAL_KEYS as f64)
    );
    let load = Load::open(SEED_SERVER_RATE);
    let mut runs = Vec::new();
    for round in 0..2 {
        let mut order = CONTENDERS.to_vec();
        if round == 1 {
            order.reverse();
        }
        for (i, c) in order.into_iter().enumerate() {
            let seed = (0x3177 << 32) ^ (round * 8 + i) as u64;
            let m = run_one(c, &sc, load, redis, secs, seed);
            print_open(
                c,
                &format!("round {}", round + 1),
                SEED_SERVER_RATE,
                load,
                &m,
            );
            runs.push((round + 1, m));
        }
    }
    runs
}

pub fn window_table(runs: &[(usize, Measured)]) -> String {
    let mut t = String::from(
        "| contender | round | achieved req/s | p50 µs | p99 µs | added p50 / p99 µs (over bare, same round) | \
         checks per call | inside the script µs per decision | Redis CPU µs per decision | Redis cores for 200,000 checks/s | server CPU µs/req |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for (round, m) in runs {
        let s = &m.stats;
        let bare = runs
            .iter()
            .find(|(r, b)| r == round && b.contender == BARE)
            .map(|(_, b)| &b.stats);
        let added = match bare {
            Some(b) if m.contender != BARE => format!(
                "{} / {}",
                s.p50_us as i64 - b.p50_us as i64,
                s.p99_us as i64 - b.p99_us as i64
            ),
            _ => "—".into(),
        };
        let per_call = m
            .script_calls_per_sec
            .filter(|c| *c > 0.0)
            .map(|c| s.rps / c);
        let redis_us = m.cpu.redis_us_per_req.filter(|_| m.contender != BARE);
        let script_us = m
            .script_usec_per_sec
            .filter(|_| m.contender != BARE && s.rps > 0.0)
            .map(|u| u / s.rps);
        let cores = redis_us.map(|us| SEED_CHECKS_PER_SEC * us / 1e6);
        t.push_str(&format!(
            "| {} | {round} | {} | {} | {} | {added} | {} | {} | {} | {} | {} |\n",
            m.contender.name(),
            thousands(s.rps),
            s.p50_us,
            s.p99_us,
            opt(per_call, 1),
            opt(script_us, 2),
            opt(redis_us, 2),
            opt(cores, 2),
            opt(m.cpu.server_us_per_req, 1),
        ));
    }
    let rates: Vec<(String, f64, f64)> = runs
        .iter()
        .map(|(round, m)| {
            let name = format!("{} in round {round}", m.contender.name());
            (name, SEED_SERVER_RATE, m.stats.rps)
        })
        .collect();
    t.push_str(&behind_note(&rates));
    t
}

pub fn window_about() -> String {
    format!(
        "One server of the seed's fleet (20 servers × {} requests a second = {} checks a \
         second on one Redis): scenario (a)'s traffic and limits (every request admitted) at \
         a fixed {} requests a second, as (g) sends them, through bare axum and fleetlimit on \
         Redis without a batch window (a check goes out at once when none is in flight) and \
         with `[redis] batch_window` of 0.5 and 1 ms (a check waits that long for company). \
         Checks per call: requests ÷ the script calls Redis counted (`INFO commandstats`); \
         inside the script: their `usec` ÷ requests. \
         Redis CPU per decision: the `redis-server` process's CPU time (its every thread, \
         system calls included) ÷ requests; times {} it is the Redis cores the seed's fleet \
         needs at that cost. Server CPU counts the server's threads and fleetlimit's own \
         (`fleetlimit-*`: the Redis I/O thread, the batch window's). Two rounds, the order \
         reversed in the second; every run is shown.",
        thousands(SEED_SERVER_RATE),
        thousands(SEED_CHECKS_PER_SEC),
        thousands(SEED_SERVER_RATE),
        thousands(SEED_CHECKS_PER_SEC),
    )
}
