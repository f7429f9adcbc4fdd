//! A Redis outage never takes the API down: SIGKILL and SIGSTOP, with the
//! three failure policies, then recovery.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{get, post};
use fleetlimit::RateLimitLayer;
use support::*;

/// Deadline per check. Requests during the outage must finish within it
/// plus `MARGIN`: the deadline bounds them, not a TCP timeout.
const DEADLINE: Duration = Duration::from_millis(20);
const MARGIN: Duration = Duration::from_millis(80);

const LIMITS: &str = r#"
[fleet]
size = 2

[limits.per-key]
key = "header:x-api-key"
on_missing = "ip"
capacity = 10
refill = "1/d"

[limits.per-account]
key = "account:x-account"
capacity = 3
refill = "3/min"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "open"

[[routes]]
path = "/sign-in"
limits = ["per-account"]
on_redis_error = "closed"

[[routes]]
path = "/search"
limits = ["per-key"]
on_redis_error = "local"
"#;

async fn app(server: &RedisServer, prefix: &str) -> Router {
    let cfg = redis_config(server, prefix, "20ms", LIMITS);
    Router::new()
        .route("/", get(|| async { "home" }))
        .route("/sign-in", post(|| async { "welcome" }))
        .route("/search", get(|| async { "results" }))
        .layer(RateLimitLayer::new(cfg).await.unwrap())
}

struct Timed {
    status: u16,
    retry_after: Option<u64>,
    limited: bool,
    took: Duration,
}

async fn timed(app: &Router, method: &str, path: &str, headers: &[(&str, &str)]) -> Timed {
    let started = Instant::now();
    let res = send(app, request(method, path, "127.0.0.1:4000", headers)).await;
    Timed {
        status: res.status().as_u16(),
        retry_after: header(&res, "retry-after").map(|v| v.parse().unwrap()),
        limited: header(&res, "x-ratelimit-limit").is_some(),
        took: started.elapsed(),
    }
}

/// While Redis is unreachable: `/` serves, `/sign-in` answers 503 with
/// Retry-After, `/search` limits locally at capacity ÷ 2; nothing is a 500
/// and nothing waits longer than the deadline plus a margin.
async fn assert_degraded(app: &Router, tag: &str) {
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let home = timed(app, "GET", "/", &[("x-api-key", "outage")]).await;
        assert_eq!(home.status, 200, "{tag}: open route, request {i}");
        assert!(
            !home.limited,
            "{tag}: an unlimited answer carries no rate-limit headers"
        );

        let sign_in = timed(app, "POST", "/sign-in", &[("x-account", "mallory")]).await;
        assert_eq!(sign_in.status, 503, "{tag}: closed route, request {i}");
        assert!(
            sign_in.retry_after.unwrap_or(0) >= 1,
            "{tag}: 503 carries Retry-After"
        );
        slowest = slowest.max(home.took).max(sign_in.took);
    }
    // Local buckets: capacity 10 ÷ fleet size 2 = 5 for this instance.
    let mut counts = BTreeMap::new();
    for _ in 0..12 {
        let r = timed(
            app,
            "GET",
            "/search",
            &[("x-api-key", &format!("local-{tag}"))],
        )
        .await;
        if r.status == 429 {
            assert!(
                r.retry_after.unwrap_or(0) >= 1,
                "{tag}: 429 carries Retry-After"
            );
        }
        *counts.entry(r.status).or_insert(0) += 1;
        slowest = slowest.max(r.took);
    }
    assert_eq!(
        counts.get(&200),
        Some(&5),
        "{tag}: local limit is capacity ÷ 2: {counts:?}"
    );
    assert_eq!(counts.get(&429), Some(&7), "{tag}: {counts:?}");
    assert!(
        slowest < DEADLINE + MARGIN,
        "{tag}: a request took {slowest:?}, more than the deadline {DEADLINE:?} plus {MARGIN:?}"
    );
}

/// Redis is back: decisions come from Redis again and are exact.
async fn assert_recovered(app: &Router, server: &RedisServer, prefix: &str, tag: &str) {
    // fred reconnects in the background; wait (bounded) for a Redis decision.
    let give_up = Instant::now() + Duration::from_secs(15);
    loop {
        let r = timed(app, "GET", "/", &[("x-api-key", &format!("probe-{tag}"))]).await;
        if r.limited {
            break;
        }
        assert!(Instant::now() < give_up, "{tag}: the pool never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut admitted = 0;
    for _ in 0..15 {
        let r = timed(app, "GET", "/", &[("x-api-key", &format!("fresh-{tag}"))]).await;
        assert!(r.limited, "{tag}: decided by Redis");
        admitted += usize::from(r.status == 200);
    }
    assert_eq!(
        admitted, 10,
        "{tag}: a fresh key admits exactly its capacity"
    );
    let sign_in = timed(
        app,
        "POST",
        "/sign-in",
        &[("x-account", &format!("acct-{tag}"))],
    )
    .await;
    assert_eq!(sign_in.status, 200, "{tag}");
    server.assert_every_key_expires(prefix);
}

#[tokio::test]
async fn redis_killed_then_restarted() {
    let server = RedisServer::start();
    let prefix = prefix("killed");
    let app = app(&server, &prefix).await;
    assert!(
        timed(&app, "GET", "/", &[("x-api-key", "warm")])
            .await
            .limited
    );

    server.kill();
    assert_degraded(&app, "killed").await;

    // A restart also flushes the script cache: NOSCRIPT is recovered.
    server.restart();
    assert_recovered(&app, &server, &prefix, "restarted").await;
}

#[tokio::test]
async fn redis_frozen_by_sigstop_then_thawed() {
    let server = RedisServer::start();
    let prefix = prefix("frozen");
    let app = app(&server, &prefix).await;
    assert!(
        timed(&app, "GET", "/", &[("x-api-key", "warm")])
            .await
            .limited
    );

    server.freeze();
    assert_degraded(&app, "frozen").await;

    server.thaw();
    assert_recovered(&app, &server, &prefix, "thawed").await;
}

#[tokio::test]
async fn redis_down_at_start_up_is_not_an_error() {
    let server = RedisServer::start();
    let prefix = prefix("down-at-start");
    server.kill();
    let started = Instant::now();
    let app = app(&server, &prefix).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "start-up waits a bounded time"
    );
    assert_degraded(&app, "down-at-start").await;
    server.restart();
    assert_recovered(&app, &server, &prefix, "up-later").await;
}
