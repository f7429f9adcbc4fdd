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
//!   doing the per-request work any HTTP rate limiter must: read the
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

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use fleetlimit::store::{Bucket, Check, MemoryStore, Rule};
use governor::RateLimiter;
use http::{HeaderValue, StatusCode};
use tower::ServiceExt;

#[path = "common/hot_routers.rs"]
mod hot_routers;

use hot_routers::governor_layer::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
use hot_routers::{HUGE, KEYS, drive, keys, quota, request, routers};

/// The store key the layer builds for an API key of `key-NNNNN` under
/// limit `per-key` (default prefix `rl`; such values are short, printable
/// ASCII, so kept raw rather than hashed).
fn store_key(api_key: &str) -> String {
    format!("rl:per-key:{{h:{api_key}}}")
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

    let (limited, bare, governed) = routers(&rt);
    let quota = quota();

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
