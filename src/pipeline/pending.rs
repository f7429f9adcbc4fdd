//! A request being decided: what the key step writes, the check step asks
//! and settle reads. One per thread is reused (see [`Pending::with`]), so
//! a request decided at once writes its keys into buffers that are already
//! there; a request that waits takes its own.

use std::cell::RefCell;
use std::sync::Arc;

use tokio::time::Instant;

use crate::algorithm::Rule;
use crate::key::LogId;
use crate::store::{Check, Outcome};

/// A request to decide (see the module guide).
pub(crate) struct Pending {
    /// The request's cost, in the route's units.
    pub(super) cost: u32,
    /// What the store is asked: each limit's bucket (key, numbers, shadow),
    /// in the route's order, the units charged and the slot id. The
    /// `local` failure policy rewrites it to what it charged.
    pub(super) check: Check,
    /// One per limit, in order: what the logs and headers say of it.
    pub(super) keys: Vec<KeyInfo>,
    /// The store's answer, once there is one.
    pub(super) outcome: Outcome,
    /// The refused cache's resets when Redis was asked (see `reset.rs`).
    pub(super) resets_seen: u64,
    /// When Redis was asked: a refusal is remembered from then, as Redis
    /// decided it after that (see `check/refused.rs`).
    pub(super) asked_at: Option<Instant>,
    /// A global limit's share in this region is not known now (`region/`):
    /// decided as if Redis had failed.
    pub(super) quota_unknown: bool,
}

/// One limit's part of a request, beside its bucket.
pub(super) struct KeyInfo {
    /// The key's id for logs (read from its bucket's key).
    pub(super) log_id: LogId,
    /// The key value plans are looked up by, for limits that have plans.
    pub(super) plan_key: Option<String>,
    /// The caller's plan, once looked up (kept for decision records).
    pub(super) plan: Option<Arc<str>>,
    /// The limit's numbers under the caller's plan: the fleet's, for the
    /// headers, even when the bucket holds a share of them.
    pub(super) rule: Rule,
}

thread_local! {
    /// The pending request of this thread's synchronous decisions.
    static PENDING: RefCell<Pending> = const { RefCell::new(Pending::EMPTY) };
}

impl Pending {
    /// A request with no key yet, its buffers empty.
    const EMPTY: Self = Self {
        cost: 0,
        check: Check {
            cost: 0.0,
            buckets: Vec::new(),
            slot: None,
        },
        keys: Vec::new(),
        outcome: Outcome {
            allowed: false,
            limits: Vec::new(),
        },
        resets_seen: 0,
        asked_at: None,
        quota_unknown: false,
    };
}

impl Pending {
    /// `f` on this thread's pending request, its buffers kept from the last
    /// one. Taken already only if a log line of this thread's decision came
    /// back here (a subscriber calling the layer): then a new one.
    #[inline]
    pub(super) fn with<R>(f: impl FnOnce(&mut Pending) -> R) -> R {
        PENDING.with(|cell| match cell.try_borrow_mut() {
            Ok(mut p) => f(&mut p),
            Err(_) => {
                let mut own = Pending::EMPTY;
                f(&mut own)
            }
        })
    }

    /// Starts a new request (the buckets' keys are written over by the key
    /// step).
    #[inline]
    pub(super) fn start(&mut self) {
        self.check.slot = None;
        self.keys.clear();
        self.resets_seen = 0;
        self.asked_at = None;
        self.quota_unknown = false;
    }

    /// This request, moved out to wait (the thread's buffers stay, empty).
    pub(super) fn take(&mut self) -> Self {
        std::mem::replace(self, Self::EMPTY)
    }

    /// Limit `i`'s key id for logs, shown with its key.
    pub(super) fn shown_id(&self, i: usize) -> crate::key::ShownId<'_> {
        self.keys[i].log_id.of(&self.check.buckets[i].key)
    }

    /// Each limit's numbers under the caller's plan, in order.
    pub(super) fn rules(&self) -> impl Iterator<Item = &Rule> + '_ {
        self.keys.iter().map(|k| &k.rule)
    }
}
