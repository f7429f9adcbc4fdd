//! `count = "failures"`: a limit charged up front like any other (its room
//! checked exactly, in the request's one atomic call) whose unit is given
//! back, in one more atomic call, when the handler's status is not one of
//! its failure statuses — before the response goes out, so the next
//! attempt sees the count settled. Given back to the store that charged it
//! (Redis, or the `local` policy's buckets). When that call fails the unit
//! stays charged: the safe side for a login limit.

use std::sync::Arc;

use super::challenge::Prompted;
use super::{After, Buckets, DecidedBy, Limiter, Pending};
use crate::algorithm::LimitState;
use crate::route::Limit;
use crate::store::{Bucket, Check};

/// The work to run with the handler's status: refund the charged
/// buckets of limits that count failures (`each` units each), when
/// the status is not one.
/// `None` when no such limit was charged.
pub(super) fn settle(
    l: &Arc<Limiter>,
    p: &Pending,
    buckets: &Buckets,
    limits: &[LimitState],
    each: f64,
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
    let this = Arc::clone(l);
    // What was charged, not the route's cost: `local` may charge less.
    let cost = each;
    Some(Box::new(move |status, extensions| {
        // A challenge asked for (`ChallengeRequired`) is not a failed
        // attempt: nothing was tried. Counting it would turn a
        // challenge, meant to spare the owner, into a lockout.
        let prompted = extensions.get::<Prompted>().is_some();
        let (back, limits): (Vec<Bucket>, Vec<Arc<Limit>>) = charged
            .into_iter()
            .filter(|(l, _)| prompted || !l.counts(status))
            .map(|(l, b)| (b, l))
            .unzip();
        if back.is_empty() {
            return None;
        }
        let refund = Check {
            cost: -cost,
            buckets: back,
            slot: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::pipeline::{prepare, Decided, Decision, Extras};
    use crate::store::{MemoryStore, Outcome, Store, StoreError, StoreFuture};
    use http::StatusCode;
    use std::ops::ControlFlow;

    /// The in-process store, except that every refund (negative cost)
    /// fails, as a frozen or lost Redis would. (Each failed refund follows
    /// a successful charge, so the breaker never sees failures in a row.)
    #[derive(Debug)]
    struct NoRefunds(MemoryStore);

    impl Store for NoRefunds {
        fn check(&self, check: &Check) -> StoreFuture {
            if check.cost < 0.0 {
                return Box::pin(async { Err(StoreError::Timeout) });
            }
            let o: Outcome = self.0.check_now(check);
            Box::pin(async move { Ok(o) })
        }
    }

    /// Charges one attempt, runs the work for `status`; whether admitted.
    async fn attempt(limiter: &Arc<Limiter>, status: StatusCode) -> bool {
        let req = http::Request::get("/")
            .header("x-account", "alice")
            .body(())
            .unwrap();
        let ControlFlow::Continue(p) = prepare::prepare(limiter, &req) else {
            panic!("the default policy applies");
        };
        let d = match limiter.decide(p) {
            Decided::Now(d) => d,
            Decided::Later(f) => f.await,
            Decided::Unlimited => panic!("a limited route"),
        };
        let Decision::Admit(a) = d else {
            return false;
        };
        if let Some(work) = a
            .after
            .and_then(|after| after(status, &http::Extensions::new()))
        {
            work.await;
        }
        true
    }

    fn limiter(store: Arc<dyn Store>) -> Arc<Limiter> {
        let cfg = Config::from_toml_str(
            r#"
            [limits.failures]
            key = "header:x-account"
            count = "failures"
            capacity = 3
            refill = "1/h"

            [default]
            limits = ["failures"]
            "#,
        )
        .unwrap();
        Arc::new(Limiter::new(&cfg, store, None, Extras::none()))
    }

    #[tokio::test]
    async fn successes_are_given_back_failures_are_not() {
        let l = limiter(Arc::new(MemoryStore::new(100)));
        for _ in 0..10 {
            assert!(attempt(&l, StatusCode::OK).await);
        }
        for _ in 0..3 {
            assert!(attempt(&l, StatusCode::UNAUTHORIZED).await);
        }
        assert!(!attempt(&l, StatusCode::OK).await, "3 failures: refused");
    }

    #[tokio::test]
    async fn a_refund_the_store_fails_leaves_the_unit_charged() {
        let l = limiter(Arc::new(NoRefunds(MemoryStore::new(100))));
        for _ in 0..3 {
            assert!(attempt(&l, StatusCode::OK).await);
        }
        assert!(
            !attempt(&l, StatusCode::OK).await,
            "the successes stayed charged"
        );
    }
}
