//! Cost-weighted requests: a route's fixed cost, a cost computed from the
//! request, refunds from the handler, and costs no bucket can hold.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use axum::routing::get;
use axum::{Extension, Router};
use fleetlimit::{RateLimitLayer, Refund};
use support::*;

const LIMITS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 10
refill = "1/d"

[[routes]]
path = "/report"
limits = ["per-key"]
cost = 5
on_redis_error = "closed"

[[routes]]
path = "/cached-report"
limits = ["per-key"]
cost = 5
refund = true
on_redis_error = "closed"

[[routes]]
path = "/greedy"
limits = ["per-key"]
cost = 5
refund = true
on_redis_error = "closed"

[[routes]]
path = "/search"
limits = ["per-key"]
on_redis_error = "closed"
"#;

/// Charged 5 like /report, but found in a cache: the real cost was 2.
async fn cached_report(Extension(refund): Extension<Refund>) -> String {
    assert_eq!(refund.refundable(), 5);
    refund.give_back(3).await.unwrap();
    assert_eq!(refund.refundable(), 2);
    "cached".into()
}

/// A route without `refund = true` carries no handle.
async fn report(refund: Option<Extension<Refund>>) -> &'static str {
    if refund.is_some() {
        "a refund handle on a route that did not ask for one"
    } else {
        "report"
    }
}

/// Tries to give back far more than it was charged.
async fn greedy(Extension(refund): Extension<Refund>) -> &'static str {
    refund.give_back(100).await.unwrap();
    assert_eq!(refund.refundable(), 0);
    refund.give_back(100).await.unwrap();
    "greedy"
}

async fn app(server: &RedisServer, prefix: &str) -> Router {
    let cfg = redis_config(server, prefix, "500ms", LIMITS);
    let layer = RateLimitLayer::new(cfg)
        .cost_fn("/search", |req| {
            req.uri()
                .query()
                .and_then(|q| q.strip_prefix("pages="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(1)
        })
        .await
        .unwrap();
    Router::new()
        .route("/report", get(report))
        .route("/cached-report", get(cached_report))
        .route("/greedy", get(greedy))
        .route("/search", get(|| async { "results" }))
        .layer(layer)
}

fn tokens(server: &RedisServer, key: &str) -> f64 {
    support::tokens(server, key, 10.0, 1.0 / 86_400.0)
}

#[tokio::test]
async fn a_cost_5_route_spends_5_and_a_refund_gives_3_back() {
    let server = RedisServer::start();
    let prefix = prefix("cost");
    let app = app(&server, &prefix).await;
    let key = header_key(&prefix, "per-key", "k");
    let req = |path: &str| request("GET", path, "127.0.0.1:1", &[("x-api-key", "k")]);

    let res = send(&app, req("/report")).await;
    assert_eq!(res.status(), 200);
    // 5 units left: one more request of 5.
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 1);
    assert_eq!(header_u64(&res, "x-ratelimit-limit"), 2);
    assert_eq!(body_text(res).await, "report");
    assert!((tokens(&server, &key) - 5.0).abs() < 0.01);

    let res = send(&app, req("/cached-report")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(body_text(res).await, "cached");
    let t = tokens(&server, &key);
    assert!((t - 3.0).abs() < 0.01, "5 − 5 + 3 = 3, not {t}");

    // 3 left: a cost-5 request does not fit and takes nothing.
    let refused = send(&app, req("/report")).await;
    assert_eq!(refused.status(), 429);
    assert!((tokens(&server, &key) - 3.0).abs() < 0.01);

    // A refund is never more than the charge, and never fills past capacity.
    let fresh = header_key(&prefix, "per-key", "g");
    let greedy = |path: &str| request("GET", path, "127.0.0.1:1", &[("x-api-key", "g")]);
    assert_eq!(send(&app, greedy("/report")).await.status(), 200);
    assert_eq!(send(&app, greedy("/greedy")).await.status(), 200);
    let t = tokens(&server, &fresh);
    assert!((t - 5.0).abs() < 0.01, "10 − 5 − 5 + 5 = 5, not {t}");
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn computed_costs_and_a_cost_above_capacity() {
    let server = RedisServer::start();
    let prefix = prefix("cost-fn");
    let app = app(&server, &prefix).await;
    let key = header_key(&prefix, "per-key", "s");
    let req = |q: &str| {
        request(
            "GET",
            &format!("/search{q}"),
            "127.0.0.1:1",
            &[("x-api-key", "s")],
        )
    };

    // 6 units left: one more request of 4 pages (the headers count
    // requests like this one).
    let res = send(&app, req("?pages=4")).await;
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 1);
    // A computed cost of 0 counts as 1: a client cannot make itself free
    // (another caller, so the rest of this test keeps its numbers).
    let free = |q: &str| {
        request(
            "GET",
            &format!("/search{q}"),
            "127.0.0.1:1",
            &[("x-api-key", "free")],
        )
    };
    let res = send(&app, free("?pages=0")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 9);
    let res = send(&app, free("?pages=9")).await;
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 0);
    let res = send(&app, free("?pages=0")).await;
    assert_eq!(
        res.status(),
        429,
        "a free request would pass an empty bucket"
    );

    // 20 pages can never fit a bucket of 10: refused with a reason, at once,
    // and without draining anything.
    let res = send(&app, req("?pages=20")).await;
    assert_eq!(res.status(), 413);
    assert!(
        res.headers().get("retry-after").is_none(),
        "waiting would not help"
    );
    let body = body_text(res).await;
    assert!(
        body.contains("costs 20") && body.contains("per-key"),
        "{body}"
    );
    assert!((tokens(&server, &key) - 6.0).abs() < 0.01);

    // A cost never takes a bucket below empty.
    assert_eq!(send(&app, req("?pages=6")).await.status(), 200);
    assert_eq!(send(&app, req("?pages=1")).await.status(), 429);
    assert!(tokens(&server, &key).abs() < 0.01);
    server.assert_every_key_expires(&prefix);
}
