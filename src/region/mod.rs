//! Regions: one global limit across regions that each keep their own
//! Redis. A request is decided by its own region's Redis in one call, as
//! any other, against that region's **quota** of the key: a share of the
//! limit's burst and refill. A background exchange moves quota toward the
//! regions that use it, and the sum of a key's shares never exceeds the
//! whole limit, at any moment, whatever is partitioned (`docs/regions.md`:
//! the protocol, its bound, what each failure does, with a picture).
//!
//! The parts, in the order a request meets them:
//!
//! - `crate::config::Regions` and `crate::route::Global`: `[regions]` and
//!   a limit's `scope = "global"`, as `crate::config` validated them (they
//!   sit below this module so that configuration and routes never import
//!   the runtime).
//! - `share.rs`: this instance's view of its region's shares, read from
//!   the region's Redis every quarter interval and trusted for three
//!   quarters. A global token bucket of share `s` is decided as a bucket of
//!   `s ×` the burst and `s ×` the refill: the same script, the same key,
//!   the same stored state (GCRA's burst in µs, capacity × emission
//!   interval, does not change with `s`; a token's step does). A view too
//!   old to be trusted is a Redis failure (the route's `on_redis_error`).
//!   `share.rs` also counts the demand: what each key was offered here
//!   this interval, bounded, published to the region's Redis at the
//!   interval's end.
//! - `exchange.rs`: once an interval, one instance per region (a lock in
//!   its Redis) reads every reachable region's demand and shares, works
//!   out the same targets every region would, and gives its region's
//!   excess away: its share is lowered first, the quota is held for longer
//!   than any view of the old share is trusted, then released and pushed
//!   to the receivers, which rescale the key's bucket (tokens kept, never
//!   made) before they raise their share. Totals given and received are
//!   cumulative, so a push repeated or lost is harmless: quota in flight is
//!   missing for a while, never counted twice.

use std::sync::Arc;

mod agreement;
#[cfg(feature = "redis")]
mod calls;
#[cfg(feature = "redis")]
mod contact;
#[cfg(feature = "redis")]
mod exchange;
#[cfg(feature = "redis")]
mod generation;
#[cfg(feature = "redis")]
mod handoff;
mod share;
#[cfg(feature = "redis")]
mod stranded;
#[cfg(feature = "redis")]
mod targets;

#[cfg(feature = "redis")]
pub(crate) use self::exchange::start;
pub(crate) use self::share::{Runtime, stored_share};

/// A generation of a region's exchange state (`docs/regions.md`): the id
/// its Redis was given when that state was first written, and whether it
/// replaced one that was lost (a key not claimed since is held by nobody).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Generation {
    pub(crate) id: Arc<str>,
    pub(crate) restart: bool,
    /// When it was created (Unix ms, Redis's clock; 0: not known).
    pub(crate) born: u64,
}

/// What this instance's exchange did since its layer was built (public
/// as [`Stats`](crate::layer::Stats)'s `region_*`, which says what each
/// counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RegionStats {
    pub(crate) moved: u64,
    pub(crate) rebalanced: u64,
    pub(crate) in_flight: u64,
    pub(crate) calls: u64,
    pub(crate) cycles: u64,
}

/// What the exchange did, since the layer was built.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Shares given away, summed (in millionths of a limit).
    pub(crate) moved: std::sync::atomic::AtomicU64,
    /// Hand-offs (one key, one cycle).
    pub(crate) rebalanced: std::sync::atomic::AtomicU64,
    /// Calls to any region's Redis.
    pub(crate) calls: std::sync::atomic::AtomicU64,
    /// Cycles this instance ran.
    pub(crate) cycles: std::sync::atomic::AtomicU64,
}

impl Stats {
    /// With `in_flight`, kept per global limit (`Runtime::stats` sums it).
    pub(crate) fn snapshot(&self, in_flight: u64) -> RegionStats {
        use std::sync::atomic::Ordering::Relaxed;
        RegionStats {
            moved: self.moved.load(Relaxed),
            rebalanced: self.rebalanced.load(Relaxed),
            in_flight,
            calls: self.calls.load(Relaxed),
            cycles: self.cycles.load(Relaxed),
        }
    }
}
