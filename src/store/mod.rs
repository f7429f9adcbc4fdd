//! The one small trait between the layer and where counts live.
//!
//! A [`Store`] decides a [`Check`] — every bucket of one request, all or
//! nothing — and answers an [`Outcome`] or a [`StoreError`]. The layer knows
//! nothing of Redis; [`RedisStore`] knows nothing of HTTP; [`MemoryStore`]
//! serves both as the embedded default and as the `local` fallback.

// `StoreError` is public at the crate root: applications meet it first.
pub(crate) mod error;
mod memory;
pub(crate) mod redis;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

pub(crate) use self::error::StoreError;
pub use self::memory::MemoryStore;
pub use self::redis::RedisStore;
pub use crate::algorithm::{LimitState, Rule};

/// The future a store returns: boxed, so stores are interchangeable behind
/// `Arc<dyn Store>`.
pub type StoreFuture = Pin<Box<dyn Future<Output = Result<Outcome, StoreError>> + Send + 'static>>;

/// Where rate-limit state lives.
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
}

/// A store's answer for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Every enforced limit had room, and each limit with room was charged.
    /// When `false`, none was charged.
    pub allowed: bool,
    /// One entry per bucket of the [`Check`], in order.
    pub limits: Vec<LimitState>,
}

/// Every limit one request is counted against, decided all or nothing.
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
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    /// The full store key, e.g. `rl:per-key:{h:abc}`.
    pub key: String,
    /// The algorithm and its numbers.
    pub rule: Rule,
    /// Shadow mode: counted when it has room, never refuses.
    pub shadow: bool,
}
