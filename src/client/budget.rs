//! The retry budget: its settings and its state.

use tokio::time::Instant;

/// How many retries a layer may spend, across requests
/// ([`HonorLimitsLayer::retry_budget`](super::HonorLimitsLayer::retry_budget)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RetryBudget {
    burst: u32,
    per_second: f64,
    ratio: f64,
}

impl RetryBudget {
    /// A budget holding at most `burst` retries (full at start), refilled by
    /// `per_second` and by `ratio` per request. Negative or NaN rates count
    /// as 0.
    pub(crate) fn new(burst: u32, per_second: f64, ratio: f64) -> Self {
        let sane = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
        Self {
            burst,
            per_second: sane(per_second),
            ratio: sane(ratio),
        }
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new(10, 1.0, 0.2)
    }
}

/// What is left of a [`RetryBudget`], shared by a layer's services.
#[derive(Debug)]
pub(super) struct Budget {
    tokens: f64,
    at: Instant,
}

impl Budget {
    pub(super) fn full(b: &RetryBudget) -> Self {
        Self {
            tokens: f64::from(b.burst),
            at: Instant::now(),
        }
    }

    /// Adds the refill since the last call, plus `deposit`, up to `burst`.
    fn refill(&mut self, b: &RetryBudget, deposit: f64) {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * b.per_second + deposit).min(f64::from(b.burst));
        self.at = now;
    }

    /// A request is sent: its share of a retry.
    pub(super) fn deposit(&mut self, b: &RetryBudget) {
        self.refill(b, b.ratio);
    }

    /// Takes one retry, if there is one.
    pub(super) fn withdraw(&mut self, b: &RetryBudget) -> bool {
        self.refill(b, 0.0);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_budget_is_10_retries_1_a_second_and_a_fifth_of_requests() {
        assert_eq!(RetryBudget::default(), RetryBudget::new(10, 1.0, 0.2));
        assert_eq!(
            RetryBudget::new(1, -1.0, f64::NAN),
            RetryBudget::new(1, 0.0, 0.0)
        );
    }
}
