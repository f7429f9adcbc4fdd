//! Validation shared by the TOML loader and the builder.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::{ConfigError, OnMissing};
use crate::algorithm::Rule;
use crate::key::KeySource;
use crate::policy::{Limit, Policy};

pub(super) struct Validator<'s> {
    src: &'s str,
    pub(super) limits: Vec<Limit>,
    pub(super) plans: HashSet<String>,
    routes_seen: HashSet<(String, Option<Method>)>,
}

pub(super) type Span = Option<Range<usize>>;

/// A route's settings besides its limit names, as either front end gives them.
pub(super) struct RouteSettings {
    pub(super) cost: u32,
    /// Where `cost` was written, for its error.
    pub(super) cost_span: Span,
    pub(super) on_redis_error: super::FailurePolicy,
    pub(super) shadow: bool,
    pub(super) refund: bool,
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

    /// The TOML text spans point into (empty for the builder).
    pub(super) fn src(&self) -> &'s str {
        self.src
    }

    pub(super) fn err(&self, span: Span, msg: impl Into<String>) -> ConfigError {
        ConfigError::at(self.src, span, msg)
    }

    // The numeric rules, one place for the TOML loader and the builder.

    /// `n`, unless it is zero.
    pub(super) fn at_least_one<T: Copy + Default + PartialEq>(
        &self,
        what: &str,
        n: T,
        span: Span,
    ) -> Result<T, ConfigError> {
        if n == T::default() {
            return Err(self.err(span, format!("{what} must be at least 1")));
        }
        Ok(n)
    }

    /// `d`, unless it is zero.
    pub(super) fn longer_than_zero(
        &self,
        what: &str,
        d: Duration,
        span: Span,
    ) -> Result<Duration, ConfigError> {
        if d.is_zero() {
            return Err(self.err(span, format!("{what} must be longer than zero")));
        }
        Ok(d)
    }

    /// Heartbeats every `every`, an instance dead after `dead_after` without one.
    pub(super) fn heartbeat(
        &self,
        every: Duration,
        dead_after: Duration,
        span: Span,
    ) -> Result<super::Heartbeat, ConfigError> {
        if dead_after <= every {
            return Err(self.err(
                span,
                "dead_after must be longer than heartbeat, or live instances look dead",
            ));
        }
        Ok(super::Heartbeat { every, dead_after })
    }

    /// The breaker's `window`: longer than the deadline (one late check is
    /// not an outage); unset, 100 ms or 4 × the deadline, the longer.
    pub(super) fn breaker_window(
        &self,
        window: Option<Duration>,
        deadline: Duration,
        span: Span,
    ) -> Result<Duration, ConfigError> {
        match window {
            Some(w) if w <= deadline => Err(self.err(
                span,
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
    pub(super) fn check_name(&self, what: &str, name: &str, span: Span) -> Result<(), ConfigError> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if ok {
            Ok(())
        } else {
            Err(self.err(
                span,
                format!("{what} {name:?} must be 1 to 64 characters of letters, digits, '-', '_' or '.'"),
            ))
        }
    }

    /// A rule's numbers: non-zero, and exact in Lua's doubles.
    pub(super) fn check_rule(
        &self,
        limit: &str,
        rule: &Rule,
        span: Span,
    ) -> Result<(), ConfigError> {
        let cap = rule.capacity();
        let what = match rule {
            Rule::TokenBucket { .. } => "capacity",
            _ => "limit",
        };
        if cap < 1.0 {
            return Err(self.err(span, format!("limit {limit:?}: {what} must be at least 1")));
        }
        // Beyond 2^53 Lua's doubles stop counting whole units exactly.
        if cap > 9_007_199_254_740_992.0 {
            return Err(self.err(
                span,
                format!("limit {limit:?}: {what} must be at most 2^53"),
            ));
        }
        if let Rule::FixedWindow { window, .. } | Rule::SlidingWindow { window, .. } = rule {
            if window.as_millis() < 1 {
                return Err(self.err(
                    span,
                    format!("limit {limit:?}: window must be at least 1ms"),
                ));
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_limit(
        &mut self,
        name: &str,
        name_span: Span,
        key: KeySource,
        on_missing: OnMissing,
        rule: Rule,
        rule_span: Span,
        shadow: bool,
    ) -> Result<(), ConfigError> {
        self.check_name("limit name", name, name_span.clone())?;
        if self.limits.iter().any(|l| &*l.name == name) {
            return Err(self.err(name_span, format!("limit {name:?} is defined twice")));
        }
        self.check_rule(name, &rule, rule_span)?;
        self.limits.push(Limit {
            name: name.into(),
            key,
            on_missing,
            rule,
            shadow,
            plans: HashMap::new(),
            lease: None,
        });
        Ok(())
    }

    /// Hot-key leases for the limit just added (token buckets only).
    pub(super) fn set_lease(
        &mut self,
        batch: u32,
        above: u32,
        span: Span,
    ) -> Result<(), ConfigError> {
        let src = self.src;
        let l = self.limits.last_mut().expect("a limit was just added");
        if !matches!(l.rule, Rule::TokenBucket { .. }) {
            return Err(ConfigError::at(
                src,
                span,
                format!("limit {:?}: leases are for token buckets", l.name),
            ));
        }
        if batch < 2 || f64::from(batch) > l.rule.capacity() {
            return Err(ConfigError::at(
                src,
                span,
                format!(
                    "limit {:?}: lease_batch must be between 2 and the capacity",
                    l.name
                ),
            ));
        }
        l.lease = Some(crate::policy::LeaseConfig { batch, above });
        Ok(())
    }

    /// `[plans.<plan>.<limit>]`: the limit's numbers for callers on `plan`.
    pub(super) fn add_plan_rule(
        &mut self,
        plan: &str,
        plan_span: Span,
        limit: &str,
        limit_span: Span,
        rule: impl FnOnce(&Rule) -> Result<Rule, String>,
    ) -> Result<(), ConfigError> {
        self.check_name("plan name", plan, plan_span)?;
        let Some(i) = self.limits.iter().position(|l| &*l.name == limit) else {
            return Err(self.unknown_limit(
                self.limits.iter().map(|l| &*l.name),
                limit,
                limit_span,
            ));
        };
        let r = rule(&self.limits[i].rule).map_err(|e| self.err(limit_span.clone(), e))?;
        self.check_rule(limit, &r, limit_span)?;
        self.limits[i].plans.insert(plan.into(), r);
        self.plans.insert(plan.to_owned());
        Ok(())
    }

    /// `known`: the limits defined (before or after they are shared).
    fn unknown_limit<'a>(
        &self,
        known: impl Iterator<Item = &'a str>,
        name: &str,
        span: Span,
    ) -> ConfigError {
        let known: Vec<&str> = known.collect();
        self.err(
            span,
            format!("unknown limit {name:?} (defined: {})", known.join(", ")),
        )
    }

    pub(super) fn check_route(
        &mut self,
        path: &str,
        methods: Option<&[Method]>,
        span: Span,
    ) -> Result<(), ConfigError> {
        if !path.starts_with('/') {
            return Err(self.err(span, format!("route path {path:?} must start with '/'")));
        }
        let keys: Vec<Option<Method>> = match methods {
            None => vec![None],
            Some(ms) => ms.iter().cloned().map(Some).collect(),
        };
        for k in keys {
            let label = k.as_ref().map_or("*", Method::as_str).to_owned();
            if !self.routes_seen.insert((path.to_owned(), k)) {
                return Err(self.err(
                    span.clone(),
                    format!("route {label} {path} is listed twice"),
                ));
            }
        }
        Ok(())
    }

    /// Resolves a route's limit names. Call after every limit and plan is in.
    pub(super) fn policy<'n>(
        &self,
        limits: &[Arc<Limit>],
        names: impl Iterator<Item = (&'n str, Span)>,
        route: RouteSettings,
    ) -> Result<Arc<Policy>, ConfigError> {
        let RouteSettings {
            cost,
            cost_span,
            on_redis_error,
            shadow,
            refund,
        } = route;
        if cost == 0 {
            return Err(self.err(cost_span, "cost must be at least 1"));
        }
        let mut picked: Vec<Arc<Limit>> = Vec::new();
        for (name, span) in names {
            let Some(l) = limits.iter().find(|l| &*l.name == name) else {
                return Err(self.unknown_limit(limits.iter().map(|l| &*l.name), name, span));
            };
            let smallest = l
                .plans
                .values()
                .map(Rule::capacity)
                .fold(l.rule.capacity(), f64::min);
            if f64::from(cost) > smallest {
                let holds = if l.plans.is_empty() {
                    format!("capacity {smallest}")
                } else {
                    format!("{smallest} on its smallest plan")
                };
                return Err(self.err(
                    cost_span.clone(),
                    format!("cost {cost} is more than limit {name:?} can ever hold ({holds}); every request would be refused"),
                ));
            }
            if picked.iter().any(|x| Arc::ptr_eq(x, l)) {
                return Err(self.err(span, format!("limit {name:?} is listed twice")));
            }
            picked.push(Arc::clone(l));
        }
        Ok(Arc::new(Policy {
            limits: picked,
            cost,
            on_redis_error,
            shadow,
            refund,
        }))
    }
}
