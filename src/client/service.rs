use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use tokio::time::Instant;
use tower_service::Service;

use super::advice::Advice;
use super::budget::{Budget, RetryBudget};
use crate::sync::lock;

/// Origins whose pacing is remembered at once; a client talking to more
/// servers than this simply paces fewer of them.
const MAX_ORIGINS: usize = 1024;

/// The layer's knobs, shared by every clone of its services.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    pub(super) max_wait: Duration,
    pub(super) max_retries: u32,
    pub(super) jitter: f64,
    pub(super) default_wait: Duration,
    pub(super) budget: RetryBudget,
}

/// An HTTP client that honours the server's rate-limit headers: it waits
/// out `429`/`503` refusals and retries requests that are safe to repeat,
/// and when a response says the quota is spent (remaining 0) it holds the
/// next requests to that origin until the reset. See the
/// [module guide](super) for the rules and an example.
#[derive(Debug, Clone)]
pub struct HonorLimits<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> HonorLimits<S> {
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    /// The wrapped client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// What the clones of one service share: pacing per origin, the retry
/// budget and the jitter source.
#[derive(Debug)]
pub(super) struct Shared {
    settings: Settings,
    /// When each origin may be sent to again.
    paused: Mutex<HashMap<String, Instant>>,
    budget: Mutex<Budget>,
    rng: AtomicU64,
}

impl Shared {
    pub(super) fn new(settings: Settings) -> Self {
        Self {
            settings,
            paused: Mutex::new(HashMap::new()),
            budget: Mutex::new(Budget::full(&settings.budget)),
            rng: AtomicU64::new(RandomState::new().hash_one(0x5eed_u64)),
        }
    }

    fn deposit(&self) {
        lock(&self.budget).deposit(&self.settings.budget);
    }

    fn withdraw(&self) -> bool {
        lock(&self.budget).withdraw(&self.settings.budget)
    }

    /// `wait` stretched by a uniform factor in `1 ..= 1 + jitter`, capped at
    /// the maximum wait.
    fn jittered(&self, wait: Duration) -> Duration {
        // splitmix64: enough spread for jitter, no dependency.
        let mut z = self
            .rng
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        // Checked: a huge advised wait under a huge max_wait must not panic.
        Duration::try_from_secs_f64(wait.as_secs_f64() * (1.0 + self.settings.jitter * unit))
            .unwrap_or(wait)
            .clamp(wait, self.settings.max_wait.max(wait))
    }

    fn pause(&self, origin: &str, wait: Duration) {
        let Some(until) = Instant::now().checked_add(wait) else {
            return;
        };
        let mut paused = lock(&self.paused);
        if paused.len() >= MAX_ORIGINS && !paused.contains_key(origin) {
            let now = Instant::now();
            paused.retain(|_, t| *t > now);
            if paused.len() >= MAX_ORIGINS {
                return;
            }
        }
        let t = paused.entry(origin.to_owned()).or_insert(until);
        *t = (*t).max(until);
    }

    /// How long a request to `origin` should wait before it is sent.
    fn paused_for(&self, origin: &str) -> Option<Duration> {
        let paused = lock(&self.paused);
        let left = paused
            .get(origin)?
            .saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }
}

/// Safe to send twice: an idempotent method (RFC 9110 §9.2.2), or a
/// request that carries an `Idempotency-Key`.
fn retryable<B>(req: &Request<B>) -> bool {
    matches!(
        *req.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    ) || req.headers().contains_key("idempotency-key")
}

/// Pacing is per origin (scheme and authority); requests with a bare path
/// (a service without a host) share one entry.
fn origin<B>(req: &Request<B>) -> String {
    let uri = req.uri();
    match (uri.scheme_str(), uri.authority()) {
        (Some(s), Some(a)) => format!("{s}://{a}"),
        (None, Some(a)) => a.to_string(),
        _ => String::new(),
    }
}

fn refused(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE
}

impl<S, B, ResB> Service<Request<B>> for HonorLimits<S>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: Clone + Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    // Boxed: it waits and retries, an allocation is nothing beside that.
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone that was polled ready serves the first attempt.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let settings = shared.settings;
            let origin = origin(&req);
            // Only a request that may be repeated keeps a copy to repeat.
            let mut spare = retryable(&req).then(|| req.clone());
            let mut req = req;
            shared.deposit();
            let mut retries = 0;
            loop {
                // Readiness is claimed again after any wait: the ready
                // slot of a first attempt may be gone by then.
                let mut waited = retries > 0;
                if let Some(wait) = shared.paused_for(&origin) {
                    // Paced for longer than we may wait: send anyway, and
                    // let the server answer.
                    if wait <= settings.max_wait {
                        tokio::time::sleep(shared.jittered(wait)).await;
                        waited = true;
                    }
                }
                if waited {
                    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                }
                let res = inner.call(req).await?;
                let advice = Advice::read(res.headers());
                let status = res.status();
                let wait = if refused(status) {
                    advice.refusal_wait()
                } else {
                    advice.exhausted_for
                };
                if let Some(w) = wait {
                    shared.pause(&origin, w);
                }
                if !refused(status) || retries >= settings.max_retries {
                    return Ok(res);
                }
                let wait = wait.unwrap_or(settings.default_wait);
                if wait > settings.max_wait || spare.is_none() || !shared.withdraw() {
                    return Ok(res);
                }
                // The last attempt needs no spare.
                let last = retries + 1 >= settings.max_retries;
                let Some(copy) = (if last { spare.take() } else { spare.clone() }) else {
                    return Ok(res);
                };
                req = copy;
                drop(res);
                tokio::time::sleep(shared.jittered(wait)).await;
                retries += 1;
            }
        })
    }
}
