//! A hot key's request through its lease (step 2 of `check/`): spent
//! from this instance's lease, refused here while a short lease waits for
//! the next tokens, or taking a new lease of up to a batch, which admits
//! the request that takes it when it got at least its cost.

use std::time::Duration;

use super::super::super::Pending;
use super::super::super::plan::RoutePlan;
use super::super::{Answer, Chain};
use super::{Grant, LeaseUse};
use crate::algorithm::{LimitState, Rule};
use crate::answer as response;
use crate::metrics::LeaseRefusal;
use crate::store::{Check, Lease};

/// Hot-key leases (see `lease/`): a request of a hot key is admitted
/// from this instance's lease, refused here until a short lease's next
/// tokens come, or takes a new lease for the next ones. `None`: ask the
/// store as usual.
pub(in crate::pipeline) async fn leased(
    chain: &Chain,
    plan: &RoutePlan,
    p: &mut Pending,
) -> Option<Answer> {
    let check = &p.check;
    let ([limit], [bucket]) = (plan.limits(), check.buckets.as_slice()) else {
        return None;
    };
    let lease = limit.lease.filter(|_| !bucket.shadow && check.cost > 0.0)?;
    let Rule::TokenBucket {
        capacity,
        refill_per_sec,
    } = bucket.rule
    else {
        return None;
    };
    let metrics = &plan.policy.metrics;
    let names = || plan.limits().iter().map(|l| &l.name);
    let leases = &chain.stores.leases;
    let (mut what, stranded) = leases.use_for(&bucket.key, check.cost, lease.above);
    crate::metrics::lease_stranded(metrics, names(), stranded);
    if what == LeaseUse::Pending {
        // Spent from the lease being taken, or refused by its answer,
        // rather than one Redis call per request meanwhile.
        if !leases.wait_taken(&bucket.key).await {
            return None;
        }
        let (again, stranded) = leases.use_again(&bucket.key, check.cost, lease.above);
        crate::metrics::lease_stranded(metrics, names(), stranded);
        what = again;
    }
    match what {
        // Another lease is being taken again: ask Redis as usual.
        LeaseUse::Normal | LeaseUse::Pending => None,
        LeaseUse::Spent {
            lease_left,
            shared_left,
        } => {
            // What this key can still spend: its lease here, and what
            // Redis had left when the lease was taken.
            let remaining = response::apart(lease_left, shared_left, check.cost).min(capacity);
            let state = LimitState {
                enough: true,
                remaining,
                wait: 0.0,
                reset: (capacity - remaining) / refill_per_sec,
                capacity,
            };
            Some(Answer::Leased {
                admitted: true,
                state,
            })
        }
        LeaseUse::Wait {
            left,
            empty,
            shared_left,
        } => {
            let why = if empty {
                LeaseRefusal::Elsewhere
            } else {
                LeaseRefusal::Waiting
            };
            crate::metrics::lease_refused(metrics, names(), why);
            let state = LimitState {
                enough: false,
                remaining: shared_left.min(capacity),
                wait: left.as_secs_f64(),
                reset: (capacity - shared_left.min(capacity)) / refill_per_sec,
                capacity,
            };
            Some(Answer::Leased {
                admitted: false,
                state,
            })
        }
        LeaseUse::Take => {
            // Whole requests of this cost: a part of one left in the
            // lease could be spent neither here nor in Redis.
            let most = (f64::from(lease.batch) / check.cost).floor().max(1.0);
            let take = Check {
                slot: check.slot.clone(),
                cost: most * check.cost,
                buckets: check.buckets.clone(),
            };
            // Clears the key's "taking" mark however this ends, even if
            // this future is dropped while Redis is asked.
            let claim = leases.claim(&bucket.key);
            let seen = leases.resets();
            match chain.stores.lease(&take, check.cost).await {
                Ok(got) => {
                    claim.disarm();
                    Some(lease_taken(chain, plan, check, &take, got, seen))
                }
                // Redis failed: the failure policy answers now, rather
                // than a second call into the same outage.
                Err(e) => {
                    drop(claim);
                    Some(chain.fall_back(plan, p, &e))
                }
            }
        }
    }
}

/// Redis answered a lease of `take` (`got`): the request is admitted
/// when it got its cost, and what is left goes to the table; short of
/// a whole batch, no lease is asked for until a whole one fits.
fn lease_taken(
    chain: &Chain,
    plan: &RoutePlan,
    check: &Check,
    take: &Check,
    got: Lease,
    seen: u64,
) -> Answer {
    let bucket = &check.buckets[0];
    let admitted = got.granted >= check.cost;
    let extra = if admitted {
        got.granted - check.cost
    } else {
        0.0
    };
    let s = got.state;
    let short = got.granted < take.cost;
    let grant = Grant {
        tokens: extra,
        shared_left: s.remaining,
        wait: short.then(|| Duration::from_secs_f64(s.wait.clamp(0.0, 3600.0))),
        empty: got.granted <= 0.0,
    };
    let metrics = &plan.policy.metrics;
    let names = || plan.limits().iter().map(|l| &l.name);
    let stranded = chain.stores.leases.granted(&bucket.key, grant, seen);
    crate::metrics::lease_stranded(metrics, names(), stranded);
    if !admitted {
        // Not even this request's cost was free: refused until the
        // instance asks again.
        let wait = s.wait.min(super::LEASE_TTL.as_secs_f64());
        let state = LimitState {
            enough: false,
            wait,
            ..s
        };
        return Answer::Leased {
            admitted: false,
            state,
        };
    }
    crate::metrics::lease_granted(metrics, names(), 0);
    // The lease is this key's to spend here; no refund handle (it would
    // give back the whole lease).
    let left = response::apart(extra, s.remaining, check.cost);
    Answer::Leased {
        admitted: true,
        state: LimitState {
            enough: true,
            remaining: left,
            ..s
        },
    }
}
