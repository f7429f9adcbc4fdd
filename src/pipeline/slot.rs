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
use crate::store::{Check, Store};

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
/// One taken through the primary store is counted in flight here until
/// then (`held.rs`), for the `local` policy.
pub(super) struct Release {
    limiter: Arc<Limiter>,
    by: DecidedBy,
    key: String,
    slot: String,
    /// Counted in flight for the `local` policy (`held.rs`).
    counted: bool,
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
            let slot = slot.clone()?;
            // Only a store that can fail has `local` count them.
            let counted = by == DecidedBy::Primary && limiter.core.in_process.is_none();
            if counted {
                limiter.core.local.held().take(&key);
            }
            Some(Self {
                limiter: Arc::clone(&limiter),
                by,
                key,
                slot,
                counted,
            })
        })
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        match self.by {
            DecidedBy::Primary => {
                if self.counted {
                    self.limiter.core.local.held().give(&self.key);
                }
                self.limiter.store().release(&self.key, &self.slot);
            }
            DecidedBy::Fallback => self.limiter.fallback.release(&self.key, &self.slot),
        }
    }
}

/// The slots a check may take while the store is asked: until the answer
/// arrives the outcome is unknown (the script may run even if this request
/// is cancelled, or its call times out or fails), so unless
/// [`answered`](Self::answered) is called, `Drop` gives every slot back.
/// A release by id of a slot never taken removes nothing.
pub(super) struct Asking {
    store: Option<Arc<dyn Store>>,
    keys: Vec<String>,
    slot: String,
}

impl Asking {
    /// Nothing to give back (no allocation) for a check without a slot.
    pub(super) fn new(store: &Arc<dyn Store>, check: &Check) -> Self {
        let Some(slot) = &check.slot else {
            return Self {
                store: None,
                keys: Vec::new(),
                slot: String::new(),
            };
        };
        Self {
            store: Some(Arc::clone(store)),
            keys: (check.buckets.iter())
                .filter(|b| b.rule.is_concurrency())
                .map(|b| b.key.clone())
                .collect(),
            slot: slot.clone(),
        }
    }

    /// The store answered: the decision gives back what was taken.
    pub(super) fn answered(mut self) {
        self.store = None;
    }
}

impl Drop for Asking {
    fn drop(&mut self) {
        if let Some(store) = &self.store {
            for key in &self.keys {
                store.release(key, &self.slot);
            }
        }
    }
}
