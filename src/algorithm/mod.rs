//! The rate-limit algorithms, one file each (its arithmetic, its Lua, its
//! TTL rule, the decoder of its stored state), and what they share: the
//! [`Rule`] a limit applies, the [`State`] a key keeps, one key's [`Level`]
//! read at a time, the [`LimitState`] reported, and the all-or-nothing
//! decision of one request over its limits ([`decide`]).
//!
//! The in-process store runs the Rust half; Redis runs `lua/`, in the same
//! steps — `read` (state now, and how much room there is), `write` (charge a
//! cost, or refund a negative one) — on the same state: a token bucket's
//! GCRA arrival time, a window's count. The scripts answer that state as
//! integers, and the Rust half's `report` (remaining, wait, reset) reads it
//! (`Rule::script_answer`), so nothing is formatted in Lua.

mod concurrency;
mod fixed_window;
mod sliding_window;
mod token_bucket;

use std::time::Duration;

pub(crate) use concurrency::Slots;
pub(crate) use token_bucket::{LeanArgs, LEAN};

/// The general script, run by `EVALSHA`: the token bucket's core, then the
/// driver that decides every limit of a request at once, its loops holding
/// one block per algorithm (Redis runs the whole text on every call: blocks
/// cost nothing when unused, where functions and tables would be built).
pub(crate) const SCRIPT: &str = concat!(
    token_bucket::core!(),
    include_str!("../../lua/decide.lua"),
    token_bucket::lua!(),
    fixed_window::lua!(),
    sliding_window::lua!(),
    concurrency::lua!(),
    include_str!("../../lua/decide_end.lua"),
);

/// One bucket's state after a decision (see
/// [`Check`](crate::store::Check) for a whole round).
///
/// ```
/// use fleetlimit::store::LimitState;
///
/// let s = LimitState { enough: true, remaining: 3.5, wait: 0.0, reset: 6.5, capacity: 10.0 };
/// // What `X-RateLimit-Remaining` says: whole units.
/// assert_eq!(s.remaining.floor(), 3.0);
/// ```
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

/// One limit's rule, as the stores apply it.
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::store::Rule;
///
/// let bucket = Rule::TokenBucket { capacity: 50.0, refill_per_sec: 10.0 };
/// let daily = Rule::FixedWindow { limit: 1000.0, window: Duration::from_secs(86_400) };
/// let in_flight = Rule::Concurrency { max_in_flight: 5.0, max_hold: Duration::from_secs(60) };
/// assert_eq!(bucket.capacity(), 50.0);
/// assert_eq!(daily.capacity(), 1000.0);
/// assert!(in_flight.is_concurrency());
/// ```
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
    /// At most `max_in_flight` requests of a key in flight at once, each
    /// slot held until its response is over or for `max_hold` at most. A
    /// request takes one slot whatever its cost.
    Concurrency {
        /// Slots (requests in flight) per key.
        max_in_flight: f64,
        /// The longest a slot counts (an instance that dies holding it).
        max_hold: Duration,
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
            Self::Concurrency { max_in_flight, .. } => max_in_flight,
        }
    }

    /// Whether this is a concurrency limit: one slot per request whatever
    /// its cost, given back by id when the response is over.
    #[must_use]
    pub fn is_concurrency(&self) -> bool {
        matches!(self, Self::Concurrency { .. })
    }

    /// How long a charge of this rule still weighs on its key: a token
    /// bucket's full refill, a fixed window, two sliding windows; `None`
    /// for a concurrency limit (nothing is consumed).
    pub(crate) fn horizon(&self) -> Option<Duration> {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => Some(Duration::from_secs_f64(
                (capacity / refill_per_sec).min(86_400.0 * 366.0 * 10.0),
            )),
            Self::FixedWindow { window, .. } => Some(window),
            Self::SlidingWindow { window, .. } => Some(window * 2),
            Self::Concurrency { .. } => None,
        }
    }

    /// This rule's share for one of `n` instances (the `local` fallback).
    #[must_use]
    pub(crate) fn share(&self, n: u32) -> Self {
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
            // Whole slots: floored, and at least one.
            Self::Concurrency {
                max_in_flight,
                max_hold,
            } => Self::Concurrency {
                max_in_flight: (max_in_flight / n).floor().max(1.0),
                max_hold,
            },
        }
    }

    /// The general script's code and two parameters.
    pub(crate) fn script_args(&self) -> (&'static str, f64, f64) {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => {
                let (p1, p2) = token_bucket::script_args(capacity, refill_per_sec);
                ("t", p1, p2)
            }
            Self::FixedWindow { limit, window } => ("f", limit, window.as_millis() as f64),
            Self::SlidingWindow { limit, window } => ("s", limit, window.as_millis() as f64),
            Self::Concurrency {
                max_in_flight,
                max_hold,
            } => ("c", max_in_flight, max_hold.as_millis() as f64),
        }
    }

    /// How many numbers the general script answers for a limit of this rule.
    pub(crate) fn reply_len(&self) -> usize {
        match self {
            Self::TokenBucket { .. } => 1,
            Self::FixedWindow { .. } => 2,
            Self::SlidingWindow { .. } | Self::Concurrency { .. } => 3,
        }
    }

    /// The limit's state from the general script's numbers for it
    /// ([`reply_len`](Self::reply_len) of them), for a check of `cost`.
    pub(crate) fn script_answer(&self, cost: f64, x: &[f64]) -> LimitState {
        let at = |i: usize| x.get(i).copied().unwrap_or(0.0);
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => token_bucket::script_answer(capacity, refill_per_sec, cost, at(0)),
            Self::FixedWindow { limit, .. } => {
                fixed_window::script_answer(limit, cost, at(0), at(1))
            }
            Self::SlidingWindow { limit, window } => {
                sliding_window::script_answer(limit, window, cost, at(0), at(1), at(2))
            }
            Self::Concurrency {
                max_in_flight,
                max_hold,
            } => concurrency::script_answer(max_in_flight, max_hold, at(0), at(1), at(2)),
        }
    }

    /// The lean script's arguments; `None` for anything but a token bucket
    /// (the general script's work).
    pub(crate) fn lean_args(&self, cost: f64) -> Option<LeanArgs> {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => Some(LeanArgs::new(capacity, refill_per_sec, cost)),
            _ => None,
        }
    }

    /// The longest the scripts let a key of this rule live.
    pub(crate) fn max_ttl(&self) -> Duration {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => token_bucket::max_ttl(capacity, refill_per_sec),
            Self::FixedWindow { window, .. } => fixed_window::max_ttl(window),
            Self::SlidingWindow { window, .. } => sliding_window::max_ttl(window),
            Self::Concurrency { max_hold, .. } => concurrency::max_ttl(max_hold),
        }
    }

    /// A value read from Redis (`None`: no key) at `now_us` on Redis's
    /// clock, for people (the admin tools).
    /// The rule in words, as `describe` and `fleetlimit` print it.
    pub(crate) fn describe(&self) -> String {
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => token_bucket::rule_text(capacity, refill_per_sec),
            Self::FixedWindow { limit, window } => fixed_window::rule_text(limit, window),
            Self::SlidingWindow { limit, window } => sliding_window::rule_text(limit, window),
            Self::Concurrency {
                max_in_flight,
                max_hold,
            } => concurrency::rule_text(max_in_flight, max_hold),
        }
    }

    /// What a stored value (`None`: no key, a full bucket) leaves at
    /// `now_us` on Redis's clock, in tokens or requests, never below zero;
    /// `None` for a value that cannot be read, and for concurrency limits
    /// (a sorted set, not a value).
    pub(crate) fn remaining_stored(&self, raw: Option<&str>, now_us: f64) -> Option<f64> {
        let Some(raw) = raw else {
            return (!self.is_concurrency()).then(|| self.capacity());
        };
        let left = match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => {
                let tat: f64 = raw.trim().parse().ok()?;
                let gcra = token_bucket::Gcra::new(capacity, refill_per_sec);
                gcra.tokens(token_bucket::Gcra::start(Some(tat), now_us) - now_us)
            }
            Self::FixedWindow { limit, .. } => limit - raw.trim().parse::<f64>().ok()?,
            Self::SlidingWindow { limit, window } => {
                let v: Vec<f64> = raw
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?;
                let [idx, curr, prev] = v.as_slice() else {
                    return None;
                };
                let stored = Some((*idx, *curr, *prev));
                sliding_window::Level::read(limit, window, stored, now_us / 1e6).avail()
            }
            Self::Concurrency { .. } => return None,
        };
        Some(left.clamp(0.0, self.capacity()))
    }

    pub(crate) fn describe_stored(&self, raw: Option<&str>, now_us: f64) -> String {
        let Some(raw) = raw else {
            return "no key: a full bucket".into();
        };
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => token_bucket::describe(capacity, refill_per_sec, raw, now_us),
            Self::FixedWindow { limit, .. } => fixed_window::describe(limit, raw),
            Self::SlidingWindow { limit, .. } => sliding_window::describe(limit, raw),
            Self::Concurrency { max_in_flight, .. } => {
                concurrency::describe(max_in_flight, raw, now_us)
            }
        }
    }
}

/// What the in-process store keeps per key: the same as Redis, on the
/// store's own clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum State {
    /// A token bucket's TAT, in µs.
    Tat(f64),
    /// A fixed window's count, and when it closes (seconds).
    Fixed { count: f64, ends: f64 },
    /// A sliding window's index, its count and the previous window's.
    Sliding { idx: f64, curr: f64, prev: f64 },
    /// A concurrency limit's live slots (the in-process store keeps the
    /// slots themselves beside it, to release them by id).
    Slots(Slots),
}

/// One key's state at a time, before and after a charge.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Level {
    TokenBucket(token_bucket::Level),
    FixedWindow(fixed_window::Level),
    SlidingWindow(sliding_window::Level),
    Concurrency(concurrency::Level),
}

impl Level {
    /// `stored` read at `now` (since the store's epoch). A state of another
    /// algorithm (the limit was changed) is a fresh key.
    pub(crate) fn read(rule: Rule, stored: Option<State>, now: Duration) -> Self {
        match rule {
            Rule::TokenBucket {
                capacity,
                refill_per_sec,
            } => {
                let tat = match stored {
                    Some(State::Tat(tat)) => Some(tat),
                    _ => None,
                };
                // µs, exact for whole µs (no u128 → f64 conversion: this is
                // every in-process check's path).
                let now =
                    now.as_secs() as f64 * 1_000_000.0 + f64::from(now.subsec_nanos()) / 1_000.0;
                Self::TokenBucket(token_bucket::Level::read(
                    capacity,
                    refill_per_sec,
                    tat,
                    now,
                ))
            }
            Rule::FixedWindow { limit, window } => {
                let stored = match stored {
                    Some(State::Fixed { count, ends }) => Some((count, ends)),
                    _ => None,
                };
                Self::FixedWindow(fixed_window::Level::read(
                    limit,
                    window,
                    stored,
                    now.as_secs_f64(),
                ))
            }
            Rule::SlidingWindow { limit, window } => {
                let stored = match stored {
                    Some(State::Sliding { idx, curr, prev }) => Some((idx, curr, prev)),
                    _ => None,
                };
                Self::SlidingWindow(sliding_window::Level::read(
                    limit,
                    window,
                    stored,
                    now.as_secs_f64(),
                ))
            }
            Rule::Concurrency {
                max_in_flight,
                max_hold,
            } => {
                let stored = match stored {
                    Some(State::Slots(s)) => Some(s),
                    _ => None,
                };
                Self::Concurrency(concurrency::Level::read(
                    max_in_flight,
                    max_hold,
                    stored,
                    now.as_secs_f64(),
                ))
            }
        }
    }

    /// Whether `cost` fits; a refund always does.
    pub(crate) fn fits(&self, cost: f64) -> bool {
        cost <= 0.0
            || match self {
                Self::TokenBucket(l) => l.fits(cost),
                Self::FixedWindow(l) => l.avail() >= cost,
                Self::SlidingWindow(l) => l.avail() >= cost,
                Self::Concurrency(l) => l.fits(),
            }
    }

    /// Charges `cost` (a negative cost refunds, never past full or zero);
    /// returns the new state and when it is the same as a missing key
    /// (seconds since the store's epoch), so it may be forgotten.
    pub(crate) fn write(&mut self, cost: f64) -> (State, f64) {
        match self {
            Self::TokenBucket(l) => {
                let tat = l.write(cost);
                (State::Tat(tat), tat / 1_000_000.0)
            }
            Self::FixedWindow(l) => {
                let (count, ends) = l.write(cost);
                (State::Fixed { count, ends }, ends)
            }
            Self::SlidingWindow(l) => {
                let ((idx, curr, prev), idle_at) = l.write(cost);
                (State::Sliding { idx, curr, prev }, idle_at)
            }
            Self::Concurrency(l) => {
                let (slots, idle_at) = l.write(cost);
                (State::Slots(slots), idle_at)
            }
        }
    }

    /// The state reported to clients after the decision.
    pub(crate) fn report(&self, cost: f64, enough: bool) -> LimitState {
        match self {
            Self::TokenBucket(l) => l.report(cost, enough),
            Self::FixedWindow(l) => l.report(cost, enough),
            Self::SlidingWindow(l) => l.report(cost, enough),
            Self::Concurrency(l) => l.report(enough),
        }
    }
}

/// One limit of a request, read, then decided by [`decide`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decided {
    level: Level,
    shadow: bool,
    enough: bool,
    /// The state to store and when it may be forgotten, when charged.
    pub(crate) charged: Option<(State, f64)>,
}

impl Decided {
    pub(crate) fn new(level: Level, shadow: bool) -> Self {
        Self {
            level,
            shadow,
            enough: false,
            charged: None,
        }
    }

    /// The state reported to clients.
    pub(crate) fn report(&self, cost: f64) -> LimitState {
        self.level.report(cost, self.enough)
    }
}

/// All or nothing (as `lua/decide.lua`): when every enforced limit has room
/// for `cost`, each limit that has room is charged (a shadow limit without
/// room is not, and never refuses); otherwise none is. Whether the request
/// is allowed.
pub(crate) fn decide(limits: &mut [Decided], cost: f64) -> bool {
    for l in limits.iter_mut() {
        l.enough = l.level.fits(cost);
    }
    let allowed = limits.iter().all(|l| l.enough || l.shadow);
    if allowed {
        for l in limits.iter_mut().filter(|l| l.enough) {
            l.charged = Some(l.level.write(cost));
        }
    }
    allowed
}

/// A duration as a configuration writes it: `"5ms"`, `"60s"`, `"min"`
/// (a bare unit for exactly one of it, as in a rate's `"10/min"`).
pub(crate) fn fmt_duration(d: Duration) -> String {
    match d.as_millis() {
        1000 => "s".into(),
        60_000 => "min".into(),
        3_600_000 => "h".into(),
        86_400_000 => "d".into(),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `fleetlimit top` reads from a stored value, per algorithm.
    #[test]
    fn remaining_of_stored_values() {
        let now = 1_000.0 * 1e6;
        let tb = Rule::TokenBucket {
            capacity: 10.0,
            refill_per_sec: 1.0,
        };
        assert_eq!(tb.remaining_stored(None, now), Some(10.0), "no key: full");
        // The TAT 4 s ahead: 4 of 10 tokens spent.
        let tat = (now + 4e6).to_string();
        assert_eq!(tb.remaining_stored(Some(&tat), now), Some(6.0));
        let past = (now - 1e6).to_string();
        assert_eq!(tb.remaining_stored(Some(&past), now), Some(10.0));
        assert_eq!(tb.remaining_stored(Some("x"), now), None);
        let fw = Rule::FixedWindow {
            limit: 100.0,
            window: Duration::from_secs(60),
        };
        assert_eq!(fw.remaining_stored(Some("12"), now), Some(88.0));
        assert_eq!(
            fw.remaining_stored(Some("120"), now),
            Some(0.0),
            "never below 0"
        );
        let sw = Rule::SlidingWindow {
            limit: 10.0,
            window: Duration::from_secs(10),
        };
        // At t = 1000 s, window 100 just opened: the previous one weighs all.
        assert_eq!(sw.remaining_stored(Some("100 0 4"), now), Some(6.0));
        assert_eq!(sw.remaining_stored(Some("99 4 0"), now), Some(6.0));
        assert_eq!(sw.remaining_stored(Some("1 2"), now), None);
        let c = Rule::Concurrency {
            max_in_flight: 3.0,
            max_hold: Duration::from_secs(30),
        };
        assert_eq!(c.remaining_stored(None, now), None);
    }

    #[test]
    fn all_or_nothing_and_shadow_limits() {
        let tb = |capacity| Rule::TokenBucket {
            capacity,
            refill_per_sec: 1.0,
        };
        let at = Duration::from_secs(1);
        let read = |capacity, shadow| Decided::new(Level::read(tb(capacity), None, at), shadow);
        // The second limit lacks room: neither is charged.
        let mut limits = [read(5.0, false), read(1.0, false)];
        assert!(!decide(&mut limits, 2.0));
        assert!(limits.iter().all(|l| l.charged.is_none()));
        assert_eq!(limits[0].report(2.0).remaining, 5.0);
        // In shadow mode it never refuses, and only the one with room pays.
        let mut limits = [read(5.0, false), read(1.0, true)];
        assert!(decide(&mut limits, 2.0));
        assert!(limits[0].charged.is_some() && limits[1].charged.is_none());
        assert_eq!(limits[0].report(2.0).remaining, 3.0);
        assert!(!limits[1].report(2.0).enough);
        // A refund always has room.
        let mut limits = [read(1.0, false)];
        assert!(decide(&mut limits, -1.0));
    }
}
