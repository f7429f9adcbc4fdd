//! Fixed and sliding windows against a real Redis: expiry repair, refused
//! requests not counted, Retry-After from the TTL, and the boundary burst.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::time::{Duration, Instant};

use axum::Router;
use fleetlimit::RateLimitLayer;
use support::*;

const LIMITS: &str = r#"
[limits.fixed]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 5
window = "2s"

[limits.sliding]
key = "header:x-api-key"
algorithm = "sliding-window"
limit = 10
window = "2s"

[limits.fixed10]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 10
window = "2s"

[[routes]]
path = "/fixed"
limits = ["fixed"]
on_redis_error = "closed"

[[routes]]
path = "/sliding"
limits = ["sliding"]
on_redis_error = "closed"

[[routes]]
path = "/fixed10"
limits = ["fixed10"]
on_redis_error = "closed"
"#;

async fn app(server: &RedisServer, prefix: &str) -> Router {
    let cfg = redis_config(server, prefix, "500ms", LIMITS);
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    support::ok_routes(layer, ["/fixed", "/sliding", "/fixed10"])
}

fn get_req(path: &str, key: &str) -> http::Request<axum::body::Body> {
    request("GET", path, "127.0.0.1:1", &[("x-api-key", key)])
}

#[tokio::test]
async fn fixed_window_repairs_a_counter_left_without_expiry() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("fw-repair");
    let app = app(&server, &prefix).await;
    let key = header_key(&prefix, "fixed", "legacy");
    // What a crashed older server leaves: a full count, no expiry.
    server.cli(&["SET", &key, "5"]).unwrap();
    assert_eq!(server.cli(&["PTTL", &key]).unwrap().trim(), "-1");

    let refused = send(&app, get_req("/fixed", "legacy")).await;
    assert_eq!(refused.status(), 429);
    let pttl: i64 = server.cli(&["PTTL", &key]).unwrap().trim().parse().unwrap();
    assert!(
        (1..=2000).contains(&pttl),
        "repaired at its next request: PTTL {pttl}"
    );
    assert_eq!(
        header_u64(&refused, "retry-after"),
        2,
        "the window's remaining TTL, rounded up"
    );
    assert_eq!(
        server.cli(&["GET", &key]).unwrap().trim(),
        "5",
        "a refusal is not counted"
    );

    tokio::time::sleep(Duration::from_millis(pttl as u64 + 100)).await;
    let res = send(&app, get_req("/fixed", "legacy")).await;
    assert_eq!(res.status(), 200, "admitted again after the window");
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 4);
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn fixed_window_counts_only_admitted_requests_and_opens_with_the_first() {
    let server = RedisServer::start();
    let prefix = prefix("fw-count");
    let app = app(&server, &prefix).await;
    let key = header_key(&prefix, "fixed", "fresh");
    let mut statuses = Vec::new();
    for i in 0..15 {
        let res = send(&app, get_req("/fixed", "fresh")).await;
        statuses.push(res.status().as_u16());
        if i == 0 {
            let pttl: i64 = server.cli(&["PTTL", &key]).unwrap().trim().parse().unwrap();
            assert!(
                (1_500..=2_000).contains(&pttl),
                "a fresh key has the window's TTL: {pttl}"
            );
        }
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 5);
    assert_eq!(server.cli(&["GET", &key]).unwrap().trim(), "5");
    server.assert_every_key_expires(&prefix);
}

/// Milliseconds on Redis's clock.
fn redis_now_ms(server: &RedisServer) -> u64 {
    let t = server.cli(&["TIME"]).unwrap();
    let mut it = t.lines();
    let s: u64 = it.next().unwrap().trim().parse().unwrap();
    let us: u64 = it.next().unwrap().trim().parse().unwrap();
    s * 1000 + us / 1000
}

async fn burst(app: &Router, path: &str, key: &str, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += usize::from(send(app, get_req(path, key)).await.status() == 200);
    }
    admitted
}

#[tokio::test]
async fn sliding_window_refuses_most_of_the_boundary_burst_a_fixed_window_admits() {
    let server = RedisServer::start();
    let prefix = prefix("boundary");
    let app = app(&server, &prefix).await;

    // Fixed window (10 per 2 s): open it, fill it just before it closes,
    // then send 10 more just after: 20 admitted within a fraction of a second.
    assert_eq!(burst(&app, "/fixed10", "f", 1).await, 1);
    let opened = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_500).saturating_sub(opened.elapsed())).await;
    let before = burst(&app, "/fixed10", "f", 9).await;
    tokio::time::sleep(Duration::from_millis(2_150).saturating_sub(opened.elapsed())).await;
    let after = burst(&app, "/fixed10", "f", 10).await;
    assert_eq!(
        (before, after),
        (9, 10),
        "the fixed window's boundary burst"
    );

    // Sliding window (10 per 2 s, windows aligned on Redis's clock): the same
    // shape around a window boundary.
    let now = redis_now_ms(&server);
    let mut boundary = now.div_ceil(2_000) * 2_000;
    if boundary - now < 900 {
        boundary += 2_000;
    }
    let started = Instant::now();
    tokio::time::sleep(
        Duration::from_millis(boundary - now - 600).saturating_sub(started.elapsed()),
    )
    .await;
    let before = burst(&app, "/sliding", "s", 10).await;
    tokio::time::sleep(
        Duration::from_millis(boundary - now + 100).saturating_sub(started.elapsed()),
    )
    .await;
    let after = burst(&app, "/sliding", "s", 10).await;
    assert_eq!(before, 10);
    assert!(
        after <= 2,
        "the sliding window refuses most of the second burst: {after} of 10"
    );
    server.assert_every_key_expires(&prefix);
}
