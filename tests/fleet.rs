//! Fleet size by heartbeat: instances heartbeat into a sorted set in Redis,
//! the live count follows the fleet, the local fallback divides by it, and
//! the last count is kept while Redis is down.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use fleetlimit::RateLimitLayer;
use support::*;

const LIMITS: &str = r#"
[fleet]
size = 1
discover = true
heartbeat = "200ms"
dead_after = "1s"

[limits.per-key]
key = "header:x-api-key"
capacity = 12
refill = "1/d"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "local"
"#;

async fn wait_for(layers: &[&RateLimitLayer], n: u32, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if layers.iter().all(|l| l.fleet_size() == n) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "fleet size never reached {n}: {:?}",
            layers.iter().map(|l| l.fleet_size()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_live_count_follows_the_fleet_and_survives_an_outage() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("fleet");
    let mut layers = Vec::new();
    for _ in 0..3 {
        layers.push(
            RateLimitLayer::new(redis_config(&server, &prefix, "50ms", LIMITS))
                .await
                .unwrap(),
        );
    }
    wait_for(
        &layers.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(5),
    )
    .await;
    let key = format!("{prefix}:fleet:{{instances}}");
    assert_eq!(server.cli(&["ZCARD", &key]).unwrap().trim(), "3");
    let pttl: i64 = server.cli(&["PTTL", &key]).unwrap().trim().parse().unwrap();
    assert!(pttl > 0, "the fleet set has an expiry too: {pttl}");

    // One instance dies (its heartbeat stops, as in a crash).
    drop(layers.pop());
    // Documented staleness: dead_after (1 s) plus one heartbeat (200 ms);
    // the rest of the margin is for a busy machine, not the design
    // (`wait_for` fails past it).
    let took = wait_for(
        &layers.iter().collect::<Vec<_>>(),
        2,
        Duration::from_secs(4),
    )
    .await;
    println!("the live count dropped to 2 after {took:?}");

    // Redis goes away: the last count (2) is kept, and the local fallback
    // allows capacity 12 ÷ 2 = 6 on this instance.
    server.kill();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(layers[0].fleet_size(), 2);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layers[0].clone());
    let mut admitted = 0;
    for _ in 0..10 {
        let res = send(
            &app,
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", "k")]),
        )
        .await;
        admitted += usize::from(res.status() == 200);
    }
    assert_eq!(admitted, 6);
}
