//! What a store answers, and what the layer decides from it.

/// A store's answer for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Every limit had enough tokens, and each was charged the cost. When
    /// `false`, none was charged.
    pub allowed: bool,
    /// One entry per bucket of the [`Check`](crate::store::Check), in order.
    pub limits: Vec<LimitState>,
}

/// One bucket's state after a decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimitState {
    /// Tokens left (fractional).
    pub remaining: f64,
    /// Seconds until this bucket holds the request's cost; `0` when it
    /// already does.
    pub wait: f64,
    /// Seconds until this bucket is full again.
    pub reset: f64,
    /// The bucket's capacity.
    pub capacity: f64,
}

impl Outcome {
    /// The index of the bucket to report in headers: on refusal the one
    /// that makes the client wait longest, on admission the one with the
    /// fewest tokens left relative to its capacity.
    #[must_use]
    pub fn reported(&self) -> Option<usize> {
        let by = |f: fn(&LimitState) -> f64| {
            (0..self.limits.len())
                .max_by(|&a, &b| f(&self.limits[a]).total_cmp(&f(&self.limits[b])))
        };
        if self.allowed {
            by(|s| -(s.remaining / s.capacity))
        } else {
            by(|s| s.wait)
        }
    }
}

/// Whole seconds for `Retry-After`: rounded up, and never 0 for a refusal.
#[must_use]
pub(crate) fn retry_after_secs(wait: f64) -> u64 {
    if wait.is_finite() {
        // Saturating cast: a refill so slow it overflows is "a long time".
        (wait.ceil() as u64).max(1)
    } else {
        u64::MAX / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_never_zero() {
        assert_eq!(retry_after_secs(0.0), 1);
        assert_eq!(retry_after_secs(0.06), 1);
        assert_eq!(retry_after_secs(1.0), 1);
        assert_eq!(retry_after_secs(1.01), 2);
    }

    #[test]
    fn reports_the_most_restrictive_bucket() {
        let s = |remaining, wait| LimitState {
            remaining,
            wait,
            reset: 0.0,
            capacity: 10.0,
        };
        let o = Outcome {
            allowed: true,
            limits: vec![s(5.0, 0.0), s(2.0, 0.0)],
        };
        assert_eq!(o.reported(), Some(1));
        let o = Outcome {
            allowed: false,
            limits: vec![s(0.0, 9.0), s(0.5, 3.0)],
        };
        assert_eq!(o.reported(), Some(0));
    }
}
