//! Every admitted request of a `refund = true` route carries a `Refund`,
//! so a handler taking `Extension<Refund>` (not `Option`) never answers 500:
//! a no-op handle when nothing refundable was charged (Redis down under the
//! `open` policy, a limit in shadow mode).
// Its Redis tests need the `redis` feature; their helpers are unused without it.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports))]

use crate::support;

use axum::routing::get;
use axum::{Extension, Router};
use fleetlimit::{Config, RateLimitLayer, Refund};
use support::*;

const LIMITS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 10
refill = "1/d"

[limits.trial]
key = "header:x-api-key"
capacity = 1
refill = "1/d"

[[routes]]
path = "/open"
limits = ["per-key"]
cost = 4
refund = true
on_redis_error = "open"

[[routes]]
path = "/local"
limits = ["per-key"]
cost = 4
refund = true
on_redis_error = "local"

[[routes]]
path = "/shadow"
limits = ["trial"]
mode = "shadow"
refund = true
"#;

/// What was refundable, then gives 3 back (an error would be a 500).
async fn handler(Extension(refund): Extension<Refund>) -> Result<String, String> {
    let before = refund.refundable();
    refund.give_back(3).await.map_err(|e| e.to_string())?;
    Ok(format!("refundable={before} after={}", refund.refundable()))
}

/// What is refundable, keeping it.
async fn peek(Extension(refund): Extension<Refund>) -> String {
    format!("refundable={}", refund.refundable())
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/open", get(handler))
        .route("/local", get(handler))
        .route("/shadow", get(peek))
        .layer(layer)
}

async fn call(app: &Router, path: &str) -> (u16, String) {
    let res = send(
        app,
        request("GET", path, "127.0.0.1:1", &[("x-api-key", "k")]),
    )
    .await;
    (res.status().as_u16(), body_text(res).await)
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_down_open_route_gets_a_no_op_refund_not_a_500() {
    let server = RedisServer::start();
    let prefix = prefix("refund-down");
    let cfg = redis_config(&server, &prefix, "50ms", LIMITS);
    let app = app(RateLimitLayer::new(cfg).await.unwrap());
    // Healthy Redis: a real handle, charged the route's cost.
    assert_eq!(
        call(&app, "/open").await,
        (200, "refundable=4 after=1".into())
    );

    server.kill();
    for _ in 0..5 {
        // Served unlimited by the `open` policy: nothing to give back.
        assert_eq!(
            call(&app, "/open").await,
            (200, "refundable=0 after=0".into())
        );
    }
    // The `local` policy charged the in-process share: that one is real.
    assert_eq!(
        call(&app, "/local").await,
        (200, "refundable=4 after=1".into())
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_shadow_admission_gets_a_no_op_refund() {
    let cfg = Config::from_toml_str(LIMITS).unwrap();
    let app = app(RateLimitLayer::new(cfg).await.unwrap());
    // Capacity 1, cost 1: the first request is charged...
    assert_eq!(call(&app, "/shadow").await, (200, "refundable=1".into()));
    // ...the next ones are over the limit and served by shadow mode, charged
    // nothing: a no-op handle.
    for _ in 0..3 {
        assert_eq!(call(&app, "/shadow").await, (200, "refundable=0".into()));
    }
}

#[cfg(feature = "redis")]
/// Redis down under `local` with a fleet of 4: a cost-4 request is charged
/// the share (2.5 of 10 ÷ 4), so giving back 3 of its 4 units returns 3/4
/// of that share (1.875), not 3: the next request, charged 2.5, does not fit.
#[tokio::test]
async fn under_local_a_refund_gives_back_its_part_of_the_share() {
    let server = RedisServer::start();
    let prefix = prefix("refund-share");
    let cfg = redis_config(
        &server,
        &prefix,
        "50ms",
        &format!("[fleet]\nsize = 4\n{LIMITS}"),
    );
    let app = app(RateLimitLayer::new(cfg).await.unwrap());
    server.kill();
    assert_eq!(
        call(&app, "/local").await,
        (200, "refundable=4 after=1".into())
    );
    assert_eq!(call(&app, "/local").await.0, 429);
}
