//! A route's plan: everything about a route that does not depend on the
//! request, compiled once per configuration (not to be confused with a
//! caller's pricing plan, `crate::plan`, which it may look up).

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::answer::{HeaderStyle, RefusalHook};
use crate::plan::Plans;
use crate::route::{Limit, Policy};

/// What the steps need of a route, worked out when the configuration is
/// compiled (see the module guide in `mod.rs`).
pub(crate) struct RoutePlan {
    /// Its limits, cost, failure policy, modes and counters.
    pub(super) policy: Arc<Policy>,
    /// `[headers] style`.
    pub(super) header_style: HeaderStyle,
    /// The application's refusal hook, handed to a handler's challenge.
    pub(super) on_refusal: Option<RefusalHook>,
    /// The callers' plans, when some limit has plans.
    pub(super) plans: Option<Arc<Plans>>,
    /// Some limit counts requests in flight: the check carries a slot id.
    pub(super) slots: bool,
    /// Some limit is global: its bucket is this region's share.
    pub(super) global: bool,
    /// Places for requests held by `on_exceed = "delay"`, when some limit
    /// delays.
    pub(super) delayed: Option<Arc<Semaphore>>,
}

impl RoutePlan {
    pub(super) fn new(
        policy: &Arc<Policy>,
        header_style: HeaderStyle,
        on_refusal: Option<RefusalHook>,
        plans: &Arc<Plans>,
        delayed: &Arc<Semaphore>,
    ) -> Self {
        let t = policy.traits;
        Self {
            policy: Arc::clone(policy),
            header_style,
            on_refusal,
            plans: t.plans.then(|| Arc::clone(plans)),
            slots: policy.limits.iter().any(|l| l.rule.is_concurrency()),
            global: policy.limits.iter().any(|l| l.global.is_some()),
            delayed: t.delays.then(|| Arc::clone(delayed)),
        }
    }

    /// The route's limits, in order.
    pub(super) fn limits(&self) -> &[Arc<Limit>] {
        &self.policy.limits
    }

    /// Whether limit `i` is in shadow mode (its own, or the route's).
    pub(super) fn in_shadow_mode(&self, i: usize) -> bool {
        self.policy.shadow || self.policy.limits[i].shadow
    }
}
