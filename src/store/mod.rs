//! The one small trait between the layer and where counts live.
//!
//! A [`Store`] decides a [`Check`] — every bucket of one request, all or
//! nothing — and answers an [`Outcome`] or a [`StoreError`]. The layer knows
//! nothing of Redis; [`RedisStore`] knows nothing of HTTP; [`MemoryStore`]
//! serves both as the embedded default and as the `local` fallback.

mod memory;
pub(crate) mod redis;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

pub use self::memory::MemoryStore;
pub use self::redis::RedisStore;
use crate::algorithm::LimitState;
pub use crate::algorithm::Rule;

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

/// Why a store could not decide. The outcome of a timed-out command is
/// unknown: Redis may still have run it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// No answer within the deadline.
    Timeout,
    /// Not connected, connection refused or broken.
    Unavailable(String),
    /// Redis answered with an error (script error, cluster error, OOM...).
    Redis(String),
    /// An answer the store did not understand.
    Protocol(String),
    /// Redis is serving, but a command of the script failed on the data or
    /// numbers of this check (a value Redis refuses, a key the scripts could
    /// not repair). The check's key alone is concerned: this never counts
    /// against the store in the circuit breaker.
    Script(String),
    /// Not asked: this process already has as many checks waiting for
    /// Redis as it queues (its own overload, not Redis's), so this one is
    /// decided by the failure policy at once. Never counts against the
    /// store in the circuit breaker.
    Overloaded,
    /// Not asked: the circuit breaker is open after repeated failures.
    CircuitOpen,
}

impl StoreError {
    /// Whether the error says the store is not serving (down, slow, not
    /// understood), as opposed to one check's data ([`Script`](Self::Script))
    /// or this process's own queue ([`Overloaded`](Self::Overloaded)): only
    /// these count toward opening the circuit breaker.
    #[must_use]
    pub fn is_availability(&self) -> bool {
        !matches!(self, Self::Script(_) | Self::Overloaded)
    }

    /// A short label for logs and metrics.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Unavailable(_) => "unavailable",
            Self::Redis(_) => "redis-error",
            Self::Protocol(_) => "protocol",
            Self::Script(_) => "script-error",
            Self::Overloaded => "overloaded",
            Self::CircuitOpen => "circuit-open",
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("no answer within the deadline"),
            Self::Unavailable(e) => write!(f, "store unavailable: {e}"),
            Self::Redis(e) => write!(f, "redis error: {e}"),
            Self::Protocol(e) => write!(f, "unexpected answer: {e}"),
            Self::Script(e) => write!(f, "script failed on this check's data: {e}"),
            Self::Overloaded => f.write_str(
                "too many checks waiting for Redis in this process: the store was not asked",
            ),
            Self::CircuitOpen => f.write_str("circuit breaker open: the store was not asked"),
        }
    }
}

impl std::error::Error for StoreError {}
