use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::budget::RetryBudget;
use super::service::{HonorLimits, Settings, Shared};

/// Wraps an HTTP client in [`HonorLimits`]: waits out refusals and paces
/// requests when the server says the quota is spent.
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::client::HonorLimitsLayer;
///
/// let layer = HonorLimitsLayer::new()
///     .max_wait(Duration::from_secs(10))
///     .max_retries(2)
///     .jitter(0.2)
///     .retry_budget(5, 0.5, 0.1);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct HonorLimitsLayer {
    settings: Settings,
}

impl Default for HonorLimitsLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl HonorLimitsLayer {
    /// Waits of up to 30 s, 3 retries per request, 10 % jitter, a 1 s wait
    /// for a refusal that names none, and a retry budget of 10 retries,
    /// 1 more a second and 20 % of requests
    /// ([`retry_budget`](Self::retry_budget)`(10, 1.0, 0.2)`).
    pub fn new() -> Self {
        Self {
            settings: Settings {
                max_wait: Duration::from_secs(30),
                max_retries: 3,
                jitter: 0.1,
                default_wait: Duration::from_secs(1),
                budget: RetryBudget::default(),
            },
        }
    }

    /// The longest the layer waits, before a retry or before sending a
    /// paced request. A refusal asking for longer is returned at once; a
    /// request paced for longer is sent without waiting.
    pub fn max_wait(mut self, max: Duration) -> Self {
        self.settings.max_wait = max;
        self
    }

    /// Retries of one request at most (0: never retry, only pace).
    pub fn max_retries(mut self, n: u32) -> Self {
        self.settings.max_retries = n;
        self
    }

    /// Each wait `w` becomes a uniform pick in `w ..= w × (1 + fraction)`,
    /// so clients told the same reset do not all come back at once. Clamped
    /// to `0.0 ..= 1.0`.
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.settings.jitter = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// The wait for a `429`/`503` that carries no `Retry-After` nor any
    /// reset.
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.settings.default_wait = wait;
        self
    }

    /// Retries allowed across all requests of this layer's services: a
    /// token bucket that holds at most `burst` retries (full at start),
    /// refills `per_second`, and gains `ratio` of a retry with each request
    /// sent (tower's retry-budget idea: a client retries at most about
    /// `ratio` of its traffic, plus a small floor). A retry the budget
    /// cannot pay for is not made: the refusal is returned unchanged.
    /// Negative or NaN rates count as 0; `(0, 0.0, 0.0)` never retries
    /// (pacing still applies).
    pub fn retry_budget(mut self, burst: u32, per_second: f64, ratio: f64) -> Self {
        self.settings.budget = RetryBudget::new(burst, per_second, ratio);
        self
    }
}

impl<S> Layer<S> for HonorLimitsLayer {
    type Service = HonorLimits<S>;

    /// Every service made by one layer value shares its pacing and its
    /// budget (clone the service, not the layer, to share them; a second
    /// `layer` call starts afresh).
    fn layer(&self, inner: S) -> Self::Service {
        HonorLimits::new(inner, Arc::new(Shared::new(self.settings)))
    }
}
