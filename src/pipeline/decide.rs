//! Step 2: a prepared request → its decision, in this order:
//!
//! 1. the callers' plans (a resolver may wait);
//! 2. each limit's rule under the caller's plan, and `413` for a cost it
//!    can never hold;
//! 3. a refusal remembered from Redis (`refused.rs`), answered here;
//! 4. the store: the in-process one decides at once; one that answers
//!    later (Redis) is asked through the hot key's lease (`lease/`),
//!    behind the circuit breaker, and when it fails the route's failure
//!    policy decides (`fallback.rs`);
//! 5. [`Limiter::decision`]: the store's answer → headers, refund handle,
//!    or a refusal (remembered, when Redis answered it).
//!
//! Without plans, steps 2 to 4 need no waiting for the in-process store or
//! a remembered refusal: those are answered without boxing a future.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use smallvec::SmallVec;

use super::fallback::Answer;
use super::refused::Refused;
use super::slot::{Asking, Release};
use super::{account, escalate, failures, headers, lease};
use super::{Admitted, Buckets, Decided, DecidedBy, Decision, Limiter, Pending, Refund};
use crate::algorithm::LimitState;
use crate::answer::{self as response, refusing, retry_after_secs, Item, RateHeaders, Rejection};
use crate::record::Via;
use crate::region::Runtime;
use crate::route::FailurePolicy;
use crate::store::{Bucket, Check, StoreError};

impl Limiter {
    /// Decides a prepared request. On a `refund = true` route every
    /// admitted request carries a [`Refund`], a no-op one when nothing can
    /// be given back (admitted by the `open` policy, from a lease, in shadow
    /// mode), so a handler can take `Extension<Refund>` without a 500 on
    /// those paths.
    pub(crate) fn decide(self: &Arc<Self>, p: Pending) -> Decided {
        // A request over a `delay` limit waits before the handler.
        let delays = p.policy.traits.delays;
        let d = self.decide_refund(p);
        if delays {
            escalate::held(d)
        } else {
            d
        }
    }

    fn decide_refund(self: &Arc<Self>, p: Pending) -> Decided {
        if !p.policy.refund {
            return self.decide_in_store(p);
        }
        match self.decide_in_store(p) {
            Decided::Now(d) => Decided::Now(with_refund(d)),
            Decided::Later(f) => Decided::Later(Box::pin(async move { with_refund(f.await) })),
            Decided::Unlimited => Decided::Unlimited,
        }
    }

    fn decide_in_store(self: &Arc<Self>, mut p: Pending) -> Decided {
        if !p.policy.traits.plans {
            // Every rule is known now.
            return match self.decide_here(&mut p) {
                ControlFlow::Break(d) => Decided::Now(d),
                ControlFlow::Continue(buckets) => {
                    let this = Arc::clone(self);
                    Decided::Later(Box::pin(async move { this.ask_store(p, buckets).await }))
                }
            };
        }
        let this = Arc::clone(self);
        Decided::Later(Box::pin(async move {
            for k in &mut p.keys {
                if let Some(pk) = &k.plan_key {
                    k.plan = this.plans.plan_of(pk).await;
                }
            }
            match this.decide_here(&mut p) {
                ControlFlow::Break(d) => d,
                ControlFlow::Continue(buckets) => this.ask_store(p, buckets).await,
            }
        }))
    }

    /// Steps 2 to 4 that need no waiting, plans known. `Continue`: ask
    /// the store with these buckets.
    fn decide_here(self: &Arc<Self>, p: &mut Pending) -> ControlFlow<Decision, Buckets> {
        let buckets = match buckets(p, self.core.regions.as_deref()) {
            Ok(buckets) => buckets,
            Err(r) => return ControlFlow::Break(Decision::Reject(r)),
        };
        // After plan resolution: a refusal under other numbers (the caller
        // changed plan) no longer counts.
        if let Some(r) = self.refused_here(p, &buckets) {
            return ControlFlow::Break(Decision::Reject(r));
        }
        let Some(memory) = &self.core.in_process else {
            return ControlFlow::Continue(buckets);
        };
        let cost = f64::from(p.cost);
        let slot = self.core.slot_ids.for_buckets(&buckets);
        ControlFlow::Break(match (buckets.as_slice(), slot) {
            // No check or outcome vectors for a single limit.
            ([bucket], None) => {
                let (allowed, state) = memory.check_one(bucket, cost);
                self.decision(
                    p,
                    buckets,
                    Answered::new(allowed, &[state], None, cost),
                    DecidedBy::Primary,
                )
            }
            (_, slot) => {
                let check = Check {
                    slot,
                    cost,
                    buckets: buckets.into_vec(),
                };
                let o = memory.check_now(&check);
                let buckets = Buckets::from_vec(check.buckets);
                let answered = Answered::new(o.allowed, &o.limits, check.slot.as_deref(), cost);
                self.decision(p, buckets, answered, DecidedBy::Primary)
            }
        })
    }

    /// A refusal remembered from Redis under the same rule, for a limit
    /// that is not in shadow mode.
    fn refused_here(&self, p: &Pending, buckets: &Buckets) -> Option<Rejection> {
        let limits = p.policy.limits.iter().zip(buckets).zip(&p.keys);
        for (at, ((limit, b), k)) in limits.enumerate() {
            let id = k.log_id;
            if b.shadow {
                continue;
            }
            let Some(r) = self.refused.get(&b.key, f64::from(p.cost), &b.rule) else {
                continue;
            };
            let now = Instant::now();
            let left = |t: Instant| t.saturating_duration_since(now).as_secs_f64();
            // The other limits' states are not known here: their policies
            // only.
            let mut items: SmallVec<[Item; 1]> = headers::items(p).collect();
            if let Some(it) = items.get_mut(at) {
                it.state = Some((r.state.remaining, r.state.reset));
            }
            let elapsed = now.saturating_duration_since(r.at).as_secs_f64();
            let mut headers = RateHeaders::new(self.header_style, items, Some(at)).aged(elapsed);
            headers::route_policy(self, &p.policy, p.rules(), p.cost, &mut headers);
            let retry = retry_after_secs(left(r.until));
            let remaining = r.state.remaining.floor().max(0.0);
            let state = |j: usize| (j == at).then_some((remaining, false));
            account::record(self, p, buckets, false, state, Via::Remembered);
            return Some(response::refusal(
                &**limit,
                id.of(&b.key),
                headers,
                retry,
                false,
                true,
            ));
        }
        None
    }

    /// Step 4 for a store that answers later (Redis, or a store of the
    /// user's): the hot key's lease, else the store behind the breaker,
    /// else the failure policy.
    async fn ask_store(self: &Arc<Self>, mut p: Pending, buckets: Buckets) -> Decision {
        // Before Redis is asked: a refusal it answers from before a reset
        // must not be remembered after it.
        p.resets_seen = self.refused.resets();
        p.asked_at = Some(Instant::now());
        let check = Check {
            slot: self.core.slot_ids.for_buckets(&buckets),
            cost: f64::from(p.cost),
            buckets: buckets.into_vec(),
        };
        if p.quota_unknown {
            let why = "this region's quota of a global limit is not known: its Redis has not been read for too long";
            return self.fall_back(&p, check, &StoreError::Unavailable(why.into()));
        }
        if let Some(d) = lease::take::leased(self, &p, &check).await {
            return d;
        }
        // Cancelled, timed out or failed, the script may still have taken
        // a slot: it is given back rather than counted until max_hold.
        let asking = Asking::new(self.store(), &check);
        match self.ask(&check).await {
            Ok(o) => {
                asking.answered();
                let buckets = Buckets::from_vec(check.buckets);
                let answered =
                    Answered::new(o.allowed, &o.limits, check.slot.as_deref(), check.cost);
                self.decision(&p, buckets, answered, DecidedBy::Primary)
            }
            Err(e) => {
                // Not sent (breaker open, own queue full): nothing to give
                // back, and a release would only knock on a Redis cut off.
                if matches!(e, StoreError::CircuitOpen | StoreError::Overloaded) {
                    asking.answered();
                } else {
                    drop(asking);
                }
                self.fall_back(&p, check, &e)
            }
        }
    }

    /// The store failed: the route's failure policy decides.
    pub(super) fn fall_back(
        self: &Arc<Self>,
        p: &Pending,
        check: Check,
        e: &StoreError,
    ) -> Decision {
        super::trace::degraded();
        // `local` is recorded with its buckets' answer, in `decision`.
        match p.policy.on_redis_error {
            FailurePolicy::Open => {
                account::record(self, p, &check.buckets, true, |_| None, Via::Open)
            }
            FailurePolicy::Closed => {
                account::record(self, p, &check.buckets, false, |_| None, Via::Closed)
            }
            FailurePolicy::Local => {}
        }
        match self.fallback.answer(&p.policy, check, p.log_id(0), e) {
            Answer::Admit => Decision::admit(None),
            Answer::Reject(r) => Decision::Reject(r),
            Answer::Local(check, o) => {
                // What it admitted goes to Redis once Redis answers.
                super::writeback::ensure(&self.core);
                let buckets = Buckets::from_vec(check.buckets);
                // `local` may charge less than the cost (see fallback.rs).
                let answered =
                    Answered::new(o.allowed, &o.limits, check.slot.as_deref(), check.cost);
                self.decision(p, buckets, answered, DecidedBy::Fallback)
            }
        }
    }

    /// Step 5: the decision for a store's answer.
    fn decision(
        self: &Arc<Self>,
        p: &Pending,
        buckets: Buckets,
        answered: Answered<'_>,
        by: DecidedBy,
    ) -> Decision {
        let Answered {
            allowed,
            limits,
            slot,
            charged,
        } = answered;
        let degraded = by.degraded();
        let via = if degraded { Via::Local } else { Via::Store };
        let state = |i: usize| Some((limits[i].remaining, limits[i].enough));
        account::record(self, p, &buckets, allowed, state, via);
        // Soft in the store: in shadow mode, or escalating instead of refusing.
        let shadow = |i: usize| buckets[i].shadow;
        let in_shadow_mode = |i: usize| p.policy.shadow || p.policy.limits[i].shadow;
        for (i, s) in limits.iter().enumerate() {
            if in_shadow_mode(i) && !s.enough {
                tracing::info!(
                    target: "fleetlimit",
                    limit = %p.policy.limits[i].name,
                    key = %p.log_id(i).of(&buckets[i].key),
                    remaining = s.remaining.floor().max(0.0),
                    reason = "limit-exceeded",
                    degraded,
                    shadow = true,
                    "would refuse (shadow mode: served)"
                );
            }
        }
        let mut hold = super::Hold::default();
        if allowed && slot.is_some() {
            // Each slot taken is given back when the response is over.
            for r in Release::taken(self, &buckets, limits, slot, by) {
                hold.push(r);
            }
        }
        // A refusal reports its refusing limit; an admission the one that
        // refuses first (chosen by the headers themselves).
        let refused_by = if allowed {
            None
        } else {
            refusing(limits, shadow)
        };
        if limits.is_empty() || (!allowed && refused_by.is_none()) {
            return Decision::Admit(Admitted {
                hold,
                ..Admitted::default()
            });
        }
        let headers = headers::headers(self, p, limits, refused_by, by);
        let Some(i) = refused_by else {
            let mut admitted = Admitted {
                headers: Some(headers),
                hold,
                ..Admitted::default()
            };
            let counts_failures = p.policy.traits.counts_failures;
            if counts_failures {
                admitted.after = failures::settle(self, p, &buckets, limits, charged, by);
            }
            if p.policy.traits.escalates {
                escalate::escalate(&self.core.delayed, p, &buckets, limits, by, &mut admitted);
                admitted.on_refusal.clone_from(&self.on_refusal);
            }
            // Opt-in per route: the handle is an allocation and an
            // extension insert on every admitted request. It gives back
            // to the limits that count requests: the status settles those
            // that count failures.
            if p.policy.refund {
                admitted.refund = if counts_failures {
                    let requests_only: SmallVec<[LimitState; 1]> = limits
                        .iter()
                        .zip(&p.policy.limits)
                        .map(|(s, l)| LimitState {
                            enough: s.enough && l.failures.is_none(),
                            ..*s
                        })
                        .collect();
                    Refund::new(self, buckets, &requests_only, p.cost, charged, by)
                } else {
                    Refund::new(self, buckets, limits, p.cost, charged, by)
                };
            }
            return Decision::Admit(admitted);
        };
        let s = limits[i];
        let limit = &p.policy.limits[i];
        let key = &buckets[i].key;
        let id = p.log_id(i);
        // Not remembered: a concurrency refusal (a slot may free up at any
        // moment), nor one of a limit that counts failures (successes in
        // flight give their units back at once).
        if by == DecidedBy::Primary
            && self.refused.is_on()
            && !buckets[i].rule.is_concurrency()
            && limit.failures.is_none()
        {
            // Remember the refusal: until it can succeed, this instance
            // answers the key by itself (see `refused.rs`).
            let now = Instant::now();
            let secs = |x: f64| Duration::from_secs_f64(x.clamp(0.0, 86_400.0 * 365.0));
            self.refused.insert(
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
        Decision::Reject(response::refusal(
            &**limit,
            id.of(key),
            headers,
            retry,
            degraded,
            false,
        ))
    }
}

/// A store's answer for one request.
struct Answered<'a> {
    allowed: bool,
    /// Each bucket's state, in the order of the buckets.
    limits: &'a [LimitState],
    /// The request's concurrency slot id, when it has one.
    slot: Option<&'a str>,
    /// What each limit with room was charged: the cost, or less when the
    /// `local` policy capped it at a share.
    charged: f64,
}

impl<'a> Answered<'a> {
    fn new(allowed: bool, limits: &'a [LimitState], slot: Option<&'a str>, charged: f64) -> Self {
        Self {
            allowed,
            limits,
            slot,
            charged,
        }
    }
}

/// Each limit's bucket under the caller's plan (the key strings move into
/// it); or `413` when the cost can never fit. A global limit's bucket is
/// its region's share of it (`region/`), and its demand is counted.
// The refusal is rare and built once; boxing it would cost every caller.
#[allow(clippy::result_large_err)]
fn buckets(p: &mut Pending, regions: Option<&Runtime>) -> Result<Buckets, Rejection> {
    let mut buckets = Buckets::with_capacity(p.keys.len());
    for (limit, k) in p.policy.limits.iter().zip(&mut p.keys) {
        let rule = limit.rule_for(k.plan.as_deref());
        k.rule = rule;
        let shadow = limit.shadow || p.policy.shadow;
        // A concurrency limit takes one slot whatever the cost.
        if f64::from(p.cost) > rule.capacity() && !shadow && !rule.is_concurrency() {
            return Err(response::too_costly(&**limit, p.cost, rule.capacity()));
        }
        // The headers say the global policy (`k.rule`); the bucket is this
        // region's share of it.
        let mut stored = rule;
        if limit.global.is_some() {
            match regions.and_then(|r| r.quota(&limit.name)) {
                Some(q) => {
                    q.offer(&k.key, p.cost);
                    // Not trusted: Redis is not asked; `local` estimates
                    // with the last share read.
                    let share = q.share(&k.key).unwrap_or_else(|last| {
                        p.quota_unknown = true;
                        last
                    });
                    stored = rule.quota(share);
                }
                None => p.quota_unknown = true,
            }
        }
        buckets.push(Bucket {
            key: std::mem::take(&mut k.key),
            rule: stored,
            // A limit that escalates is soft in the store (see escalate.rs).
            shadow: shadow || limit.escalates(),
        });
    }
    Ok(buckets)
}

/// An admitted request of a refund route without a handle gets a no-op one.
fn with_refund(mut d: Decision) -> Decision {
    if let Decision::Admit(a) = &mut d {
        a.refund.get_or_insert_with(Refund::none);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::pipeline::{prepare, Extras};
    use crate::store::{Outcome, Store, StoreFuture};
    use http::StatusCode;
    use std::ops::ControlFlow;

    /// A store that refuses every request for 10 s.
    #[derive(Debug)]
    struct Refusing;

    impl Store for Refusing {
        fn check(&self, check: &Check) -> StoreFuture {
            let refused = LimitState {
                enough: false,
                remaining: 0.0,
                wait: 10.0,
                reset: 10.0,
                capacity: 5.0,
            };
            let limits = vec![refused; check.buckets.len()];
            Box::pin(async move {
                Ok(Outcome {
                    allowed: false,
                    limits,
                })
            })
        }
    }

    async fn status(limiter: &Arc<Limiter>, cost: u32) -> (StatusCode, bool) {
        let req = http::Request::get("/")
            .header("x-api-key", "k")
            .body(())
            .unwrap();
        let ControlFlow::Continue(mut p) = prepare::prepare(limiter, &req) else {
            panic!("the default policy applies");
        };
        p.cost = cost;
        let (d, now) = match limiter.decide(p) {
            Decided::Now(d) => (d, true),
            Decided::Later(f) => (f.await, false),
            Decided::Unlimited => panic!("a limited route"),
        };
        match d {
            Decision::Reject(r) => (r.status, now),
            Decision::Admit(..) => (StatusCode::OK, now),
        }
    }

    /// A cost no bucket can hold is 413 whatever the refused cache holds
    /// for the key (it used to answer the remembered 429 on routes without
    /// plans, and 413 on routes with plans).
    #[tokio::test]
    async fn too_costly_is_413_even_for_a_refused_key() {
        let cfg = Config::from_toml_str(
            r#"
            [limits.per-key]
            key = "header:x-api-key"
            capacity = 5
            refill = "1/s"

            [default]
            limits = ["per-key"]
            "#,
        )
        .unwrap();
        let limiter = Arc::new(Limiter::new(&cfg, Arc::new(Refusing), None, Extras::none()));
        let refused = (StatusCode::TOO_MANY_REQUESTS, false);
        assert_eq!(status(&limiter, 1).await, refused, "refused by the store");
        let remembered = (StatusCode::TOO_MANY_REQUESTS, true);
        assert_eq!(status(&limiter, 1).await, remembered, "remembered");
        let too_costly = (StatusCode::PAYLOAD_TOO_LARGE, true);
        assert_eq!(status(&limiter, 6).await, too_costly);
    }
}
