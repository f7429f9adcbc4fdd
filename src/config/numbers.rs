//! A limit's numbers (or a plan's override of them), read against its
//! algorithm: which fields belong, and the rule they make.

use std::time::Duration;

use serde::Deserialize;

use super::de::{self, Amount};
use super::place::Place;
use super::validate::{DEFAULT_MAX_HOLD, Validator, exact_count};
use super::{ConfigError, Rate};
use crate::algorithm::Rule;

/// A limit's `algorithm`.
#[derive(Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Algorithm {
    #[default]
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    Concurrency,
}

/// The numbers of a limit, or of a plan (`[plans.<plan>.<limit>]`): those
/// not given are the limit's.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Numbers {
    /// From code, the plan's own (it must be the limit's); a file's plan
    /// has the limit's.
    #[serde(skip)]
    pub(super) algorithm: Option<Algorithm>,
    pub(super) capacity: Option<Amount>,
    #[serde(default, deserialize_with = "de::some_text")]
    pub(super) refill: Option<Rate>,
    pub(super) limit: Option<Amount>,
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) window: Option<Duration>,
    pub(super) max_in_flight: Option<Amount>,
    /// A file's plan changes the number of slots only.
    #[serde(skip)]
    pub(super) max_hold: Option<Duration>,
}

impl Numbers {
    /// The rule of limit `name` these numbers make for `alg`, the numbers
    /// not given taken from `base` (a plan's limit). `at` places an error:
    /// at a field written, or (`None`) at the table.
    pub(super) fn rule(
        &self,
        v: &Validator<'_>,
        name: &str,
        alg: Algorithm,
        base: Option<&Rule>,
        at: impl Fn(Option<&str>) -> Place,
    ) -> Result<Rule, ConfigError> {
        let forbid = |field: &str, written: bool, what: &str| {
            if written {
                let m = format!("limit {name:?}: `{field}` does not apply to a {what}");
                return Err(v.err(at(Some(field)), m));
            }
            Ok(())
        };
        let need = |field: &str| v.err(at(None), format!("limit {name:?}: missing `{field}`"));
        if alg != Algorithm::Concurrency {
            let what = if alg == Algorithm::TokenBucket {
                "token bucket (it is for `algorithm = \"concurrency\"`)"
            } else {
                "window (it is for `algorithm = \"concurrency\"`)"
            };
            forbid("max_in_flight", self.max_in_flight.is_some(), what)?;
            forbid("max_hold", self.max_hold.is_some(), what)?;
        }
        match alg {
            Algorithm::Concurrency => {
                let what = "concurrency limit (use `max_in_flight` and `max_hold`)";
                forbid("capacity", self.capacity.is_some(), what)?;
                forbid("refill", self.refill.is_some(), what)?;
                forbid("limit", self.limit.is_some(), what)?;
                forbid("window", self.window.is_some(), what)?;
                let (base_max, base_hold) = match base {
                    Some(Rule::Concurrency {
                        max_in_flight,
                        max_hold,
                    }) => (Some(*max_in_flight), Some(*max_hold)),
                    _ => (None, None),
                };
                let max_in_flight = match self.max_in_flight {
                    Some(m) => exact_count(m.0),
                    None => base_max.ok_or_else(|| need("max_in_flight"))?,
                };
                let max_hold = (self.max_hold.or(base_hold)).unwrap_or(DEFAULT_MAX_HOLD);
                Ok(Rule::Concurrency {
                    max_in_flight,
                    max_hold,
                })
            }
            Algorithm::TokenBucket => {
                forbid(
                    "limit",
                    self.limit.is_some(),
                    "token bucket (use `capacity`)",
                )?;
                forbid(
                    "window",
                    self.window.is_some(),
                    "token bucket (use `refill`)",
                )?;
                let (base_cap, base_rate) = match base {
                    Some(Rule::TokenBucket {
                        capacity,
                        refill_per_sec,
                    }) => (Some(*capacity), Some(*refill_per_sec)),
                    _ => (None, None),
                };
                let capacity = match self.capacity {
                    Some(c) => exact_count(c.0),
                    None => base_cap.ok_or_else(|| need("capacity"))?,
                };
                let refill_per_sec = match self.refill {
                    Some(r) => r.tokens_per_second(),
                    None => base_rate.ok_or_else(|| need("refill"))?,
                };
                Ok(Rule::TokenBucket {
                    capacity,
                    refill_per_sec,
                })
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                forbid("capacity", self.capacity.is_some(), "window (use `limit`)")?;
                forbid("refill", self.refill.is_some(), "window (use `window`)")?;
                let (base_limit, base_window) = match base {
                    Some(
                        Rule::FixedWindow { limit, window } | Rule::SlidingWindow { limit, window },
                    ) => (Some(*limit), Some(*window)),
                    _ => (None, None),
                };
                let limit = match self.limit {
                    Some(l) => exact_count(l.0),
                    None => base_limit.ok_or_else(|| need("limit"))?,
                };
                let window = match self.window.or(base_window) {
                    Some(w) => w,
                    None => return Err(need("window")),
                };
                Ok(if alg == Algorithm::FixedWindow {
                    Rule::FixedWindow { limit, window }
                } else {
                    Rule::SlidingWindow { limit, window }
                })
            }
        }
    }
}

/// The algorithm of `rule`.
pub(super) fn algorithm_of(rule: &Rule) -> Algorithm {
    match rule {
        Rule::TokenBucket { .. } => Algorithm::TokenBucket,
        Rule::FixedWindow { .. } => Algorithm::FixedWindow,
        Rule::SlidingWindow { .. } => Algorithm::SlidingWindow,
        Rule::Concurrency { .. } => Algorithm::Concurrency,
    }
}
