//! The rate headers of a decision, from the store's states and the route's
//! plan (built by `crate::answer`, which knows no limiter).

use std::sync::Arc;

use smallvec::SmallVec;

use super::super::plan::RoutePlan;
use super::super::{DecidedBy, Pending};
use crate::algorithm::{LimitState, Rule};
use crate::answer::{self as response, Item, RateHeaders};

/// The headers of a decision: every limit of the route with its state
/// (`limits`, in order), `X-RateLimit-*` reporting limit `refused_by`
/// of a refusal, or on an admission the one that refuses first.
#[inline(always)]
pub(super) fn headers(
    plan: &RoutePlan,
    p: &Pending,
    limits: &[LimitState],
    refused_by: Option<usize>,
    by: DecidedBy,
) -> RateHeaders {
    // Pushed, not collected: `SmallVec`'s `extend` is not inlined, and
    // one limit is the common case (inline: no capacity to ask for).
    let mut list = SmallVec::new();
    if limits.len() > 1 {
        list.reserve_exact(limits.len());
    }
    if plan.own_numbers && p.cost == plan.policy.cost {
        // The route's own items, written once.
        for (it, s) in plan.own_items.iter().zip(limits) {
            list.push(it.clone().with(s));
        }
    } else {
        for (it, s) in items(plan, p).zip(limits) {
            list.push(it.with(s));
        }
    }
    let mut h = RateHeaders::new(plan.header_style, list, refused_by);
    h.local = by.degraded();
    route_policy(plan, p.rules(), p.cost, &mut h);
    h
}

/// Every limit of the route, in order, under the caller's plan, without a
/// state yet.
pub(super) fn items<'a>(plan: &'a RoutePlan, p: &'a Pending) -> impl Iterator<Item = Item> + 'a {
    let cost = f64::from(p.cost);
    let shadow = plan.policy.shadow;
    (plan.limits().iter().zip(p.rules()))
        .map(move |(l, rule)| Item::new(&l.name, rule, shadow || l.shadow, cost))
}

/// `RateLimit-Policy` serialised once per route, not per response,
/// for a caller whose plan leaves the route's numbers as they are
/// (`rules`: each limit's under the caller's plan) and a request of the
/// route's own cost (its `q` counts requests of that cost).
pub(super) fn route_policy<'r>(
    plan: &RoutePlan,
    mut rules: impl Iterator<Item = &'r Rule>,
    cost: u32,
    h: &mut RateHeaders,
) {
    let policy = &plan.policy;
    let mut own =
        || cost == policy.cost && (policy.limits.iter()).all(|l| rules.next() == Some(&l.rule));
    if plan.header_style.ietf() && own() {
        let v = policy
            .ietf_policy
            .get_or_init(|| response::policy_value(&h.items).map(Arc::new));
        h.policy.clone_from(v);
    }
}

/// The headers of a route's only limit (a hot key's lease), for a
/// request of `cost`.
pub(super) fn one_limit(
    plan: &RoutePlan,
    limit: &crate::route::Limit,
    rule: &Rule,
    cost: f64,
    remaining: f64,
    reset: f64,
) -> RateHeaders {
    let mut item = Item::new(&limit.name, rule, false, cost);
    item.state = Some((remaining, reset));
    RateHeaders::new(plan.header_style, smallvec::smallvec![item], None)
}
