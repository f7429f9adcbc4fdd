//! The in-process hot path, side by side:
//!
//! - `fleetlimit_memory`: an axum `Router` with one route `/`, limited by a
//!   `header:x-api-key` limit on the in-process store
//!   ([`RateLimitLayer::in_memory`]), driven with `oneshot` on a clone of
//!   the router;
//! - `axum_bare`: the same router without the layer (the baseline);
//! - `governor_keyed`: governor's keyed limiter, `check_key` on the same
//!   keys (the in-memory peer);
//! - `governor_layer`: the same router as `fleetlimit_memory`, behind a
//!   minimal hand-written tower middleware around governor's keyed limiter
//!   (`benches/common/governor_layer.rs`) doing the per-request work any HTTP rate limiter must: read the
//!   `x-api-key` header, copy it into an owned key, `check_key`, and write
//!   the same three `X-RateLimit-*` headers (or answer 429 with
//!   `Retry-After`). Compare `fleetlimit_memory − axum_bare` with
//!   `governor_layer − axum_bare`;
//! - `fleetlimit_store_check`: fleetlimit's in-process store deciding one
//!   prebuilt bucket ([`MemoryStore::check_one`], what the layer calls for a
//!   route with one limit) for the store key the layer builds from the same
//!   API keys, cycling like `governor_keyed`: the decision alone, next to
//!   governor's `check_key`.
//!
//! The three routers get their handlers turned into routes once
//! (`Router::with_state`), as `axum::serve` does; each request is sent with
//! `oneshot` on a clone of the router, on a current-thread runtime.
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
use fleetlimit::store::{Bucket, Check, MemoryStore, Rule};
use fleetlimit::{Config, RateLimitLayer};
use governor::{Quota, RateLimiter};
use http::header::HeaderName;
use http::{HeaderValue, Request, StatusCode};
use tokio::runtime::Runtime;
use tower::ServiceExt;

// The governor middleware, shared with benches/instructions.rs.
#[path = "common/governor_layer.rs"]
mod governor_layer;
use governor_layer::{GovernorLayer, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};

/// Distinct API keys the requests cycle over.
const KEYS: usize = 10_000;
/// Burst and tokens per second of every limit: nothing is ever refused.
/// (The configuration's refill is 10^6/s, the most it accepts.)
const HUGE: u32 = 1_000_000_000;

static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

fn config() -> Config {
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
fn app(router: Router) -> Router {
    router.with_state(())
}

fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("key-{i:05}")).collect()
}

/// The store key the layer builds for an API key of `key-NNNNN` under
/// limit `per-key` (default prefix `rl`; such values are short, printable
/// ASCII, so kept raw rather than hashed).
fn store_key(api_key: &str) -> String {
    format!("rl:per-key:{{h:{api_key}}}")
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

    let limited = app(router().layer(RateLimitLayer::in_memory(&config())));
    let bare = app(router());
    let quota = Quota::per_second(NonZeroU32::new(HUGE).expect("non-zero"));
    let governed = app(router().layer(GovernorLayer::new(quota)));

    // The layer really is on the path: an admitted request carries its headers.
    let res = rt
        .block_on(limited.clone().oneshot(request(&header_keys[0])))
        .expect("infallible");
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        res.headers().contains_key("x-ratelimit-remaining"),
        "the layer did not decide"
    );
    let res = rt
        .block_on(governed.clone().oneshot(request(&header_keys[0])))
        .expect("infallible");
    assert_eq!(res.status(), StatusCode::OK);
    for h in [
        &X_RATELIMIT_LIMIT,
        &X_RATELIMIT_REMAINING,
        &X_RATELIMIT_RESET,
    ] {
        assert!(res.headers().contains_key(h), "governor_layer: no {h}");
    }

    let governor = RateLimiter::keyed(quota);

    // One prebuilt check per key: the same bucket rule as the `per-key` limit.
    // The default `[memory] max_keys`, as `RateLimitLayer::in_memory` uses.
    let store = MemoryStore::new(100_000);
    let checks: Vec<Check> = keys
        .iter()
        .map(|k| Check {
            slot: None,
            cost: 1.0,
            buckets: vec![Bucket {
                key: store_key(k),
                rule: Rule::TokenBucket {
                    capacity: f64::from(HUGE),
                    refill_per_sec: f64::from(HUGE),
                },
                shadow: false,
            }],
        })
        .collect();

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

    let mut next = 0;
    group.bench_function("governor_layer", |b| {
        b.iter_custom(|iters| drive(&rt, &governed, &header_keys, &mut next, iters));
    });

    let mut next = 0;
    group.bench_function("fleetlimit_store_check", |b| {
        b.iter(|| {
            let check = &checks[next % KEYS];
            next += 1;
            assert!(store.check_one(&check.buckets[0], check.cost).0);
        });
    });

    group.finish();
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
