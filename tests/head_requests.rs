//! HEAD is limited like GET: axum's `get()` answers HEAD by running the GET
//! handler, so a route entry listing GET governs HEAD too (its route and its
//! cost function). A layer outside the `Router` sees no `MatchedPath` and
//! says so, once.
// Its Redis tests need the `redis` feature; their helpers are unused without it.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports))]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::get;
use fleetlimit::{Config, RateLimitLayer};
use support::*;
use tower::{Layer, ServiceExt};

const QUICKSTART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/quickstart.toml");

/// `/` and `/search` with GET handlers that count their runs.
fn counted_app(layer: RateLimitLayer, runs: &Arc<AtomicUsize>) -> Router {
    let (a, b) = (Arc::clone(runs), Arc::clone(runs));
    Router::new()
        .route(
            "/",
            get(move || async move {
                a.fetch_add(1, Ordering::SeqCst);
                "home"
            }),
        )
        .route(
            "/search",
            get(move || async move {
                b.fetch_add(1, Ordering::SeqCst);
                "results"
            }),
        )
        .layer(layer)
}

/// 5× GET / then HEAD / ×3 with quickstart.toml: the HEADs are refused
/// with the limit's headers, and the handler ran only for the GETs.
async fn five_gets_then_heads(app: &Router, runs: &AtomicUsize, api_key: &str) {
    let req = |m: &str| request(m, "/", "127.0.0.1:1", &[("x-api-key", api_key)]);
    for i in 0..5 {
        let res = send(app, req("GET")).await;
        assert_eq!(res.status(), 200, "GET {i}");
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 4 - i);
    }
    for i in 0..3 {
        let res = send(app, req("HEAD")).await;
        assert_eq!(res.status(), 429, "HEAD {i} after 5 GETs");
        assert_eq!(header_u64(&res, "x-ratelimit-limit"), 5);
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 0);
        assert!(header_u64(&res, "retry-after") >= 1);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        5,
        "a refused HEAD ran the handler"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn head_counts_against_the_get_route_in_process() {
    // Paused time: the quickstart's 1/s refill adds nothing mid-test.
    let cfg = Config::from_toml_file(QUICKSTART).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = counted_app(RateLimitLayer::new(cfg).await.unwrap(), &runs);
    five_gets_then_heads(&app, &runs, "k1").await;

    // And the other way round: HEADs spend what a GET would then need.
    let req = |m: &str| request(m, "/", "127.0.0.1:1", &[("x-api-key", "k2")]);
    for _ in 0..5 {
        let res = send(&app, req("HEAD")).await;
        assert_eq!(res.status(), 200);
        assert!(header(&res, "x-ratelimit-remaining").is_some());
    }
    assert_eq!(send(&app, req("GET")).await.status(), 429);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn head_counts_against_the_get_route_on_redis() {
    let server = RedisServer::start();
    // The quickstart, with a refill slow enough that no token comes back
    // however slowly this machine runs the test.
    let toml = std::fs::read_to_string(QUICKSTART)
        .unwrap()
        .replace(r#"refill = "1/s""#, r#"refill = "1/h""#);
    let prefix = prefix("head");
    let cfg = redis_config(&server, &prefix, "500ms", &toml);
    let runs = Arc::new(AtomicUsize::new(0));
    let app = counted_app(RateLimitLayer::new(cfg).await.unwrap(), &runs);
    five_gets_then_heads(&app, &runs, "k1").await;
    server.assert_every_key_expires(&prefix);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn head_uses_the_cost_function_of_its_get_route() {
    let cfg = Config::from_toml_file(QUICKSTART).unwrap();
    let layer = RateLimitLayer::new(cfg)
        .cost_fn("/search", |_| 3)
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = counted_app(layer, &runs);
    let req = |m: &str| request(m, "/search", "127.0.0.1:1", &[("x-api-key", "s")]);

    let res = send(&app, req("HEAD")).await;
    assert_eq!(res.status(), 200);
    // 5 − 3 = 2 tokens: no request of 3, and the GET costs 3 as well.
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 0);
    assert_eq!(send(&app, req("GET")).await.status(), 429);
    assert_eq!(send(&app, req("HEAD")).await.status(), 429);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

fn capture_errors() -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    crate::support::init_tracing();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::ERROR)
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_layer_outside_the_router_is_reported_once() {
    let (captured, _guard) = capture_errors();
    let cfg = Config::from_toml_file(QUICKSTART).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let router = counted_app(RateLimitLayer::new(cfg.clone()).await.unwrap(), &runs);

    // Inside the Router, an unknown path (the router's fallback, no
    // MatchedPath) is nothing to report.
    let res = send(&router, request("GET", "/favicon.ico", "127.0.0.1:1", &[])).await;
    assert_eq!(res.status(), 404);
    assert_eq!(captured.take(), "");

    // Around the Router: the router sets MatchedPath after the layer ran.
    let plain = Router::new().route("/", get(|| async { "home" }));
    let outside = RateLimitLayer::new(cfg).await.unwrap().layer(plain);
    let send_outside = |path: &'static str| {
        let svc = outside.clone();
        async move {
            svc.oneshot(request("GET", path, "127.0.0.1:1", &[]))
                .await
                .unwrap()
                .status()
        }
    };
    // A path the configuration does not name: nothing to say yet.
    assert_eq!(send_outside("/nope").await, 404);
    assert_eq!(captured.take(), "");
    for _ in 0..3 {
        assert_eq!(send_outside("/").await, 200);
    }
    let logs = captured.take();
    let errors: Vec<&str> = logs.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one error per layer: {logs}");
    assert!(
        errors[0].contains("MatchedPath")
            && errors[0].contains("route=\"/\"")
            && errors[0].contains("Router::layer"),
        "{logs}"
    );
}
