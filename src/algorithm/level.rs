//! One key's [`Level`] read at a time, before and after a charge, and the
//! all-or-nothing decision of one request over its limits ([`decide`]).

use std::time::Duration;

use super::{LimitState, Rule, State, concurrency, fixed_window, sliding_window, token_bucket};

/// One key's state at a time, before and after a charge.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Level {
    TokenBucket(token_bucket::Tokens),
    FixedWindow(fixed_window::Window),
    SlidingWindow(sliding_window::Estimate),
    Concurrency(concurrency::Held),
}

impl Level {
    /// `stored` read at `now` (since the store's epoch). A state of another
    /// algorithm (the limit was changed) is a fresh key.
    #[inline]
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
                Self::TokenBucket(token_bucket::Tokens::read(
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
                Self::FixedWindow(fixed_window::Window::read(
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
                Self::SlidingWindow(sliding_window::Estimate::read(
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
                Self::Concurrency(concurrency::Held::read(
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
pub(crate) struct LimitCheck {
    level: Level,
    shadow: bool,
    enough: bool,
    /// The state to store and when it may be forgotten, when charged.
    pub(crate) charged: Option<(State, f64)>,
}

impl LimitCheck {
    pub(crate) fn new(level: Level, shadow: bool) -> Self {
        Self {
            level,
            shadow,
            enough: false,
            charged: None,
        }
    }

    /// The state reported to clients.
    #[inline]
    pub(crate) fn report(&self, cost: f64) -> LimitState {
        self.level.report(cost, self.enough)
    }
}

/// All or nothing (as `lua/decide.lua`): when every enforced limit has room
/// for `cost`, each limit that has room is charged (a shadow limit without
/// room is not, and never refuses); otherwise none is. Whether the request
/// is allowed.
#[inline]
pub(crate) fn decide(limits: &mut [LimitCheck], cost: f64) -> bool {
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
