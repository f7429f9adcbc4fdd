//! Admission and refusal against a real Redis: headers, Retry-After, keys
//! apart, refill, route templates.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use fleetlimit::RateLimitLayer;
use support::*;

const LIMITS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 5
refill = "1/s"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "closed"

[[routes]]
path = "/users/{id}"
limits = ["per-key"]
on_redis_error = "closed"
"#;

async fn app(server: &RedisServer, prefix: &str) -> Router {
    // A generous deadline: these tests are about decisions, not outages, and
    // a `closed` route turns any store failure into a visible 503.
    let cfg = redis_config(server, prefix, "500ms", LIMITS);
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    support::ok_routes(layer, ["/", "/users/{id}", "/free"])
}

#[tokio::test]
async fn five_pass_the_sixth_is_refused_and_waits_out_retry_after() {
    let server = RedisServer::start();
    let prefix = prefix("admission");
    let app = app(&server, &prefix).await;
    let alice = || request("GET", "/", "127.0.0.1:1000", &[("x-api-key", "alice")]);

    for expected in (0..5).rev() {
        let res = send(&app, alice()).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header_u64(&res, "x-ratelimit-limit"), 5);
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), expected);
        assert!(header_u64(&res, "x-ratelimit-reset") >= 1);
        assert_eq!(body_text(res).await, "ok");
    }

    let refused = send(&app, alice()).await;
    assert_eq!(refused.status(), 429);
    let retry = header_u64(&refused, "retry-after");
    assert!(retry >= 1, "Retry-After {retry}");
    assert!(retry <= 2, "one token refills in a second, not {retry}");
    assert_eq!(header_u64(&refused, "x-ratelimit-limit"), 5);
    assert_eq!(header_u64(&refused, "x-ratelimit-remaining"), 0);
    assert_eq!(
        header(&refused, "content-type").as_deref(),
        Some("application/problem+json")
    );
    let body = body_text(refused).await;
    assert!(body.contains("\"limit\":\"per-key\""), "{body}");

    // Another key is unaffected.
    let bob = send(
        &app,
        request("GET", "/", "127.0.0.1:1000", &[("x-api-key", "bob")]),
    )
    .await;
    assert_eq!(bob.status(), 200);
    assert_eq!(header_u64(&bob, "x-ratelimit-remaining"), 4);

    // Waiting out Retry-After is enough.
    tokio::time::sleep(Duration::from_secs(retry) + Duration::from_millis(50)).await;
    let again = send(&app, alice()).await;
    assert_eq!(again.status(), 200);

    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn routes_are_matched_by_template_and_unlisted_routes_are_free() {
    let server = RedisServer::start();
    let prefix = prefix("template");
    let app = app(&server, &prefix).await;
    // /users/1 and /users/2 are one route: one bucket per key across both.
    let mut remaining = Vec::new();
    for i in 0..5 {
        let res = send(
            &app,
            request(
                "GET",
                &format!("/users/{i}"),
                "127.0.0.1:1",
                &[("x-api-key", "k")],
            ),
        )
        .await;
        assert_eq!(res.status(), 200);
        remaining.push(header_u64(&res, "x-ratelimit-remaining"));
    }
    assert_eq!(remaining, [4, 3, 2, 1, 0]);
    assert_eq!(
        send(
            &app,
            request("GET", "/users/99", "127.0.0.1:1", &[("x-api-key", "k")])
        )
        .await
        .status(),
        429
    );
    // No [default]: an unlisted route is not limited and says nothing.
    for _ in 0..10 {
        let res = send(
            &app,
            request("GET", "/free", "127.0.0.1:1", &[("x-api-key", "k")]),
        )
        .await;
        assert_eq!(res.status(), 200);
        assert!(header(&res, "x-ratelimit-limit").is_none());
    }
    // A 404 is not limited either (and stays a 404).
    let res = send(
        &app,
        request("GET", "/nope", "127.0.0.1:1", &[("x-api-key", "k")]),
    )
    .await;
    assert_eq!(res.status(), 404);
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn the_script_stores_one_value_expiring_after_the_second_it_is_full() {
    let server = RedisServer::start();
    let prefix = prefix("ttl");
    let app = app(&server, &prefix).await;
    for _ in 0..3 {
        send(
            &app,
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", "ttl")]),
        )
        .await;
    }
    let keys = server.keys_with_pttl(&prefix);
    assert_eq!(keys.len(), 1);
    let (key, pttl) = &keys[0];
    assert_eq!(key, &header_key(&prefix, "per-key", "ttl"));
    // 3 tokens short at 1/s: full (the same as missing) in 3 s; the key
    // expires 1 ms after the end of the second after that one, Redis time.
    assert!((3_800..=5_001).contains(pttl), "PTTL {pttl}");
    let left = tokens(&server, key, 5.0, 1.0);
    assert!((2.0..2.1).contains(&left), "{left}");
}

#[tokio::test]
async fn route_layer_works_too() {
    let server = RedisServer::start();
    let prefix = prefix("route-layer");
    let cfg = redis_config(&server, &prefix, "500ms", LIMITS);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(cfg).await.unwrap());
    let statuses: Vec<u16> = futures_statuses(&app, 7).await;
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
}

async fn futures_statuses(app: &Router, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        let res = send(
            app,
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", "rl")]),
        )
        .await;
        out.push(res.status().as_u16());
    }
    out
}
