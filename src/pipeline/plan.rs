//! A route's plan: everything about a route that does not depend on the
//! request, compiled once per configuration (not to be confused with a
//! caller's pricing plan, `crate::plan`, which it may look up).

use std::sync::Arc;

use smallvec::SmallVec;
use tokio::sync::Semaphore;

use crate::answer::{self as response, HeaderStyle, Item, RefusalHook, Rejection};
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
    /// No limit has plans or is global: each bucket holds the limit's own
    /// numbers.
    pub(super) own_numbers: bool,
    /// Each limit soft in the store (shadow mode, or escalating instead of
    /// refusing: see `settle/escalate.rs`).
    pub(super) soft: SmallVec<[bool; 1]>,
    /// Some limit is in shadow mode (its own, or the route's).
    pub(super) any_shadow: bool,
    /// Each limit's header item under its own numbers, for a request of
    /// the route's cost, without a state.
    pub(super) own_items: SmallVec<[Item; 1]>,
    /// The first limit that can never hold the route's cost (`413`), by
    /// its own numbers.
    too_costly: Option<usize>,
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
        let limits = &policy.limits;
        let shadow = |l: &Limit| l.shadow || policy.shadow;
        let cost = f64::from(policy.cost);
        let global = limits.iter().any(|l| l.global.is_some());
        Self {
            policy: Arc::clone(policy),
            header_style,
            on_refusal,
            plans: t.plans.then(|| Arc::clone(plans)),
            slots: limits.iter().any(|l| l.rule.is_concurrency()),
            global,
            delayed: t.delays.then(|| Arc::clone(delayed)),
            own_numbers: !t.plans && !global,
            soft: limits.iter().map(|l| shadow(l) || l.escalates()).collect(),
            any_shadow: limits.iter().any(|l| shadow(l)),
            own_items: limits
                .iter()
                .map(|l| Item::new(&l.name, &l.rule, shadow(l), cost))
                .collect(),
            // A concurrency limit takes one slot whatever the cost.
            too_costly: limits
                .iter()
                .position(|l| cost > l.rule.capacity() && !shadow(l) && !l.rule.is_concurrency()),
        }
    }

    /// For a request of the route's own cost whose buckets hold the limits'
    /// own numbers: whether it can fit (else its `413`), known once.
    // The refusal is rare and built once; boxing it would cost every caller.
    #[allow(clippy::result_large_err)]
    #[inline]
    pub(super) fn fits_own(&self) -> Result<(), Rejection> {
        match self.too_costly {
            None => Ok(()),
            Some(i) => {
                let l = &self.policy.limits[i];
                Err(response::too_costly(
                    &**l,
                    self.policy.cost,
                    l.rule.capacity(),
                ))
            }
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
