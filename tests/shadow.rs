//! Shadow mode: decide and count as usual, log the would-be refusal, serve.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use axum::Router;
use axum::routing::get;
use fleetlimit::RateLimitLayer;
use support::*;

const LIMITS: &str = r#"
[limits.new-limit]
key = "header:x-api-key"
capacity = 3
refill = "1/d"

[limits.enforced]
key = "header:x-api-key"
capacity = 10
refill = "1/d"

[limits.trial]
key = "header:x-api-key"
capacity = 2
refill = "1/d"
mode = "shadow"

[[routes]]
path = "/route-shadow"
limits = ["new-limit"]
mode = "shadow"
on_redis_error = "closed"

[[routes]]
path = "/limit-shadow"
limits = ["enforced", "trial"]
on_redis_error = "closed"
"#;

#[tokio::test(flavor = "current_thread")]
async fn shadow_routes_and_limits_never_refuse_but_say_so() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = RedisServer::start();
    let prefix = prefix("shadow");
    let cfg = redis_config(&server, &prefix, "500ms", LIMITS);
    let app = Router::new()
        .route("/route-shadow", get(|| async { "ok" }))
        .route("/limit-shadow", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(cfg).await.unwrap());

    // A whole route in shadow mode: always served; the headers count down.
    let mut remaining = Vec::new();
    for _ in 0..6 {
        let res = send(
            &app,
            request("GET", "/route-shadow", "127.0.0.1:1", &[("x-api-key", "r")]),
        )
        .await;
        assert_eq!(res.status(), 200);
        remaining.push(header_u64(&res, "x-ratelimit-remaining"));
    }
    assert_eq!(remaining, [2, 1, 0, 0, 0, 0]);
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let would = logs.lines().filter(|l| l.contains("would refuse")).count();
    assert_eq!(would, 3, "{logs}");
    assert!(
        logs.contains("limit=new-limit") && logs.contains("shadow=true"),
        "{logs}"
    );
    captured.0.lock().unwrap().clear();

    // A shadow limit beside an enforced one: the enforced one still counts
    // every admitted request; the trial limit only logs.
    for _ in 0..5 {
        let res = send(
            &app,
            request("GET", "/limit-shadow", "127.0.0.1:1", &[("x-api-key", "l")]),
        )
        .await;
        assert_eq!(res.status(), 200);
    }
    let enforced = tokens(
        &server,
        &header_key(&prefix, "enforced", "l"),
        10.0,
        1.0 / 86_400.0,
    );
    assert!((enforced - 5.0).abs() < 0.01, "{enforced}");
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert_eq!(
        logs.lines()
            .filter(|l| l.contains("would refuse") && l.contains("limit=trial"))
            .count(),
        3,
        "{logs}"
    );
    server.assert_every_key_expires(&prefix);
}
