//! Every check of a configuration, for the TOML loader and the builder
//! alike (docs/architecture.md: the one place checks live); each error keeps
//! its message and its place in the file.

use std::collections::HashSet;
use std::time::Duration;

use http::Method;

use super::place::{Place, RulePlaces};
use super::{ConfigError, Heartbeat};
use crate::algorithm::Rule;
use crate::route::Limit;

mod limit;
mod redis;
mod regions;
mod route;
mod settings;
mod shedding;

pub(super) struct Validator<'s> {
    src: &'s str,
    pub(super) limits: Vec<Limit>,
    pub(super) plans: HashSet<String>,
    routes_seen: HashSet<(String, Option<Method>)>,
}

/// The largest capacity or window limit: 2^53, the last integer a double
/// (Lua's only number type) holds exactly.
pub(super) const MAX_COUNT: f64 = 9_007_199_254_740_992.0;

/// The fastest refill: one token per microsecond, the resolution of Redis
/// `TIME`; beyond it a token's period rounds to nothing in the scripts.
pub(super) const MAX_REFILL_PER_SEC: f64 = 1_000_000.0;

/// The longest span (capacity ÷ refill, or a window): 10 years. The lean
/// script answers 4 × (TAT − now) µs as a Redis integer, exact only below
/// 2^53, i.e. spans under 2^51 µs (26 years); TAT = now + span must also stay
/// a double with a sub-µs step. 10 years is a round number well inside both.
pub(super) const MAX_SPAN: Duration = Duration::from_secs(3650 * 86_400);

/// The longest `delay` of `on_exceed = "delay"`: a held request keeps its
/// connection and a place among `max_delayed`.
pub(super) const MAX_DELAY: Duration = Duration::from_secs(60);

/// A concurrency slot's longest hold when the configuration gives none.
pub(crate) const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(60);

/// The longest decision record a limit keeps, in entries and in age: a
/// stream is memory in Redis.
pub(super) const MAX_RECORD_LEN: u64 = 1_000_000;
pub(super) const MAX_RECORD_AGE: Duration = Duration::from_secs(30 * 86_400);

/// The longest `max_hold`: a slot is a request in flight, and a day is far
/// beyond any request (and any timeout in front of one).
pub(super) const MAX_HOLD: Duration = Duration::from_secs(86_400);

/// A count from the configuration as the stores hold it: above 2^53 a
/// double would round it, so it becomes infinity, which `check_rule` rejects
/// instead of accepting a different number.
pub(super) fn exact_count(n: u64) -> f64 {
    if n > 1 << 53 { f64::INFINITY } else { n as f64 }
}

/// `x <= max`, false for NaN: a number that is not one is out of bounds.
fn within(x: f64, max: f64) -> bool {
    x <= max
}

/// A span for an error: exact to the second near the bound, short far off.
fn span_text(secs: f64) -> String {
    let d = secs / 86_400.0;
    if d < 1e6 {
        format!("{secs:.0} s ({d:.1} days)")
    } else {
        format!("{d:.2e} days")
    }
}

impl<'s> Validator<'s> {
    pub(super) fn new(src: &'s str) -> Self {
        Self {
            src,
            limits: Vec::new(),
            plans: HashSet::new(),
            routes_seen: HashSet::new(),
        }
    }

    /// An error at `place` in the file (nowhere for code).
    pub(super) fn err(&self, place: Place, msg: impl Into<String>) -> ConfigError {
        ConfigError::at(self.src, place.span(self.src), msg)
    }

    /// The line and column of `place`, kept for an error found after the
    /// file is gone.
    pub(super) fn position(&self, place: &Place) -> Option<(usize, usize)> {
        super::error::position(self.src, place.span(self.src))
    }

    // The numeric rules, one place for the TOML loader and the builder.

    /// `n`, unless it is zero.
    pub(super) fn at_least_one<T: Copy + Default + PartialEq>(
        &self,
        what: &str,
        n: T,
        at: Place,
    ) -> Result<T, ConfigError> {
        if n == T::default() {
            return Err(self.err(at, format!("{what} must be at least 1")));
        }
        Ok(n)
    }

    /// `d`, if it is whole seconds and at least one: a `Retry-After`.
    pub(super) fn whole_seconds(
        &self,
        what: &str,
        d: Duration,
        at: Place,
    ) -> Result<Duration, ConfigError> {
        if d < Duration::from_secs(1) || d.subsec_nanos() != 0 {
            return Err(self.err(
                at,
                format!(
                    "{what} must be whole seconds, at least 1s (it is sent as Retry-After), not {}",
                    crate::algorithm::duration_text(d)
                ),
            ));
        }
        Ok(d)
    }

    /// `d`, unless it is zero.
    pub(super) fn longer_than_zero(
        &self,
        what: &str,
        d: Duration,
        at: Place,
    ) -> Result<Duration, ConfigError> {
        if d.is_zero() {
            return Err(self.err(at, format!("{what} must be longer than zero")));
        }
        Ok(d)
    }

    /// At most what a TOML duration may say (10^9 s, about 31 years): the
    /// builder takes any `Duration`, and the store adds to these (instants,
    /// PEXPIRE milliseconds), which must not overflow.
    pub(super) fn not_too_long(
        &self,
        what: &str,
        d: Duration,
        at: Place,
    ) -> Result<Duration, ConfigError> {
        if d > Duration::from_secs(super::units::MAX_DURATION_SECS) {
            return Err(self.err(
                at,
                format!(
                    "{what} is too long: at most {} s",
                    super::units::MAX_DURATION_SECS
                ),
            ));
        }
        Ok(d)
    }

    /// Heartbeats every `every`, an instance dead after `dead_after` without one.
    pub(super) fn heartbeat(
        &self,
        every: Duration,
        dead_after: Duration,
        at: Place,
    ) -> Result<Heartbeat, ConfigError> {
        if dead_after <= every {
            return Err(self.err(
                at,
                "dead_after must be longer than heartbeat, or live instances look dead",
            ));
        }
        Ok(Heartbeat { every, dead_after })
    }

    /// The breaker's `window`: longer than the deadline (one late check is
    /// not an outage); unset, 100 ms or 4 × the deadline, the longer.
    pub(super) fn breaker_window(
        &self,
        window: Option<Duration>,
        deadline: Duration,
        at: Place,
    ) -> Result<Duration, ConfigError> {
        match window {
            Some(w) if w <= deadline => Err(self.err(
                at,
                format!(
                    "[breaker] window ({w:?}) must be longer than the deadline ({deadline:?}): \
                     the breaker opens only when checks keep failing for longer than one late check"
                ),
            )),
            Some(w) => Ok(w),
            None => Ok(Duration::from_millis(100).max(deadline.saturating_mul(4))),
        }
    }

    /// Names end up inside Redis keys, so they may not hold `:`, `{` or `}`.
    pub(super) fn check_name(&self, what: &str, name: &str, at: Place) -> Result<(), ConfigError> {
        if crate::key::is_name(name) {
            Ok(())
        } else {
            Err(self.err(
                at,
                format!(
                    "{what} {name:?} must be 1 to 64 characters of letters, digits, '-', '_' or '.'"
                ),
            ))
        }
    }

    /// A rule's numbers: non-zero, and within the bounds both stores carry
    /// exactly (see "Bounds" in docs/configuration.md).
    pub(super) fn check_rule(
        &self,
        limit: &str,
        rule: &Rule,
        at: &RulePlaces,
    ) -> Result<(), ConfigError> {
        let cap = rule.capacity();
        let what = match rule {
            Rule::TokenBucket { .. } => "capacity",
            Rule::Concurrency { .. } => "max_in_flight",
            _ => "limit",
        };
        let bad = |place: &Place, msg: String| {
            Err(self.err(place.clone(), format!("limit {limit:?}: {msg}")))
        };
        if cap < 1.0 {
            return bad(&at.count, format!("{what} must be at least 1"));
        }
        // Counts above 2^53 arrive as infinity (see `exact_count`): Lua's
        // doubles stop counting whole units there.
        if !within(cap, MAX_COUNT) {
            return bad(
                &at.count,
                format!(
                    "{what} must be at most 2^53 = {MAX_COUNT}, the largest count a double holds exactly"
                ),
            );
        }
        match *rule {
            Rule::TokenBucket {
                capacity,
                refill_per_sec,
            } => {
                if !within(refill_per_sec, MAX_REFILL_PER_SEC) {
                    return bad(
                        &at.rate,
                        format!(
                            "refill is {refill_per_sec} tokens per second; at most {MAX_REFILL_PER_SEC} (one token per microsecond, the resolution of Redis's clock)"
                        ),
                    );
                }
                let span_secs = capacity / refill_per_sec;
                if !within(span_secs, MAX_SPAN.as_secs_f64()) {
                    return bad(
                        &at.both,
                        format!(
                            "capacity ÷ refill (the time an empty bucket takes to fill) is {}; at most {} s ({} days, 10 years), \
                             so the Redis script's microsecond arithmetic stays exact",
                            span_text(span_secs),
                            MAX_SPAN.as_secs(),
                            MAX_SPAN.as_secs() / 86_400
                        ),
                    );
                }
            }
            Rule::FixedWindow { window, .. } | Rule::SlidingWindow { window, .. } => {
                if window.as_millis() < 1 {
                    return bad(&at.rate, "window must be at least 1ms".into());
                }
                if window.subsec_nanos() % 1_000_000 != 0 {
                    return bad(
                        &at.rate,
                        "window must be a whole number of milliseconds (Redis counts windows in ms)"
                            .into(),
                    );
                }
                if window > MAX_SPAN {
                    return bad(
                        &at.rate,
                        format!(
                            "window must be at most {} days (10 years)",
                            MAX_SPAN.as_secs() / 86_400
                        ),
                    );
                }
            }
            Rule::Concurrency { max_hold, .. } => {
                if max_hold.as_millis() < 1 || max_hold.subsec_nanos() % 1_000_000 != 0 {
                    return bad(
                        &at.rate,
                        "max_hold must be a whole number of milliseconds, at least 1ms (Redis keeps slots' deadlines in ms)".into(),
                    );
                }
                if max_hold > MAX_HOLD {
                    return bad(
                        &at.rate,
                        format!(
                            "max_hold must be at most {} h (a slot is one request in flight)",
                            MAX_HOLD.as_secs() / 3600
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}
