//! What applies to one route: its limits, and the traits worked out once
//! from them.

use std::sync::{Arc, OnceLock};

use crate::log_throttle::Throttle;
use crate::shed::Priority;

use super::{FailurePolicy, Limit, OnExceed};

/// What applies to one route.
#[derive(Debug)]
pub(crate) struct Policy {
    pub(crate) limits: Vec<Arc<Limit>>,
    pub(crate) cost: u32,
    pub(crate) on_redis_error: FailurePolicy,
    /// Shadow mode for every limit of the route.
    pub(crate) shadow: bool,
    /// Admitted requests carry a [`Refund`](crate::Refund) handle (opt-in:
    /// building and inserting it was about a fifth of the layer's in-process
    /// cost).
    pub(crate) refund: bool,
    /// The WARN line of its degraded decisions, one a second.
    pub(crate) degraded_log: Throttle,
    /// When its requests are shed (only with `[shedding]`).
    pub(crate) priority: Priority,
    /// Its `RateLimit-Policy` under its limits' own numbers, serialised at
    /// its first response that has it.
    pub(crate) ietf_policy: OnceLock<Option<Arc<http::HeaderValue>>>,
    /// Its decision counters (feature `metrics`).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) metrics: crate::metrics::PolicyMetrics,
    /// What its limits ask of every request, known once.
    pub(crate) traits: Traits,
}

/// What a route's limits need on the request path, worked out when the
/// policy is built rather than scanned for on every request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Traits {
    /// Some limit has plans (the caller's plan is looked up first).
    pub(crate) plans: bool,
    /// Some limit delays instead of refusing (`on_exceed = "delay"`).
    pub(crate) delays: bool,
    /// Some limit counts failures only.
    pub(crate) counts_failures: bool,
    /// Some limit escalates (delays or challenges) instead of refusing.
    pub(crate) escalates: bool,
    /// Decided in place on the in-process store (`pipeline/lone.rs`): one
    /// limit that needs nothing beside its bucket, on a route without
    /// shadow mode or a refund handle.
    pub(crate) lone: bool,
}

impl Traits {
    /// `shadow`, `refund`: the route's own.
    pub(crate) fn of(limits: &[Arc<Limit>], shadow: bool, refund: bool) -> Self {
        let any = |f: fn(&Limit) -> bool| limits.iter().any(|l| f(l));
        Self {
            plans: any(|l| !l.plans.is_empty()),
            delays: any(|l| matches!(l.on_exceed, OnExceed::Delay(_))),
            counts_failures: any(|l| l.failures.is_some()),
            escalates: any(Limit::escalates),
            lone: !shadow && !refund && matches!(limits, [l] if needs_only_its_bucket(l)),
        }
    }
}

/// Whether a limit needs nothing on the request path beside its bucket.
/// Every field is named, so a new one does not compile until someone says
/// whether the in-place path (`pipeline/lone.rs`) can ignore it.
fn needs_only_its_bucket(l: &Limit) -> bool {
    let Limit {
        // Written into the key, as on the general path.
        name: _,
        key_head: _,
        key: _,
        on_missing: _,
        // Decided by the store with the rule.
        rule,
        shadow,
        plans,
        // Leases are taken from Redis only.
        lease: _,
        // What the answers are built from, on both paths.
        refusal_log: _,
        refusal_bodies: _,
        early_log: _,
        failures,
        on_exceed,
        escalation_log: _,
        record,
        // A share of the key's quota is looked up per request.
        global,
    } = l;
    plans.is_empty()
        && global.is_none()
        && !shadow
        && failures.is_none()
        && *on_exceed == OnExceed::Refuse
        && record.is_none()
        && !rule.is_concurrency()
}

impl Policy {
    pub(crate) fn describe(&self) -> String {
        if self.limits.is_empty() {
            return match self.priority {
                Priority::Normal => "not limited".into(),
                p => format!("not limited, priority {}", p.as_str()),
            };
        }
        let names: Vec<&str> = self.limits.iter().map(|l| &*l.name).collect();
        format!(
            "limits [{}], cost {}, on_redis_error {}{}{}",
            names.join(", "),
            self.cost,
            self.on_redis_error,
            if self.shadow { ", shadow" } else { "" },
            if self.refund { ", refund" } else { "" }
        ) + &match self.priority {
            Priority::Normal => String::new(),
            p => format!(", priority {}", p.as_str()),
        }
    }
}
