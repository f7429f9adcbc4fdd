//! `count = "failures"`: a limit charged up front like any other (its room
//! checked exactly, in the request's one atomic call) whose unit is given
//! back, in one more atomic call, when the handler's status is not one of
//! its failure statuses — before the response goes out, so the next
//! attempt sees the count settled. Given back to the store that charged it
//! (Redis, or the `local` policy's buckets). When that call fails the unit
//! stays charged: the safe side for a login limit.

use std::sync::Arc;

use super::{After, Buckets, DecidedBy, Limiter, Pending};
use crate::algorithm::LimitState;
use crate::route::Limit;
use crate::store::{Bucket, Check};

impl Limiter {
    /// The work to run with the handler's status: refund the charged
    /// buckets of limits that count failures, when the status is not one.
    /// `None` when no such limit was charged.
    pub(super) fn settle(
        self: &Arc<Self>,
        p: &Pending,
        buckets: &Buckets,
        limits: &[LimitState],
        by: DecidedBy,
    ) -> Option<After> {
        let charged: Vec<(Arc<Limit>, Bucket)> = p
            .policy
            .limits
            .iter()
            .zip(buckets)
            .zip(limits)
            .filter(|((l, _), s)| l.failures.is_some() && s.enough)
            .map(|((l, b), _)| (Arc::clone(l), b.clone()))
            .collect();
        if charged.is_empty() {
            return None;
        }
        let this = Arc::clone(self);
        let cost = f64::from(p.cost);
        Some(Box::new(move |status| {
            let (back, limits): (Vec<Bucket>, Vec<Arc<Limit>>) = charged
                .into_iter()
                .filter(|(l, _)| !l.counts(status))
                .map(|(l, b)| (b, l))
                .unzip();
            if back.is_empty() {
                return None;
            }
            let refund = Check {
                cost: -cost,
                buckets: back,
            };
            Some(Box::pin(async move {
                let answer = match by {
                    DecidedBy::Fallback => this.fallback.refund(&refund).await,
                    // Behind the breaker: while it is open this fails at
                    // once instead of waiting out the deadline.
                    DecidedBy::Primary => this.ask(&refund).await.map(|_| ()),
                };
                if let Err(e) = answer {
                    for l in &limits {
                        match l.escalation_log[1].event() {
                            Some(suppressed) => tracing::warn!(
                                target: "fleetlimit", limit = %l.name, error = %e, suppressed,
                                "a success could not be given back: counted as a failure"
                            ),
                            None => tracing::debug!(
                                target: "fleetlimit", limit = %l.name, error = %e,
                                "a success could not be given back: counted as a failure"
                            ),
                        }
                    }
                }
            }) as _)
        }))
    }
}
