//! Step 3: a check's [`Answer`] → the request's one [`Decision`]: every
//! decision is built by [`settle`] (the few made before a check, in
//! [`Decision`]'s constructors beside it). An admission carries what
//! settles after the handler: its slots ([`release`]), its refund handle
//! ([`refund`]), the work that gives back a success to a limit counting
//! failures ([`failures`]), and an escalation ([`escalate`]).

mod account;
mod challenge;
mod decision;
mod escalate;
mod failures;
mod headers;
mod refund;
mod release;

use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

pub(crate) use self::challenge::Prompted;
pub use self::challenge::{Challenge, ChallengeRequired};
pub(crate) use self::decision::{Admitted, After, Decision, Hold};
pub(super) use self::escalate::held;
pub use self::refund::Refund;
use self::release::Release;
use super::check::{Answer, Chain, Refused};
use super::plan::RoutePlan;
use super::{DecidedBy, Pending};
use crate::answer::Rejection;
use crate::answer::{self as response, Item, RateHeaders, refusing, retry_after_secs};
use crate::record::Via;

/// The decision for `answer` to the request `p` of route `plan`, under
/// the configuration `chain` answers for. On a `refund = true` route every
/// admitted request carries a [`Refund`], a no-op one when nothing can be
/// given back (admitted by the `open` policy, from a lease, in shadow
/// mode), so a handler can take `Extension<Refund>` without a 500 on those
/// paths.
// Always: the decision is built where it is returned (see `Limiter::decide`).
#[inline(always)]
pub(super) fn settle(plan: &RoutePlan, chain: &Chain, p: &Pending, answer: Answer) -> Decision {
    let recorder = chain.stores.recorder();
    let verdict = match answer {
        // The common case, built where it is returned.
        Answer::Decided(by) => return decided(plan, chain, p, by),
        Answer::Remembered { at, refused } => Err(remembered(plan, chain, p, at, &refused)),
        Answer::Leased { admitted, state } => {
            let (limit, bucket) = (&plan.limits()[0], &p.check.buckets[0]);
            let shown = if admitted {
                state.remaining
            } else {
                state.remaining.floor().max(0.0)
            };
            let state_of = |_| Some((shown, admitted));
            account::record(recorder, plan, p, admitted, state_of, Via::Lease);
            if admitted {
                let (left, reset) = (state.remaining, state.reset);
                let headers =
                    headers::one_limit(plan, limit, &bucket.rule, p.check.cost, left, reset);
                Ok(Admitted {
                    headers: Some(headers),
                    ..Admitted::default()
                })
            } else {
                let headers = headers::headers(plan, p, &[state], Some(0), DecidedBy::Primary);
                let retry = retry_after_secs(state.wait);
                let id = p.shown_id(0);
                Err(response::refusal(
                    &**limit, id, headers, retry, false, false,
                ))
            }
        }
        Answer::Open => {
            account::record(recorder, plan, p, true, |_| None, Via::Open);
            Ok(Admitted::default())
        }
        Answer::Closed(r) => {
            account::record(recorder, plan, p, false, |_| None, Via::Closed);
            Err(r)
        }
    };
    match verdict {
        Ok(mut a) => {
            with_refund(plan, &mut a);
            Decision::Admit(a)
        }
        Err(r) => Decision::Reject(r),
    }
}

/// On a `refund = true` route, an admission without a refund handle gets
/// a no-op one.
#[inline]
fn with_refund(plan: &RoutePlan, a: &mut Admitted) {
    if plan.policy.refund {
        a.refund.get_or_insert_with(Refund::none);
    }
}

/// A store's answer (`p.outcome`, to `p.check`) → headers, refund handle,
/// slots, or a refusal (remembered, when Redis answered it): [`settle`]'s
/// common case, built where it is returned.
#[inline(always)]
fn decided(plan: &RoutePlan, chain: &Chain, p: &Pending, by: DecidedBy) -> Decision {
    let (allowed, limits) = (p.outcome.allowed, p.outcome.limits.as_slice());
    let buckets = &p.check.buckets;
    let degraded = by.degraded();
    let via = if degraded { Via::Local } else { Via::Store };
    let state = |i: usize| Some((limits[i].remaining, limits[i].enough));
    account::record(chain.stores.recorder(), plan, p, allowed, state, via);
    // Soft in the store: in shadow mode, or escalating instead of refusing.
    let shadows = limits.iter().enumerate().filter(|_| plan.any_shadow);
    for (i, s) in shadows {
        if plan.in_shadow_mode(i) && !s.enough {
            tracing::info!(
                target: "fleetlimit",
                limit = %plan.limits()[i].name,
                key = %p.shown_id(i),
                remaining = s.remaining.floor().max(0.0),
                reason = "limit-exceeded",
                degraded,
                shadow = true,
                "would refuse (shadow mode: served)"
            );
        }
    }
    let mut hold = Hold::default();
    let slot = p.check.slot.as_deref();
    if allowed && slot.is_some() {
        // Each slot taken is given back when the response is over.
        for r in Release::taken(&chain.stores, buckets, limits, slot, by) {
            hold.push(r);
        }
    }
    // A refusal reports its refusing limit; an admission the one that
    // refuses first (chosen by the headers themselves).
    let refused_by = if allowed {
        None
    } else {
        refusing(limits, |i| buckets[i].shadow)
    };
    if limits.is_empty() || (!allowed && refused_by.is_none()) {
        let mut a = Admitted {
            hold,
            ..Admitted::default()
        };
        with_refund(plan, &mut a);
        return Decision::Admit(a);
    }
    let headers = headers::headers(plan, p, limits, refused_by, by);
    let Some(i) = refused_by else {
        let mut admitted = Admitted {
            headers: Some(headers),
            refund: None,
            extensions: http::Extensions::new(),
            hold,
            after: None,
            on_refusal: None,
        };
        let (traits, charged) = (plan.policy.traits, p.check.cost);
        if traits.counts_failures {
            admitted.after = failures::after(&chain.stores, plan, p, limits, charged, by);
        }
        if traits.escalates {
            escalate::escalate(plan, p, limits, by, &mut admitted);
            admitted.on_refusal.clone_from(&plan.on_refusal);
        }
        // Opt-in per route: the handle is an allocation and an
        // extension insert on every admitted request.
        if plan.policy.refund {
            admitted.refund = refund::charged(&chain.stores, plan, p, limits, by);
        }
        with_refund(plan, &mut admitted);
        return Decision::Admit(admitted);
    };
    let s = limits[i];
    let limit = &plan.limits()[i];
    let key = &buckets[i].key;
    // Not remembered: a concurrency refusal (a slot may free up at any
    // moment), nor one of a limit that counts failures (successes in
    // flight give their units back at once).
    if by == DecidedBy::Primary
        && chain.refused.is_on()
        && !buckets[i].rule.is_concurrency()
        && limit.failures.is_none()
    {
        // Remember the refusal: until it can succeed, this instance
        // answers the key by itself (see `check/refused.rs`).
        let now = Instant::now();
        let secs = |x: f64| Duration::from_secs_f64(x.clamp(0.0, 86_400.0 * 365.0));
        chain.refused.insert(
            key,
            secs(s.wait),
            Refused {
                until: now,
                cost: f64::from(p.cost),
                rule: buckets[i].rule,
                state: s,
                at: now,
                answered: 0,
            },
            p.resets_seen,
            p.asked_at,
        );
    }
    let retry = retry_after_secs(s.wait);
    let id = p.shown_id(i);
    Decision::Reject(response::refusal(
        &**limit, id, headers, retry, degraded, false,
    ))
}

/// A refusal of limit `at` remembered from Redis: its state as Redis
/// reported it, counted down since; the other limits' policies only.
fn remembered(plan: &RoutePlan, chain: &Chain, p: &Pending, at: usize, r: &Refused) -> Rejection {
    let now = Instant::now();
    let left = |t: Instant| t.saturating_duration_since(now).as_secs_f64();
    let mut items: SmallVec<[Item; 1]> = headers::items(plan, p).collect();
    if let Some(it) = items.get_mut(at) {
        it.state = Some((r.state.remaining, r.state.reset));
    }
    let elapsed = now.saturating_duration_since(r.at).as_secs_f64();
    let mut headers = RateHeaders::new(plan.header_style, items, Some(at)).aged(elapsed);
    headers::route_policy(plan, p.rules(), p.cost, &mut headers);
    let retry = retry_after_secs(left(r.until));
    let remaining = r.state.remaining.floor().max(0.0);
    let state = |j: usize| (j == at).then_some((remaining, false));
    account::record(
        chain.stores.recorder(),
        plan,
        p,
        false,
        state,
        Via::Remembered,
    );
    let limit = &plan.limits()[at];
    response::refusal(&**limit, p.shown_id(at), headers, retry, false, true)
}
