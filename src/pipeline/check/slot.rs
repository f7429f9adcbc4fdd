//! Concurrency slots: the id a request's slot is recorded under, and the
//! guard that gives back what a check may have taken while the store is
//! asked (an admitted request's slot is given back by `settle/release.rs`).
//!
//! An id is `<instance>:<n>`: a random 64-bit number drawn when the limiter
//! is built, and a counter. Unique over the fleet without coordination, so
//! a release (a `ZREM` by id) removes this request's slot and no other.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::{Bucket, Check, Store};

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
    pub(super) fn for_buckets(&self, buckets: &[Bucket]) -> Option<String> {
        if !buckets.iter().any(|b| b.rule.is_concurrency()) {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Some(format!("{:016x}:{n}", self.instance))
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
