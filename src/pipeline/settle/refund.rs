//! The [`Refund`] handle: units an admitted request gives back.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use super::super::check::Stores;
use super::super::plan::RoutePlan;
use super::super::{DecidedBy, Pending};
use crate::algorithm::LimitState;
use crate::answer::RateHeaders;
use crate::store::{Bucket, Check};

/// Gives back units an admitted request did not need (its real cost was
/// lower than it was charged). On routes that ask for it (`refund = true`
/// in the route's TOML, [`RouteConfig::refund`](crate::config::RouteConfig::refund)
/// in code), the layer puts one in the extensions of every admitted,
/// limited request, so a handler can take `Extension<Refund>`; other routes
/// carry none (the handle costs an allocation and an extension insert per
/// request).
///
/// When nothing was charged in a store that could take units back (the
/// request was admitted by `on_redis_error = "open"` while Redis was down,
/// from a hot key's lease, or by a limit in shadow mode) the handle is a
/// no-op: [`refundable`](Self::refundable) is `0` and
/// [`give_back`](Self::give_back) returns `Ok(())` and does nothing. A
/// request admitted by the `local` policy gives back to the in-process
/// buckets that charged it.
///
/// Units given back before the handler returns its response show in that
/// response's rate-limit headers (`X-RateLimit-Remaining`, `RateLimit`):
/// they report the buckets as the store left them after the refund.
/// Units given back later (while the body streams, or from a spawned task)
/// show in the next response.
///
/// ```toml
/// [[routes]]
/// path = "/search"
/// limits = ["per-key"]
/// cost = 5
/// refund = true
/// ```
///
/// ```
/// use axum::Extension;
/// use fleetlimit::Refund;
///
/// async fn search(Extension(refund): Extension<Refund>) -> &'static str {
///     let cheap = true; // found in the cache, say
///     if cheap {
///         // Charged the route's cost (e.g. 5); the real cost was 2.
///         let _ = refund.give_back(3).await;
///     }
///     "results"
/// }
/// ```
#[derive(Clone)]
pub struct Refund {
    /// `None`: the no-op handle (nothing was charged that can be given back).
    inner: Option<Arc<RefundInner>>,
}

struct RefundInner {
    stores: Arc<Stores>,
    /// Only the buckets that were charged.
    buckets: Vec<Bucket>,
    /// Which store charged them: the one given back to.
    by: DecidedBy,
    /// Store units per unit of the route's cost: 1, or less when `local`
    /// charged a share instead of the whole cost.
    scale: f64,
    left: AtomicU32,
    /// Where each of `buckets` is among the route's limits.
    indices: SmallVec<[usize; 1]>,
    /// The buckets' states after the latest refund, for the response's
    /// headers.
    latest: Mutex<Option<SmallVec<[LimitState; 1]>>>,
}

/// The handle of an admitted request `p` of a `refund = true` route whose
/// store answered `limits` (see [`Refund::new`]). It gives back to the
/// limits that count requests: the status settles those that count
/// failures.
pub(super) fn charged(
    stores: &Arc<Stores>,
    plan: &RoutePlan,
    p: &Pending,
    limits: &[LimitState],
    by: DecidedBy,
) -> Option<Refund> {
    let (cost, each) = (p.cost, p.check.cost);
    if !plan.policy.traits.counts_failures {
        return Refund::new(stores, &p.check.buckets, limits, cost, each, by);
    }
    let requests_only: SmallVec<[LimitState; 1]> = limits
        .iter()
        .zip(plan.limits())
        .map(|(s, l)| LimitState {
            enough: s.enough && l.failures.is_none(),
            ..*s
        })
        .collect();
    Refund::new(stores, &p.check.buckets, &requests_only, cost, each, by)
}

impl Refund {
    /// The handle of a request of cost `cost` charged `each` units in
    /// `buckets` (those whose state says `enough` were); `None` when none
    /// was.
    fn new(
        stores: &Arc<Stores>,
        buckets: &[Bucket],
        limits: &[LimitState],
        cost: u32,
        each: f64,
        by: DecidedBy,
    ) -> Option<Self> {
        // Keep only the buckets that were charged; a concurrency slot is
        // given back when the response ends, not by units.
        let mut indices = SmallVec::new();
        let mut kept = Vec::new();
        for (i, (b, s)) in buckets.iter().zip(limits).enumerate() {
            if s.enough && !b.rule.is_concurrency() {
                indices.push(i);
                kept.push(b.clone());
            }
        }
        if kept.is_empty() {
            return None;
        }
        Some(Self {
            inner: Some(Arc::new(RefundInner {
                stores: Arc::clone(stores),
                buckets: kept,
                by,
                scale: if cost == 0 {
                    1.0
                } else {
                    each / f64::from(cost)
                },
                left: AtomicU32::new(cost),
                indices,
                latest: Mutex::new(None),
            })),
        })
    }

    /// The handle of a request that was charged nothing refundable.
    pub(in crate::pipeline) fn none() -> Self {
        Self { inner: None }
    }

    /// Units still refundable (the request's cost, less what was given
    /// back); `0` on a no-op handle.
    #[must_use]
    pub fn refundable(&self) -> u32 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.left.load(Ordering::Acquire))
    }

    /// Gives `units` back to every limit that charged this request (never
    /// more than it was charged, never past full). One store call, none on
    /// a no-op handle or when nothing is left to give back.
    pub async fn give_back(&self, units: u32) -> Result<(), crate::store::StoreError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let taken = inner
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                Some(left - units.min(left))
            })
            .unwrap_or(0);
        let n = units.min(taken);
        if n == 0 {
            return Ok(());
        }
        let refund = Check {
            slot: None,
            cost: -f64::from(n) * inner.scale,
            buckets: inner.buckets.clone(),
        };
        // Behind the breaker like any other call: while it is open a
        // refund fails at once instead of waiting out the deadline.
        if let Some(o) = inner.stores.give_back(inner.by, &refund).await? {
            let mut latest = inner.latest.lock().unwrap_or_else(|p| p.into_inner());
            *latest = Some(o.limits.into_iter().collect());
        }
        Ok(())
    }

    /// The response's headers after the refunds made so far: each refunded
    /// limit's state as the store reported it after the latest one. (The
    /// `local` policy's headers carry no remaining, so nothing to patch.)
    pub(crate) fn patch(&self, h: &mut RateHeaders) {
        let Some(inner) = &self.inner else {
            return;
        };
        let latest = inner.latest.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(states) = &*latest {
            for (&i, s) in inner.indices.iter().zip(states) {
                h.update(i, s);
            }
        }
    }
}

impl fmt::Debug for Refund {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refund")
            .field("refundable", &self.refundable())
            // Charged by the `local` failure policy's buckets.
            .field(
                "local",
                &self.inner.as_ref().is_some_and(|i| i.by.degraded()),
            )
            .finish_non_exhaustive()
    }
}
