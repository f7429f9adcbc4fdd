//! A limit's numbers (or a plan's override of them) read against its
//! algorithm: which fields belong, and the rule they make.

use std::str::FromStr;

use toml::Spanned;

use crate::algorithm::Rule;
use crate::config::parts::{PlanRule, PlanSpans};
use crate::config::schema::{AlgorithmName, Amount, RawPlanLimit};
use crate::config::validate::{exact_count, fields, RuleSpans, Span, DEFAULT_MAX_HOLD};
use crate::config::{units, ConfigError, Rate};

pub(super) fn parse_at<T, E: std::fmt::Display>(
    source: &str,
    v: &Spanned<String>,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, ConfigError> {
    parse(v.get_ref()).map_err(|e| ConfigError::at(source, Some(v.span()), e.to_string()))
}

pub(super) fn span<T>(v: &Option<Spanned<T>>) -> Span {
    v.as_ref().map(Spanned::span)
}

/// The numbers of a limit (or of its plan override), checked against its
/// algorithm: a token bucket has capacity and refill, a window has limit and
/// window, and nothing else.
pub(super) struct Numbers<'a> {
    pub(super) capacity: &'a Option<Spanned<Amount>>,
    pub(super) refill: &'a Option<Spanned<String>>,
    pub(super) limit: &'a Option<Spanned<Amount>>,
    pub(super) window: &'a Option<Spanned<String>>,
    pub(super) max_in_flight: &'a Option<Spanned<Amount>>,
    pub(super) max_hold: &'a Option<Spanned<String>>,
}

impl Numbers<'_> {
    pub(super) fn rule(
        &self,
        src: &str,
        name: &str,
        alg: AlgorithmName,
        base: Option<&Rule>,
        at: Span,
    ) -> Result<Rule, ConfigError> {
        let forbid =
            |field: &str, s: Span, alg_name: &str| fields::not_for(src, name, field, s, alg_name);
        let need = |field: &str| fields::missing(src, name, field, at.clone());
        if alg != AlgorithmName::Concurrency {
            let what = if alg == AlgorithmName::TokenBucket {
                "token bucket (it is for `algorithm = \"concurrency\"`)"
            } else {
                "window (it is for `algorithm = \"concurrency\"`)"
            };
            forbid("max_in_flight", span(self.max_in_flight), what)?;
            forbid("max_hold", span(self.max_hold), what)?;
        }
        match alg {
            AlgorithmName::Concurrency => self.concurrency(src, name, base, at),
            AlgorithmName::TokenBucket => {
                forbid("limit", span(self.limit), "token bucket (use `capacity`)")?;
                forbid("window", span(self.window), "token bucket (use `refill`)")?;
                let (base_cap, base_rate) = match base {
                    Some(Rule::TokenBucket {
                        capacity,
                        refill_per_sec,
                    }) => (Some(*capacity), Some(*refill_per_sec)),
                    _ => (None, None),
                };
                let capacity = match self.capacity {
                    Some(c) => exact_count(c.get_ref().0),
                    None => base_cap.ok_or_else(|| need("capacity"))?,
                };
                let refill_per_sec = match self.refill {
                    Some(r) => parse_at(src, r, Rate::from_str)?.tokens_per_second(),
                    None => base_rate.ok_or_else(|| need("refill"))?,
                };
                Ok(Rule::TokenBucket {
                    capacity,
                    refill_per_sec,
                })
            }
            AlgorithmName::FixedWindow | AlgorithmName::SlidingWindow => {
                forbid("capacity", span(self.capacity), "window (use `limit`)")?;
                forbid("refill", span(self.refill), "window (use `window`)")?;
                let (base_limit, base_window) = match base {
                    Some(
                        Rule::FixedWindow { limit, window } | Rule::SlidingWindow { limit, window },
                    ) => (Some(*limit), Some(*window)),
                    _ => (None, None),
                };
                let limit = match self.limit {
                    Some(l) => exact_count(l.get_ref().0),
                    None => base_limit.ok_or_else(|| need("limit"))?,
                };
                let window = match self.window {
                    Some(w) => parse_at(src, w, units::parse_duration)?,
                    None => base_window.ok_or_else(|| need("window"))?,
                };
                Ok(if alg == AlgorithmName::FixedWindow {
                    Rule::FixedWindow { limit, window }
                } else {
                    Rule::SlidingWindow { limit, window }
                })
            }
        }
    }

    /// `algorithm = "concurrency"`: `max_in_flight` and `max_hold` (60 s
    /// when unset), nothing of a bucket or a window.
    pub(super) fn concurrency(
        &self,
        src: &str,
        name: &str,
        base: Option<&Rule>,
        at: Span,
    ) -> Result<Rule, ConfigError> {
        for (field, s) in [
            ("capacity", span(self.capacity)),
            ("refill", span(self.refill)),
            ("limit", span(self.limit)),
            ("window", span(self.window)),
        ] {
            let what = "concurrency limit (use `max_in_flight` and `max_hold`)";
            fields::not_for(src, name, field, s, what)?;
        }
        let (base_max, base_hold) = match base {
            Some(Rule::Concurrency {
                max_in_flight,
                max_hold,
            }) => (Some(*max_in_flight), Some(*max_hold)),
            _ => (None, None),
        };
        let max_in_flight = match self.max_in_flight {
            Some(m) => exact_count(m.get_ref().0),
            None => base_max.ok_or_else(|| fields::missing(src, name, "max_in_flight", at))?,
        };
        let max_hold = match self.max_hold {
            Some(h) => parse_at(src, h, units::parse_duration)?,
            None => base_hold.unwrap_or(DEFAULT_MAX_HOLD),
        };
        Ok(Rule::Concurrency {
            max_in_flight,
            max_hold,
        })
    }

    /// Where to point at when the numbers are wrong; `fallback` (the table)
    /// for numbers not written here.
    pub(super) fn spans(&self, fallback: Span) -> RuleSpans {
        RuleSpans {
            count: span(self.capacity)
                .or_else(|| span(self.limit))
                .or_else(|| span(self.max_in_flight)),
            rate: span(self.refill)
                .or_else(|| span(self.window))
                .or_else(|| span(self.max_hold)),
            fallback,
        }
    }
}

pub(super) fn algorithm_of(rule: &Rule) -> AlgorithmName {
    match rule {
        Rule::TokenBucket { .. } => AlgorithmName::TokenBucket,
        Rule::FixedWindow { .. } => AlgorithmName::FixedWindow,
        Rule::SlidingWindow { .. } => AlgorithmName::SlidingWindow,
        Rule::Concurrency { .. } => AlgorithmName::Concurrency,
    }
}

/// `[plans.<plan>.<limit>]`: the numbers it does not give are `base`'s.
pub(super) fn plan_rule(
    src: &str,
    plan: &Spanned<String>,
    limit: &Spanned<String>,
    o: &Spanned<RawPlanLimit>,
    base: &Rule,
) -> Result<PlanRule, ConfigError> {
    let o_span = Some(o.span());
    let o = o.get_ref();
    let numbers = Numbers {
        capacity: &o.capacity,
        refill: &o.refill,
        limit: &o.limit,
        window: &o.window,
        max_in_flight: &o.max_in_flight,
        // A plan changes the number of slots only.
        max_hold: &None,
    };
    let rule = numbers
        .rule(src, limit.get_ref(), algorithm_of(base), Some(base), o_span)
        // Placed at the limit's name in the table header, as always.
        .map_err(|e| ConfigError::at(src, Some(limit.span()), e.message()))?;
    Ok(PlanRule {
        plan: plan.get_ref().clone(),
        rule,
        at: PlanSpans {
            plan: Some(plan.span()),
            limit: Some(limit.span()),
            rule: numbers.spans(Some(limit.span())),
        },
    })
}
