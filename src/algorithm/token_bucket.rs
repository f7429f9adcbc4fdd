//! Token bucket: capacity B, refill r tokens per second, cost c.
//!
//! `tokens = min(B, tokens + elapsed × r)`; admit when `tokens ≥ c` and take
//! `c`; otherwise the wait is `(c − tokens) ÷ r`. A bucket never seen is
//! full. This mirrors `lua/token_bucket.lua` line for line.

use crate::outcome::LimitState;

/// One bucket's parameters.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TokenBucket {
    pub(crate) capacity: f64,
    pub(crate) rate: f64,
}

impl TokenBucket {
    /// Tokens at `now` (seconds) for a bucket that held `tokens` at `at`.
    pub(crate) fn level(&self, stored: Option<(f64, f64)>, now: f64) -> f64 {
        match stored {
            None => self.capacity,
            Some((tokens, at)) => (tokens + (now - at).max(0.0) * self.rate).min(self.capacity),
        }
    }

    /// Seconds from a level to a full bucket.
    pub(crate) fn time_to_full(&self, tokens: f64) -> f64 {
        (self.capacity - tokens).max(0.0) / self.rate
    }

    /// The reported state at `level` tokens (after any charge).
    pub(crate) fn state(&self, level: f64, cost: f64, allowed: bool) -> LimitState {
        let wait = if !allowed && level < cost {
            (cost - level) / self.rate
        } else {
            0.0
        };
        LimitState {
            remaining: level,
            wait,
            reset: self.time_to_full(level),
            capacity: self.capacity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refill_is_capped_and_waits_are_exact() {
        let b = TokenBucket {
            capacity: 5.0,
            rate: 10.0,
        };
        assert_eq!(b.level(None, 100.0), 5.0);
        assert!((b.level(Some((0.0, 100.0)), 100.04) - 0.4).abs() < 1e-9);
        assert_eq!(b.level(Some((0.0, 100.0)), 200.0), 5.0);
        // The design document's example: 0.4 tokens, cost 1, 10/s → 0.06 s.
        let s = b.state(0.4, 1.0, false);
        assert!((s.wait - 0.06).abs() < 1e-12);
        assert_eq!(b.state(3.0, 1.0, true).wait, 0.0);
        // A clock that steps backwards refills nothing.
        assert_eq!(b.level(Some((1.0, 100.0)), 99.0), 1.0);
    }
}
