//! Routes checked: their paths, methods and policies, and the limits they
//! name.

use std::sync::Arc;

use http::Method;

use super::*;
use crate::algorithm::Rule;
use crate::config::limit::Mode;
use crate::config::{ConfigError, RouteConfig};
use crate::route::{FailurePolicy, Limit, OnExceed, Policy};

/// Units a request takes when its route gives no `cost`.
const DEFAULT_COST: u32 = 1;

impl Validator<'_> {
    pub(in crate::config) fn check_route(
        &mut self,
        path: &str,
        methods: Option<&[Method]>,
        at: Place,
    ) -> Result<(), ConfigError> {
        if !path.starts_with('/') {
            return Err(self.err(at, format!("route path {path:?} must start with '/'")));
        }
        let keys: Vec<Option<Method>> = match methods {
            None => vec![None],
            Some(ms) => ms.iter().cloned().map(Some).collect(),
        };
        for k in keys {
            let label = k.as_ref().map_or("*", Method::as_str).to_owned();
            if !self.routes_seen.insert((path.to_owned(), k)) {
                return Err(self.err(at.clone(), format!("route {label} {path} is listed twice")));
            }
        }
        Ok(())
    }

    /// Route `r` (written at `at`) compiled into its policy, its limit names
    /// resolved. Call after every limit and plan is in. `label`: the route
    /// template (`default` for the default policy), its metrics' `route`
    /// label.
    pub(in crate::config) fn policy(
        &self,
        limits: &[Arc<Limit>],
        r: &RouteConfig,
        at: &Place,
        label: &str,
    ) -> Result<Arc<Policy>, ConfigError> {
        let cost = r.cost.unwrap_or(DEFAULT_COST);
        let cost_at = at.field("cost");
        let (shadow, refund) = (r.mode == Mode::Shadow, r.refund);
        if cost == 0 {
            return Err(self.err(cost_at, "cost must be at least 1"));
        }
        let mut picked: Vec<Arc<Limit>> = Vec::new();
        for (j, name) in r.limits.iter().enumerate() {
            let span = at.field("limits").field(&j.to_string());
            let Some(l) = limits.iter().find(|l| *l.name == **name) else {
                let known = limits.iter().map(|l| &*l.name);
                return Err(self.unknown_limit(known, name, span));
            };
            let smallest = l
                .plans
                .values()
                .map(Rule::capacity)
                .fold(l.rule.capacity(), f64::min);
            // A concurrency limit takes one slot whatever the cost.
            if f64::from(cost) > smallest && !l.rule.is_concurrency() {
                let holds = if l.plans.is_empty() {
                    format!("capacity {smallest}")
                } else {
                    format!("{smallest} on its smallest plan")
                };
                return Err(self.err(
                    cost_at.clone(),
                    format!("cost {cost} is more than limit {name:?} can ever hold ({holds}); every request would be refused"),
                ));
            }
            if picked.iter().any(|x| Arc::ptr_eq(x, l)) {
                return Err(self.err(span, format!("limit {name:?} is listed twice")));
            }
            let delays = |x: &Limit| matches!(x.on_exceed, OnExceed::Delay(_));
            let slots_and_delay = |a: &Limit, b: &Limit| a.rule.is_concurrency() && delays(b);
            if picked
                .iter()
                .any(|x| slots_and_delay(x, l) || slots_and_delay(l, x))
            {
                return Err(self.err(
                    span,
                    format!(
                        "limit {name:?}: a route cannot have both a concurrency limit and a limit \
                         that delays (on_exceed = \"delay\"): a delayed request would hold its \
                         slot while it waits"
                    ),
                ));
            }
            picked.push(Arc::clone(l));
        }
        Ok(Arc::new(Policy {
            traits: crate::route::Traits::of(&picked),
            limits: picked,
            cost,
            on_redis_error: r.on_redis_error.unwrap_or(FailurePolicy::Open),
            shadow,
            refund,
            degraded_log: Default::default(),
            priority: r.priority,
            ietf_policy: Default::default(),
            metrics: crate::metrics::PolicyMetrics::new(label),
        }))
    }
}

impl Validator<'_> {
    /// A limit name that is not among `known` (the limits defined).
    pub(super) fn unknown_limit<'a>(
        &self,
        known: impl Iterator<Item = &'a str>,
        name: &str,
        at: Place,
    ) -> ConfigError {
        let known: Vec<&str> = known.collect();
        self.err(
            at,
            format!("unknown limit {name:?} (defined: {})", known.join(", ")),
        )
    }
}
