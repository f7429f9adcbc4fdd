//! The three routers of the in-process hot path, shared by
//! `benches/hot_path.rs` (criterion) and `benches/load/` (the harness's
//! alternated timing of the same routers): an axum router with one route
//! `/`, bare, behind fleetlimit's in-process layer, and behind a minimal
//! hand-written tower middleware around governor's keyed limiter (see
//! hot_path.rs for what each one is).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use fleetlimit::{Config, RateLimitLayer};
use governor::Quota;
use http::header::HeaderName;
use http::{HeaderValue, Request, StatusCode};
use tokio::runtime::Runtime;
use tower::ServiceExt;

/// Distinct API keys the requests cycle over.
pub const KEYS: usize = 10_000;
/// Burst and tokens per second of every limit: nothing is ever refused.
/// (The configuration's refill is 10^6/s, the most it accepts.)
pub const HUGE: u32 = 1_000_000_000;

pub static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

pub fn config() -> Config {
    Config::from_toml_str(&format!(
        r#"
        [limits.per-key]
        key = "header:x-api-key"
        capacity = {HUGE}
        refill = "1000000/s"

        [[routes]]
        path = "/"
        limits = ["per-key"]
        "#
    ))
    .expect("a valid configuration")
}

/// The application, its handlers turned into routes once (with_state), as
/// `axum::serve` does through `into_make_service`: otherwise axum rebuilds
/// (and re-layers) the route on every request.
pub fn app(router: Router) -> Router {
    router.with_state(())
}

pub fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

pub fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("key-{i:05}")).collect()
}

/// `GET /` with the API key (the default method and URI are `GET /`).
pub fn request(key: &HeaderValue) -> Request<Body> {
    let mut req = Request::new(Body::empty());
    req.headers_mut().insert(X_API_KEY.clone(), key.clone());
    req
}

// The governor middleware, shared with benches/instructions.rs.
#[path = "governor_layer.rs"]
pub mod governor_layer;
use governor_layer::GovernorLayer;

/// Sends `iters` requests through `app` inside one `block_on`, cycling over
/// the keys from `*next`, and returns the time they took.
pub fn drive(
    rt: &Runtime,
    app: &Router,
    keys: &[HeaderValue],
    next: &mut usize,
    iters: u64,
) -> Duration {
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let key = &keys[*next % keys.len()];
            *next += 1;
            let res = app.clone().oneshot(request(key)).await.expect("infallible");
            assert_eq!(res.status(), StatusCode::OK);
            black_box(res);
        }
        start.elapsed()
    })
}

/// Every limit's quota: nothing is ever refused.
pub fn quota() -> Quota {
    Quota::per_second(NonZeroU32::new(HUGE).expect("non-zero"))
}

/// The three routers: fleetlimit's in-process layer, bare, the governor
/// middleware.
pub fn routers(rt: &tokio::runtime::Runtime) -> (Router, Router, Router) {
    let layer = rt.block_on(async { RateLimitLayer::new(config()).await });
    (
        app(router().layer(layer.expect("the layer"))),
        app(router()),
        app(router().layer(GovernorLayer::new(quota()))),
    )
}
