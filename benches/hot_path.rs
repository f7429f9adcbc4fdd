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

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use fleetlimit::store::{Bucket, Check, MemoryStore, Rule};
use fleetlimit::{Config, RateLimitLayer};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use http::header::{HeaderName, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt};

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

/// Governor's keyed limiter, reporting the state it decided on (needed for
/// `X-RateLimit-Remaining`).
type GovernorLimiter =
    RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock, StateInformationMiddleware>;

/// A minimal tower layer around governor: what any HTTP limiter must do per
/// request, and nothing more.
#[derive(Clone)]
struct GovernorLayer {
    limiter: Arc<GovernorLimiter>,
    clock: DefaultClock,
    /// `X-RateLimit-Limit` never changes: built once.
    limit: HeaderValue,
    /// Nanoseconds to refill one cell.
    per_cell_nanos: u128,
}

impl GovernorLayer {
    fn new(quota: Quota) -> Self {
        Self {
            limiter: Arc::new(RateLimiter::keyed(quota).with_middleware()),
            clock: DefaultClock::default(),
            limit: HeaderValue::from(quota.burst_size().get()),
            per_cell_nanos: quota.replenish_interval().as_nanos(),
        }
    }
}

impl<S> Layer<S> for GovernorLayer {
    type Service = GovernorService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GovernorService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
struct GovernorService<S> {
    inner: S,
    layer: GovernorLayer,
}

static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Small numbers' header values built once and shared, as fleetlimit does.
fn number(n: u64) -> HeaderValue {
    const CACHED: u64 = 1024;
    static VALUES: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    if n < CACHED {
        let values = VALUES.get_or_init(|| (0..CACHED).map(HeaderValue::from).collect());
        values[n as usize].clone()
    } else {
        HeaderValue::from(n)
    }
}

impl<S> Service<Request<Body>> for GovernorService<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = GovernorFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let l = &self.layer;
        // A missing or non-UTF-8 key: 401, as fleetlimit's `on_missing = "reject"`.
        let Some(key) = req
            .headers()
            .get(&X_API_KEY)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
        else {
            let mut res = Response::new(Body::empty());
            *res.status_mut() = StatusCode::UNAUTHORIZED;
            return GovernorFuture::Answer { res: Some(res) };
        };
        match l.limiter.check_key(&key.to_owned()) {
            Ok(state) => {
                let remaining = state.remaining_burst_capacity();
                let spent = u128::from(state.quota().burst_size().get() - remaining);
                let reset = (spent * l.per_cell_nanos).div_ceil(1_000_000_000) as u64;
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                GovernorFuture::Serving {
                    future: inner.call(req),
                    headers: Some([l.limit.clone(), number(u64::from(remaining)), number(reset)]),
                }
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(l.clock.now());
                let mut res = Response::new(Body::from("rate limit exceeded"));
                *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                let h = res.headers_mut();
                h.insert(
                    RETRY_AFTER,
                    number(wait.as_secs_f64().ceil().max(1.0) as u64),
                );
                h.insert(X_RATELIMIT_LIMIT.clone(), l.limit.clone());
                h.insert(X_RATELIMIT_REMAINING.clone(), number(0));
                h.insert(
                    X_RATELIMIT_RESET.clone(),
                    number(wait.as_secs_f64().ceil() as u64),
                );
                GovernorFuture::Answer { res: Some(res) }
            }
        }
    }
}

pin_project! {
    /// The inner service's future with the headers to add, or an answer.
    #[project = GovernorProj]
    enum GovernorFuture<F> {
        Serving {
            #[pin]
            future: F,
            headers: Option<[HeaderValue; 3]>,
        },
        Answer { res: Option<Response<Body>> },
    }
}

impl<F, E> Future for GovernorFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            GovernorProj::Serving { future, headers } => {
                let mut res = std::task::ready!(future.poll(cx))?;
                if let Some([limit, remaining, reset]) = headers.take() {
                    let h = res.headers_mut();
                    h.insert(X_RATELIMIT_LIMIT.clone(), limit);
                    h.insert(X_RATELIMIT_REMAINING.clone(), remaining);
                    h.insert(X_RATELIMIT_RESET.clone(), reset);
                }
                Poll::Ready(Ok(res))
            }
            GovernorProj::Answer { res } => {
                Poll::Ready(Ok(res.take().expect("polled after completion")))
            }
        }
    }
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
