//! What a store answers for one request.

pub use crate::algorithm::LimitState;

/// A store's answer for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Every enforced limit had room, and each limit with room was charged.
    /// When `false`, none was charged.
    pub allowed: bool,
    /// One entry per bucket of the [`Check`](crate::store::Check), in order.
    pub limits: Vec<LimitState>,
}

impl Outcome {
    /// The index of the bucket to report in headers: on refusal the
    /// refusing limit that makes the client wait longest, on admission the
    /// one with the least room left relative to its capacity. Limits for
    /// which `shadow(i)` is true never decide a refusal's `Retry-After`.
    #[must_use]
    pub fn reported(&self, shadow: impl Fn(usize) -> bool) -> Option<usize> {
        reported(self.allowed, &self.limits, shadow)
    }
}

/// [`Outcome::reported`] of an outcome held as its parts.
pub(crate) fn reported(
    allowed: bool,
    ls: &[LimitState],
    shadow: impl Fn(usize) -> bool,
) -> Option<usize> {
    let room = |i: usize| ls[i].remaining / ls[i].capacity;
    if allowed {
        (0..ls.len()).min_by(|&a, &b| room(a).total_cmp(&room(b)))
    } else {
        (0..ls.len())
            .filter(|&i| !ls[i].enough && !shadow(i))
            .max_by(|&a, &b| ls[a].wait.total_cmp(&ls[b].wait))
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
            enough: wait == 0.0,
            remaining,
            wait,
            reset: 0.0,
            capacity: 10.0,
        };
        let o = Outcome {
            allowed: true,
            limits: vec![s(5.0, 0.0), s(2.0, 0.0)],
        };
        assert_eq!(o.reported(|_| false), Some(1));
        let o = Outcome {
            allowed: false,
            limits: vec![s(0.0, 9.0), s(0.5, 3.0)],
        };
        assert_eq!(o.reported(|_| false), Some(0));
        assert_eq!(
            o.reported(|i| i == 0),
            Some(1),
            "a shadow limit never sets Retry-After"
        );
    }
}
