//! The in-process hot path, side by side:
//!
//! - `fleetlimit_memory`: an axum `Router` with one route `/`, limited by a
//!   `header:x-api-key` limit on the in-process store
//!   ([`RateLimitLayer::in_memory`]), driven with `oneshot` on a clone of
//!   the router;
//! - `axum_bare`: the same router without the layer (the baseline);
//! - `governor_keyed`: governor's keyed limiter, `check_key` on the same
//!   keys (the in-memory peer).
//!
//! Every limit is huge, so every request is admitted: this measures the
//! cost of deciding, not of refusing. Requests cycle over 10,000 distinct
//! API keys; the cycle carries on across criterion's warm-up and samples,
//! so the measured iterations update existing buckets (the steady state).
//!
//! Run with `cargo bench --bench hot_path`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use fleetlimit::{Config, RateLimitLayer};
use governor::{Quota, RateLimiter};
use http::header::HeaderName;
use http::{HeaderValue, Request, StatusCode};
use tokio::runtime::Runtime;
use tower::ServiceExt;

/// Distinct API keys the requests cycle over.
const KEYS: usize = 10_000;
/// Burst and tokens per second of every limit: nothing is ever refused.
const HUGE: u32 = 1_000_000_000;

static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

fn config() -> Config {
    Config::from_toml_str(&format!(
        r#"
        [limits.per-key]
        key = "header:x-api-key"
        capacity = {HUGE}
        refill = "{HUGE}/s"

        [[routes]]
        path = "/"
        limits = ["per-key"]
        "#
    ))
    .expect("a valid configuration")
}

fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("key-{i:05}")).collect()
}

/// `GET /` with the API key (the default method and URI are `GET /`).
fn request(key: &HeaderValue) -> Request<Body> {
    let mut req = Request::new(Body::empty());
    req.headers_mut().insert(X_API_KEY.clone(), key.clone());
    req
}

/// Sends `iters` requests through `app` inside one `block_on`, cycling over
/// the keys from `*next`, and returns the time they took.
fn drive(
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

fn hot_path(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let keys = keys();
    let header_keys: Vec<HeaderValue> = keys
        .iter()
        .map(|k| HeaderValue::from_str(k).expect("a valid header value"))
        .collect();

    let limited = router().layer(RateLimitLayer::in_memory(&config()));
    let bare = router();

    // The layer really is on the path: an admitted request carries its headers.
    let res = rt
        .block_on(limited.clone().oneshot(request(&header_keys[0])))
        .expect("infallible");
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        res.headers().contains_key("x-ratelimit-remaining"),
        "the layer did not decide"
    );

    let quota = Quota::per_second(NonZeroU32::new(HUGE).expect("non-zero"));
    let governor = RateLimiter::keyed(quota);

    let mut group = c.benchmark_group("hot_path");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    let mut next = 0;
    group.bench_function("fleetlimit_memory", |b| {
        b.iter_custom(|iters| drive(&rt, &limited, &header_keys, &mut next, iters));
    });

    let mut next = 0;
    group.bench_function("axum_bare", |b| {
        b.iter_custom(|iters| drive(&rt, &bare, &header_keys, &mut next, iters));
    });

    let mut next = 0;
    group.bench_function("governor_keyed", |b| {
        b.iter(|| {
            let key = &keys[next % KEYS];
            next += 1;
            assert!(governor.check_key(key).is_ok());
        });
    });

    group.finish();
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
