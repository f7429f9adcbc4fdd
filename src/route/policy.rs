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
}

impl Traits {
    pub(crate) fn of(limits: &[Arc<Limit>]) -> Self {
        let any = |f: fn(&Limit) -> bool| limits.iter().any(|l| f(l));
        Self {
            plans: any(|l| !l.plans.is_empty()),
            delays: any(|l| matches!(l.on_exceed, OnExceed::Delay(_))),
            counts_failures: any(|l| l.failures.is_some()),
            escalates: any(Limit::escalates),
        }
    }
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
