//! Scenarios on a virtual timeline: the in-process store on a paused tokio
//! clock, so the layer and the reference see the very same timestamps and
//! any disagreement is the layer's.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use fleetlimit::{Config, RateLimitLayer};
use tokio::time::Instant;

use crate::Rng;
use crate::reference::Algo;
use crate::report::Row;
use crate::score::{Obs, Tally, score};
use crate::support::{request, send};

/// The three algorithms, one route each, keyed by `x-api-key`.
pub const ALGOS: &str = r#"
[limits.tb]
key = "header:x-api-key"
capacity = 20
refill = "10/s"

[limits.fw]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 20
window = "2s"

[limits.sw]
key = "header:x-api-key"
algorithm = "sliding-window"
limit = 20
window = "2s"

[[routes]]
path = "/tb"
limits = ["tb"]

[[routes]]
path = "/fw"
limits = ["fw"]

[[routes]]
path = "/sw"
limits = ["sw"]
"#;

/// The numbers of `ALGOS`, by route.
pub fn algo(path: &str) -> Algo {
    match path {
        "/tb" => Algo::Token {
            capacity: 20.0,
            refill: 10.0,
        },
        "/fw" => Algo::Fixed {
            limit: 20.0,
            window: 2.0,
        },
        _ => Algo::Sliding {
            limit: 20.0,
            window: 2.0,
        },
    }
}

pub fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/tb", get(|| async { "ok" }))
        .route("/fw", get(|| async { "ok" }))
        .route("/sw", get(|| async { "ok" }))
        .layer(layer)
}

/// Sends `schedule` (seconds from the start, key) to `path` on a paused
/// clock; every answer is timed at the instant it was decided.
fn replay(path: &str, schedule: &[(f64, usize)]) -> Vec<Obs> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let cfg = Config::from_toml_str(ALGOS).expect("ALGOS is valid");
        let start = Instant::now();
        // On a paused clock no time passes while it is built: the store's
        // epoch (its sliding windows' zero) is `start`.
        let app = app(RateLimitLayer::new(cfg).await.expect("a layer"));
        let mut obs = Vec::with_capacity(schedule.len());
        for &(at, key) in schedule {
            tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
            let k = format!("key-{key}");
            let res = send(
                &app,
                request("GET", path, "127.0.0.1:7000", &[("x-api-key", &k)]),
            )
            .await;
            let t = (Instant::now() - start).as_secs_f64();
            obs.push(Obs {
                key,
                t0: t,
                t1: t,
                cost: 1.0,
                admitted: res.status() == 200,
                decided: true,
            });
        }
        obs
    })
}

fn row(scenario: &str, tally: Tally, why: &str) -> Row {
    Row {
        scenario: scenario.into(),
        tally,
        net: false,
        bound_admitted: 0,
        bound_refused: 0,
        bound_why: why.into(),
        note: String::new(),
    }
}

/// Poisson arrivals on 8 keys at half of each limit's rate, 60 s.
pub fn steady(rng: &mut Rng) -> Vec<Row> {
    let mut rows = Vec::new();
    for (path, name) in [
        ("/tb", "token bucket"),
        ("/fw", "fixed window"),
        ("/sw", "sliding window"),
    ] {
        let mut schedule = Vec::new();
        for key in 0..8 {
            let mut t = rng.f64();
            while t < 60.0 {
                schedule.push((t, key));
                t += rng.exp(1.0 / 5.0);
            }
        }
        schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
        let obs = replay(path, &schedule);
        let tally = score(obs, &[], |_| algo(path));
        rows.push(row(
            &format!("steady, in-process, {name}"),
            tally,
            "exact: the same algorithm on the same clock",
        ));
    }
    rows
}

/// Bursts of 30 (1.5 × the limit), 0.1 ms apart, straddling each
/// window's edge (a fixed window's end, a sliding window's boundary, the
/// moment an emptied token bucket has refilled 10 tokens), on 4 keys.
pub fn edges(rng: &mut Rng) -> Vec<Row> {
    let mut rows = Vec::new();
    for (path, name) in [
        ("/tb", "token bucket"),
        ("/fw", "fixed window"),
        ("/sw", "sliding window"),
    ] {
        let mut schedule = Vec::new();
        for key in 0..4 {
            // Each key's edges at its own offset (a random phase).
            let phase = 0.1 + rng.f64() * 0.5;
            for round in 0..6 {
                let edge = match path {
                    // Opened at `phase` by the first burst of round 0, then
                    // every 2 s (each burst opens the next window).
                    "/fw" => phase + 2.0 * round as f64,
                    "/sw" => 2.0 * (round + 1) as f64,
                    _ => phase + 1.0 * round as f64,
                };
                for i in 0..30 {
                    let t = edge - 0.0015 + 0.0001 * i as f64;
                    schedule.push((t.max(0.0), key));
                }
            }
        }
        schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
        let obs = replay(path, &schedule);
        let tally = score(obs, &[], |_| algo(path));
        rows.push(row(
            &format!("bursts at window edges, in-process, {name}"),
            tally,
            "exact",
        ));
    }
    rows
}
