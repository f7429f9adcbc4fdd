//! Each limit's numbers for this request: under the caller's plan (looked
//! up first, when a limit has plans), `413` for a cost it can never hold,
//! and for a global limit this region's share of them.

use super::super::Pending;
use super::super::plan::RoutePlan;
use crate::answer::{self as response, Rejection};
use crate::plan::Plans;
use crate::region::Runtime;

/// The callers' plans of a request's limits that have plans.
pub(in crate::pipeline) async fn look_up_plans(plans: &Plans, p: &mut Pending) {
    for k in &mut p.keys {
        if let Some(pk) = &k.plan_key {
            k.plan = plans.plan_of(pk).await;
        }
    }
}

/// Each limit's bucket under the caller's plan; or `413` when the cost can
/// never fit. A global limit's bucket is its region's share of it
/// (`region/`), and its demand is counted.
// The refusal is rare and built once; boxing it would cost every caller.
#[allow(clippy::result_large_err)]
#[inline]
pub(in crate::pipeline) fn rules(
    plan: &RoutePlan,
    regions: Option<&Runtime>,
    p: &mut Pending,
) -> Result<(), Rejection> {
    let cost = p.cost;
    if plan.own_numbers && cost == plan.policy.cost {
        // The key step wrote the limits' own numbers: known to fit or not.
        return plan.fits_own();
    }
    let route_shadow = plan.policy.shadow;
    let limits = plan.limits().iter().zip(&mut p.keys);
    for (i, ((limit, k), b)) in limits.zip(&mut p.check.buckets).enumerate() {
        let rule = limit.rule_for(k.plan.as_deref());
        k.rule = rule;
        let shadow = limit.shadow || route_shadow;
        // A concurrency limit takes one slot whatever the cost.
        if f64::from(cost) > rule.capacity() && !shadow && !rule.is_concurrency() {
            return Err(response::too_costly(&**limit, cost, rule.capacity()));
        }
        // The headers say the global policy (`k.rule`); the bucket is this
        // region's share of it.
        let mut stored = rule;
        if plan.global && limit.global.is_some() {
            match regions.and_then(|r| r.quota(&limit.name)) {
                Some(q) => {
                    q.offer(&b.key, cost);
                    // Not trusted: Redis is not asked; `local` estimates
                    // with the last share read.
                    stored = q.bucket(&b.key, rule).unwrap_or_else(|last| {
                        p.quota_unknown = true;
                        last
                    });
                }
                None => p.quota_unknown = true,
            }
        }
        b.rule = stored;
        b.shadow = plan.soft[i];
    }
    Ok(())
}
