//! Concurrency slots: the id a request's slot is recorded under, and the
//! guard that gives the slot back when the response is over.
//!
//! An id is `<instance>:<n>`: a random 64-bit number drawn when the limiter
//! is built, and a counter. Unique over the fleet without coordination, so
//! a release (a `ZREM` by id) removes this request's slot and no other.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Buckets, DecidedBy, Limiter};
use crate::algorithm::LimitState;

/// Makes the slot ids of one limiter.
pub(super) struct SlotIds {
    instance: u64,
    next: AtomicU64,
}

impl SlotIds {
    pub(super) fn new() -> Self {
        // std's per-process random keys, mixed with the process and the
        // time: two instances drawing the same number is 2^-64 unlikely.
        let mut h = RandomState::new().build_hasher();
        std::process::id().hash(&mut h);
        std::time::SystemTime::now().hash(&mut h);
        Self {
            instance: h.finish(),
            next: AtomicU64::new(0),
        }
    }

    /// A new id, for a request counted against a concurrency limit; `None`
    /// (no allocation) for any other.
    pub(super) fn for_buckets(&self, buckets: &Buckets) -> Option<String> {
        if !buckets.iter().any(|b| b.rule.is_concurrency()) {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Some(format!("{:016x}:{n}", self.instance))
    }
}

/// A slot taken by an admitted request: its `Drop` gives it back to the
/// store that decided (Redis in the background, or the in-process store).
pub(super) struct Release {
    limiter: Arc<Limiter>,
    by: DecidedBy,
    key: String,
    slot: String,
}

impl Release {
    /// A guard for each concurrency bucket the request was counted in.
    pub(super) fn taken(
        limiter: &Arc<Limiter>,
        buckets: &Buckets,
        limits: &[LimitState],
        slot: Option<&str>,
        by: DecidedBy,
    ) -> impl Iterator<Item = Self> {
        let limiter = Arc::clone(limiter);
        let slot = slot.map(str::to_owned);
        let taken: Vec<String> = buckets
            .iter()
            .zip(limits)
            .filter(|(b, s)| b.rule.is_concurrency() && s.enough)
            .map(|(b, _)| b.key.clone())
            .collect();
        taken.into_iter().filter_map(move |key| {
            Some(Self {
                limiter: Arc::clone(&limiter),
                by,
                key,
                slot: slot.clone()?,
            })
        })
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        match self.by {
            DecidedBy::Primary => self.limiter.store().release(&self.key, &self.slot),
            DecidedBy::Fallback => self.limiter.fallback.release(&self.key, &self.slot),
        }
    }
}
