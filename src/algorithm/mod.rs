//! The arithmetic of each algorithm, shared by the in-process store and the
//! tests. `lua/` holds the same decisions for Redis, in the same steps —
//! `read` (state now, and how much room there is), `write` (charge a cost,
//! or refund a negative one), `report` (remaining, wait, reset) — though
//! not the same state: the Redis token bucket stores its GCRA arrival time,
//! this one tokens and a time.

use std::time::Duration;

/// Slack, in µs of refill, added to a token bucket's burst in Redis. The
/// scripts hold times in µs as doubles near 1.8 × 10^15, which step by ¼ µs
/// (½ µs from 2041): `now + burst` or `TAT + cost × per` is rounded to that
/// step, and a request that fits exactly (cost = capacity on a full bucket)
/// could be refused for ever when the rounding goes up. Half a µs covers a
/// rounding of either step; what it admits early is below Redis's 1 µs clock
/// resolution.
pub(crate) const REDIS_SLACK_US: f64 = 0.5;

/// One limit's rule, as the stores apply it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// Capacity (burst) and refill rate.
    TokenBucket {
        /// Tokens a full bucket holds.
        capacity: f64,
        /// Tokens added per second.
        refill_per_sec: f64,
    },
    /// At most `limit` per window, the window opening with the first request.
    FixedWindow {
        /// Requests (cost units) per window.
        limit: f64,
        /// The window's length.
        window: Duration,
    },
    /// At most about `limit` per sliding window (two weighted counters).
    SlidingWindow {
        /// Requests (cost units) per window.
        limit: f64,
        /// The window's length.
        window: Duration,
    },
}

impl Rule {
    /// The most a key can ever spend at once: the bucket's capacity or the
    /// window's limit (what `X-RateLimit-Limit` says).
    #[must_use]
    pub fn capacity(&self) -> f64 {
        match *self {
            Self::TokenBucket { capacity, .. } => capacity,
            Self::FixedWindow { limit, .. } | Self::SlidingWindow { limit, .. } => limit,
        }
    }

    /// This rule's share for one of `n` instances (the `local` fallback).
    #[must_use]
    pub fn share(&self, n: u32) -> Self {
        let n = f64::from(n.max(1));
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => Self::TokenBucket {
                capacity: capacity / n,
                refill_per_sec: refill_per_sec / n,
            },
            Self::FixedWindow { limit, window } => Self::FixedWindow {
                limit: limit / n,
                window,
            },
            Self::SlidingWindow { limit, window } => Self::SlidingWindow {
                limit: limit / n,
                window,
            },
        }
    }

    /// The script's code and two parameters. A token bucket's capacity
    /// carries [`REDIS_SLACK_US`] of refill more (see there).
    pub(crate) fn script_args(&self) -> (&'static str, f64, f64) {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => (
                "t",
                capacity + REDIS_SLACK_US * refill_per_sec / 1_000_000.0,
                refill_per_sec,
            ),
            Self::FixedWindow { limit, window } => ("f", limit, window.as_millis() as f64),
            Self::SlidingWindow { limit, window } => ("s", limit, window.as_millis() as f64),
        }
    }
}

/// One bucket's state after a decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimitState {
    /// This limit had room for the cost (and was charged if the request was
    /// admitted).
    pub enough: bool,
    /// Room left (fractional): tokens, or the window's limit minus its count.
    pub remaining: f64,
    /// Seconds until this limit has room for the request's cost; `0` when it
    /// already has.
    pub wait: f64,
    /// Seconds until this limit is back to full (empty window).
    pub reset: f64,
    /// The limit's capacity (burst, or the window's limit).
    pub capacity: f64,
}

/// What the in-process store keeps per key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum State {
    Tokens { tokens: f64, at: f64 },
    Fixed { count: f64, ends: f64 },
    Sliding { idx: f64, curr: f64, prev: f64 },
}

/// One key's state at `now`, before and after a charge (times in seconds).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Level {
    rule: Rule,
    state: State,
    now: f64,
}

impl Level {
    pub(crate) fn read(rule: Rule, stored: Option<State>, now: f64) -> Self {
        let state = match (rule, stored) {
            (
                Rule::TokenBucket {
                    capacity,
                    refill_per_sec,
                },
                Some(State::Tokens { tokens, at }),
            ) => State::Tokens {
                tokens: (tokens + (now - at).max(0.0) * refill_per_sec).min(capacity),
                at: now,
            },
            (Rule::TokenBucket { capacity, .. }, _) => State::Tokens {
                tokens: capacity,
                at: now,
            },
            (Rule::FixedWindow { .. }, Some(State::Fixed { count, ends })) if ends > now => {
                State::Fixed { count, ends }
            }
            (Rule::FixedWindow { .. }, _) => State::Fixed {
                count: 0.0,
                ends: f64::NAN,
            },
            (Rule::SlidingWindow { window, .. }, stored) => {
                let w = window.as_secs_f64();
                let idx = (now / w).floor();
                let (curr, prev) = match stored {
                    Some(State::Sliding { idx: s, curr, prev }) if s == idx => (curr, prev),
                    Some(State::Sliding { idx: s, curr, .. }) if s == idx - 1.0 => (0.0, curr),
                    _ => (0.0, 0.0),
                };
                State::Sliding { idx, curr, prev }
            }
        };
        Self { rule, state, now }
    }

    /// Room for a request's cost.
    pub(crate) fn avail(&self) -> f64 {
        self.rule.capacity() - self.used()
    }

    fn used(&self) -> f64 {
        match (self.rule, self.state) {
            (_, State::Tokens { tokens, .. }) => self.rule.capacity() - tokens,
            (_, State::Fixed { count, .. }) => count,
            (Rule::SlidingWindow { window, .. }, State::Sliding { idx, curr, prev }) => {
                let w = window.as_secs_f64();
                let elapsed = self.now - idx * w;
                prev * (w - elapsed) / w + curr
            }
            (_, State::Sliding { curr, .. }) => curr,
        }
    }

    /// Charges `cost` (a negative cost refunds, never past full or zero);
    /// returns the new state and when it may be forgotten.
    pub(crate) fn write(&mut self, cost: f64) -> (State, f64) {
        let now = self.now;
        let idle_at = match (&mut self.state, self.rule) {
            (
                State::Tokens { tokens, .. },
                Rule::TokenBucket {
                    capacity,
                    refill_per_sec,
                },
            ) => {
                *tokens = (*tokens - cost).min(capacity);
                now + (capacity - *tokens) / refill_per_sec
            }
            (State::Fixed { count, ends }, Rule::FixedWindow { window, .. }) => {
                *count = (*count + cost).max(0.0);
                if ends.is_nan() {
                    *ends = now + window.as_secs_f64();
                }
                *ends
            }
            (State::Sliding { idx, curr, .. }, Rule::SlidingWindow { window, .. }) => {
                *curr = (*curr + cost).max(0.0);
                (*idx + 2.0) * window.as_secs_f64()
            }
            _ => unreachable!("state always matches its rule"),
        };
        (self.state, idle_at)
    }

    /// The state reported to clients after the decision.
    pub(crate) fn report(&self, cost: f64, enough: bool) -> LimitState {
        let capacity = self.rule.capacity();
        let remaining = self.avail();
        let (wait, reset) = match (self.rule, self.state) {
            (Rule::TokenBucket { refill_per_sec, .. }, State::Tokens { tokens, .. }) => {
                let wait = if tokens < cost {
                    (cost - tokens) / refill_per_sec
                } else {
                    0.0
                };
                (wait, (capacity - tokens) / refill_per_sec)
            }
            (Rule::FixedWindow { limit, .. }, State::Fixed { count, ends }) => {
                let left = if ends.is_nan() {
                    0.0
                } else {
                    (ends - self.now).max(0.0)
                };
                (if count + cost > limit { left } else { 0.0 }, left)
            }
            (Rule::SlidingWindow { limit, window }, State::Sliding { idx, curr, prev }) => {
                let w = window.as_secs_f64();
                let elapsed = self.now - idx * w;
                let est = self.used();
                let wait = if est + cost <= limit {
                    0.0
                } else if curr + cost <= limit {
                    (w - elapsed) - (limit - curr - cost) * w / prev
                } else if curr > 0.0 {
                    (w - elapsed) + (w * (1.0 - (limit - cost) / curr)).max(0.0)
                } else {
                    // The cost alone exceeds the limit (a local share): the
                    // next window is the best there is.
                    w - elapsed
                };
                let reset = if curr > 0.0 {
                    2.0 * w - elapsed
                } else if prev > 0.0 {
                    w - elapsed
                } else {
                    0.0
                };
                (wait, reset)
            }
            _ => unreachable!("state always matches its rule"),
        };
        LimitState {
            enough,
            remaining,
            wait,
            reset,
            capacity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tb(capacity: f64, refill_per_sec: f64) -> Rule {
        Rule::TokenBucket {
            capacity,
            refill_per_sec,
        }
    }

    #[test]
    fn token_bucket_refill_is_capped_and_waits_are_exact() {
        let r = tb(5.0, 10.0);
        assert_eq!(Level::read(r, None, 100.0).avail(), 5.0);
        let l = Level::read(
            r,
            Some(State::Tokens {
                tokens: 0.0,
                at: 100.0,
            }),
            100.04,
        );
        assert!((l.avail() - 0.4).abs() < 1e-9);
        // The design document's example: 0.4 tokens, cost 1, 10/s → 0.06 s.
        assert!((l.report(1.0, false).wait - 0.06).abs() < 1e-9);
        assert_eq!(
            Level::read(
                r,
                Some(State::Tokens {
                    tokens: 0.0,
                    at: 100.0
                }),
                200.0
            )
            .avail(),
            5.0
        );
        // A clock that steps backwards refills nothing.
        assert_eq!(
            Level::read(
                r,
                Some(State::Tokens {
                    tokens: 1.0,
                    at: 100.0
                }),
                99.0
            )
            .avail(),
            1.0
        );
        // A refund never overfills.
        let mut l = Level::read(
            r,
            Some(State::Tokens {
                tokens: 4.0,
                at: 100.0,
            }),
            100.0,
        );
        l.write(-3.0);
        assert_eq!(l.avail(), 5.0);
    }

    #[test]
    fn fixed_window_opens_with_the_first_request() {
        let r = Rule::FixedWindow {
            limit: 3.0,
            window: Duration::from_secs(60),
        };
        let mut l = Level::read(r, None, 10.0);
        let (s, ends) = l.write(1.0);
        assert_eq!(ends, 70.0);
        let l = Level::read(r, Some(s), 30.0);
        assert_eq!(l.avail(), 2.0);
        assert_eq!(l.report(3.0, false).wait, 40.0);
        assert_eq!(
            Level::read(r, Some(s), 70.0).avail(),
            3.0,
            "closed at its expiry"
        );
    }

    #[test]
    fn sliding_window_weights_the_previous_window() {
        let r = Rule::SlidingWindow {
            limit: 10.0,
            window: Duration::from_secs(10),
        };
        // 10 in window [0, 10), then at t = 12.5 the previous weighs 75%.
        let s = State::Sliding {
            idx: 0.0,
            curr: 10.0,
            prev: 0.0,
        };
        let l = Level::read(r, Some(s), 12.5);
        assert!((l.avail() - 2.5).abs() < 1e-9);
        // 3 does not fit: the previous window must fade to 7, at t = 13.
        assert!((l.report(3.0, false).wait - 0.5).abs() < 1e-9);
    }
}
