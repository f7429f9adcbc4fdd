//! `count = "failures"`: a limit charged up front like any other (its room
//! checked exactly, in the request's one atomic call) whose unit is given
//! back, in one more atomic call, when the handler's status is not one of
//! its failure statuses — before the response goes out, so the next
//! attempt sees the count settled. Given back to the store that charged it
//! (Redis, or the `local` policy's buckets). When that call fails the unit
//! stays charged: the safe side for a login limit.

use std::sync::Arc;

use super::super::check::Stores;
use super::super::plan::RoutePlan;
use super::super::{DecidedBy, Pending};
use super::challenge::Prompted;
use super::decision::After;
use crate::algorithm::LimitState;
use crate::route::Limit;
use crate::store::{Bucket, Check};

/// The work to run with the handler's status: refund the charged
/// buckets of limits that count failures (`each` units each), when
/// the status is not one.
/// `None` when no such limit was charged.
pub(super) fn after(
    stores: &Arc<Stores>,
    plan: &RoutePlan,
    p: &Pending,
    limits: &[LimitState],
    each: f64,
    by: DecidedBy,
) -> Option<After> {
    let charged: Vec<(Arc<Limit>, Bucket)> = plan
        .limits()
        .iter()
        .zip(&p.check.buckets)
        .zip(limits)
        .filter(|((l, _), s)| l.failures.is_some() && s.enough)
        .map(|((l, b), _)| (Arc::clone(l), b.clone()))
        .collect();
    if charged.is_empty() {
        return None;
    }
    let stores = Arc::clone(stores);
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
            // Behind the breaker: while it is open this fails at once
            // instead of waiting out the deadline.
            if let Err(e) = stores.give_back(by, &refund).await {
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
    use crate::RateLimitLayer;
    use crate::config::Config;
    use crate::store::{MemoryStore, Outcome, Store, StoreError, StoreFuture};
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use http::{HeaderMap, StatusCode};
    use tower::ServiceExt;

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

    /// Charges one attempt whose handler answers `status`; whether it was
    /// admitted.
    async fn attempt(app: &Router, status: StatusCode) -> bool {
        let req = http::Request::get("/")
            .header("x-account", "alice")
            .header("x-status", status.as_str())
            .body(Body::empty())
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        res.status() != StatusCode::TOO_MANY_REQUESTS
    }

    /// A login route behind a limit that counts failures, on `store`.
    async fn app(store: Arc<dyn Store>) -> Router {
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
        let status = |h: HeaderMap| async move {
            let s = h["x-status"].to_str().unwrap().parse::<u16>().unwrap();
            StatusCode::from_u16(s).unwrap()
        };
        Router::new()
            .route("/", get(status))
            .layer(RateLimitLayer::with_store(cfg, store).await.unwrap())
    }

    #[tokio::test]
    async fn successes_are_given_back_failures_are_not() {
        let app = app(Arc::new(MemoryStore::new(100))).await;
        for _ in 0..10 {
            assert!(attempt(&app, StatusCode::OK).await);
        }
        for _ in 0..3 {
            assert!(attempt(&app, StatusCode::UNAUTHORIZED).await);
        }
        assert!(!attempt(&app, StatusCode::OK).await, "3 failures: refused");
    }

    #[tokio::test]
    async fn a_refund_the_store_fails_leaves_the_unit_charged() {
        let app = app(Arc::new(NoRefunds(MemoryStore::new(100)))).await;
        for _ in 0..3 {
            assert!(attempt(&app, StatusCode::OK).await);
        }
        assert!(
            !attempt(&app, StatusCode::OK).await,
            "the successes stayed charged"
        );
    }
}
