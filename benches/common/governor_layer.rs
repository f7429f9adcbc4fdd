//! A minimal tower middleware around governor's keyed limiter, the peer
//! `benches/hot_path.rs` and `benches/instructions.rs` compare the layer
//! with: it does the per-request work any HTTP rate limiter must — read
//! the `x-api-key` header, copy it into an owned key, `check_key`, and
//! write the same three `X-RateLimit-*` headers (or answer 429 with
//! `Retry-After`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use axum::body::Body;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use http::header::{HeaderName, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Governor's keyed limiter, reporting the state it decided on (needed for
/// `X-RateLimit-Remaining`).
type GovernorLimiter =
    RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock, StateInformationMiddleware>;

/// A minimal tower layer around governor: what any HTTP limiter must do per
/// request, and nothing more.
#[derive(Clone)]
pub struct GovernorLayer {
    limiter: Arc<GovernorLimiter>,
    clock: DefaultClock,
    /// `X-RateLimit-Limit` never changes: built once.
    limit: HeaderValue,
    /// Nanoseconds to refill one cell.
    per_cell_nanos: u128,
}

impl GovernorLayer {
    pub fn new(quota: Quota) -> Self {
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
pub struct GovernorService<S> {
    inner: S,
    layer: GovernorLayer,
}

pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

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
    pub enum GovernorFuture<F> {
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
