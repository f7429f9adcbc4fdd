//! The one small trait between the layer and where counts live.
//!
//! A [`Store`] decides a [`Check`] — every bucket of one request, all or
//! nothing — and answers an [`Outcome`] or a [`StoreError`]. The layer knows
//! nothing of Redis; [`RedisStore`] knows nothing of HTTP; [`MemoryStore`]
//! serves both as the embedded default and as the `local` fallback.

// `StoreError` is public at the crate root: applications meet it first.
pub(crate) mod error;
mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

pub(crate) use self::error::StoreError;
pub use self::memory::MemoryStore;
/// Not API (the public surface's budget, docs/api.md): for tests.
#[cfg(feature = "redis")]
#[doc(hidden)]
pub use self::redis::Redirects;
#[cfg(feature = "redis")]
pub use self::redis::RedisStore;
pub use crate::algorithm::{LimitState, Rule};

/// The future a store returns: boxed, so stores are interchangeable behind
/// `Arc<dyn Store>` (see [`Store`] for one written by hand).
///
/// ```
/// use fleetlimit::store::{Outcome, StoreFuture};
///
/// // An answer known at once, boxed like any other.
/// let ready: StoreFuture = Box::pin(async { Ok(Outcome { allowed: true, limits: vec![] }) });
/// # drop(ready);
/// ```
pub type StoreFuture = Pin<Box<dyn Future<Output = Result<Outcome, StoreError>> + Send + 'static>>;

/// What `Store::lease` returns: the units taken and the bucket after
/// them (a [`Lease`]'s parts, as the trait's hidden method cannot name a
/// crate-private type), boxed as [`StoreFuture`].
pub(crate) type LeaseFuture =
    Pin<Box<dyn Future<Output = Result<(f64, LimitState), StoreError>> + Send + 'static>>;

/// A hot key's lease (see `Store::lease`): the units taken, and the
/// bucket after it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Lease {
    /// Units taken: a whole number of the lease's steps, at most the
    /// check's cost, `0` when not even one step was free.
    pub(crate) granted: f64,
    /// The bucket after the lease (`enough`: something was taken); its
    /// `wait` is the seconds until the check's whole cost fits again.
    pub(crate) state: LimitState,
}

impl Lease {
    /// What `Store::lease` answers.
    pub(crate) fn into_parts(self) -> (f64, LimitState) {
        (self.granted, self.state)
    }
}

/// Where rate-limit state lives. Bring your own with
/// [`RateLimitLayer::with_store`](crate::RateLimitLayer::with_store).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use fleetlimit::store::{Check, MemoryStore, Store, StoreFuture};
/// use fleetlimit::{Config, RateLimitLayer};
///
/// /// The in-process store, counting the checks it decides.
/// #[derive(Debug)]
/// struct Counted {
///     inner: MemoryStore,
///     checks: AtomicU64,
/// }
///
/// impl Store for Counted {
///     fn check(&self, check: &Check) -> StoreFuture {
///         self.checks.fetch_add(1, Ordering::Relaxed);
///         self.inner.check(check)
///     }
///     fn release(&self, key: &str, slot: &str) {
///         self.inner.release(key, slot)
///     }
/// }
///
/// # async fn f(cfg: Config) -> Result<(), fleetlimit::BuildError> {
/// let store = Arc::new(Counted { inner: MemoryStore::new(10_000), checks: AtomicU64::new(0) });
/// let layer = RateLimitLayer::with_store(cfg, store).await?;
/// # drop(layer); Ok(()) }
/// ```
pub trait Store: fmt::Debug + Send + Sync + 'static {
    /// Decides one request: if every bucket holds `cost` tokens, take them
    /// from all; otherwise take none. Must finish within the store's own
    /// deadline.
    fn check(&self, check: &Check) -> StoreFuture;

    /// The failure domains (e.g. Redis Cluster primaries, as `host:port`)
    /// this check goes to, each with its own circuit breaker. Empty (the
    /// default): the store is one domain.
    fn nodes(&self, _check: &Check) -> Vec<String> {
        Vec::new()
    }

    /// Gives back the concurrency slot `slot` (a [`Check::slot`]) of the
    /// bucket at `key`, when the request that took it is over. Must not
    /// block: a store that answers later sends it in the background, and a
    /// slot it fails to give back counts until its deadline (`max_hold`).
    /// The default: nothing (a store without concurrency limits).
    fn release(&self, _key: &str, _slot: &str) {}

    /// A hot key's partial lease (`lease_batch`): takes from the check's
    /// only bucket, a token bucket, as many whole `step`s (one request's
    /// cost each) as are free, at most the check's cost, possibly none,
    /// and says when the whole cost will fit again: the units taken and
    /// the bucket after them. Not API (the crate's stores answer it in one
    /// step): keep the default, all or nothing by
    /// [`check`](Store::check) (its refusal's `wait` is that time).
    #[doc(hidden)]
    fn lease(&self, check: &Check, step: f64) -> LeaseFuture {
        let _ = step;
        let cost = check.cost;
        let answer = self.check(check);
        Box::pin(async move {
            let o = answer.await?;
            let state =
                o.limits.first().copied().ok_or_else(|| {
                    StoreError::Protocol("a lease's answer has no bucket".to_owned())
                })?;
            let granted = if o.allowed { cost } else { 0.0 };
            Ok((granted, state))
        })
    }

    /// Decides `check` at once, without a future, into `outcome` (its
    /// vector reused), when this store never waits: `true` when it did. A
    /// store answers every check here or none (the layer asks once, with an
    /// empty check, when it is built); one that does is the in-process
    /// store, which cannot fail, so the layer gives it no circuit breaker,
    /// refused-key cache or key digest. Public only because the trait is:
    /// keep the default, `false` (a store wrapping a [`MemoryStore`] is a
    /// store of its own, decided through [`check`](Store::check)).
    #[doc(hidden)]
    fn decide_now(&self, check: &Check, outcome: &mut Outcome) -> bool {
        let _ = (check, outcome);
        false
    }
}

/// A store's answer for one request (see [`Check`] for a whole round).
///
/// ```
/// use fleetlimit::store::{LimitState, Outcome};
///
/// let refused = Outcome {
///     allowed: false,
///     limits: vec![LimitState { enough: false, remaining: 0.4, wait: 0.6, reset: 9.6, capacity: 10.0 }],
/// };
/// // What a client would be told: retry after the wait, rounded up.
/// assert_eq!(refused.limits[0].wait.ceil(), 1.0);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Every enforced limit had room, and each limit with room was charged.
    /// When `false`, none was charged.
    pub allowed: bool,
    /// One entry per bucket of the [`Check`], in order.
    pub limits: Vec<LimitState>,
}

/// Every limit one request is counted against, decided all or nothing.
///
/// ```
/// use fleetlimit::store::{Bucket, Check, MemoryStore, Rule, Store};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fleetlimit::StoreError> {
/// let store = MemoryStore::new(1000);
/// let bucket = |key: &str, capacity| Bucket {
///     key: key.into(),
///     rule: Rule::TokenBucket { capacity, refill_per_sec: 0.001 },
///     shadow: false,
/// };
/// // A tenant's bucket inside a shared one: both take 3, or neither does.
/// let check = Check {
///     cost: 3.0,
///     buckets: vec![bucket("rl:tenant:{a}", 5.0), bucket("rl:all:{g}", 100.0)],
///     slot: None,
/// };
/// let first = store.check(&check).await?;
/// assert!(first.allowed);
/// assert_eq!(first.limits[0].remaining.floor(), 2.0);
/// // The tenant has 2 left: refused, and the shared bucket is not charged.
/// let second = store.check(&check).await?;
/// assert!(!second.allowed && !second.limits[0].enough);
/// assert_eq!(second.limits[1].remaining.floor(), 97.0);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// Units each limit must give. A negative cost is a refund: it gives
    /// units back (never past full) and is always "allowed".
    pub cost: f64,
    /// The buckets, in the route's order.
    pub buckets: Vec<Bucket>,
    /// The request's slot id, unique fleet-wide: what a concurrency limit
    /// (see [`Rule::Concurrency`]) records the request under, to
    /// [`release`](Store::release) it later. `None` for a check without a
    /// concurrency limit (or a refund). Give one to every check with a
    /// concurrency limit: without it the slot cannot be released, only its
    /// deadline frees it, and the stores differ (Redis records every
    /// anonymous slot as the same member, the in-process store counts each).
    pub slot: Option<String>,
}

/// One limit's bucket, by key.
///
/// ```
/// use fleetlimit::store::{Bucket, Rule};
///
/// // 10 at once, then one every 6 s, counted but never refused (shadow).
/// let b = Bucket {
///     key: "rl:per-key:{h:abc}".into(),
///     rule: Rule::TokenBucket { capacity: 10.0, refill_per_sec: 1.0 / 6.0 },
///     shadow: true,
/// };
/// assert_eq!(b.rule.capacity(), 10.0);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    /// The full store key, e.g. `rl:per-key:{h:abc}`.
    pub key: String,
    /// The algorithm and its numbers.
    pub rule: Rule,
    /// Shadow mode: counted when it has room, never refuses.
    pub shadow: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    // The removed `Lease` example: 3 requests of cost 2 were free of the
    // 10 asked for, so 6 units were taken; `Store::lease` answers them
    // with the bucket after, as they were.
    #[test]
    fn a_short_lease_answers_the_units_taken_and_the_bucket_after() {
        let state = LimitState {
            enough: true,
            remaining: 0.5,
            wait: 0.95,
            reset: 9.95,
            capacity: 10.0,
        };
        let short = Lease {
            granted: 6.0,
            state,
        };
        assert!(short.granted < 20.0);
        assert_eq!(short.into_parts(), (6.0, state));
    }
}
