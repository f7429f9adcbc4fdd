//! Concurrency slots whose release failed (a network cut, a frozen or
//! restarting Redis): queued and sent again, so a blip holds a key's slots
//! about as long as the blip, not until their `max_hold`.
//!
//! A release is a `ZREM` of the request's slot id, unique over the fleet:
//! sent twice, late, or after the slot expired, it removes that slot or
//! nothing. So any failure is sent again, a timeout too (it may have run).
//!
//! - Bounded: at most [`MAX_QUEUED`] per store; beyond, the oldest is
//!   dropped (counted): its slot counts until its `max_hold`, as a slot
//!   an instance never gave back does.
//! - Paced: one task per store while the queue is not empty. It sends the
//!   queue again [`FIRST_PAUSE`] after a failure, the pause doubling to
//!   [`MAX_PAUSE`] while it fails, and sooner (at least [`FIRST_PAUSE`]
//!   after the last round) when a check of this store was answered since. A round stops at a node's first
//!   failure (one call knocks on a Redis that is down, not the whole
//!   queue); the rest wait for the next round.
//! - Routed: each `ZREM` goes to the primary owning its key
//!   ([`Inner::release`]), as the check that took the slot did.
//! - Ends: when the queue is empty, when the store is dropped (the task
//!   holds it weakly), and an entry is let go after [`RETRY_FOR`], the
//!   longest `max_hold` (counted: by then its slot no longer counts).
//! - A `WRONGTYPE` (the key is not a set of slots: someone wrote over it)
//!   is an answer, not a failure: nothing of that request is there to
//!   remove. Not sent again (counted); the key's next check repairs it.

use std::sync::{Arc, Weak};

use fred::clients::Pool;
use tokio::time::Instant;

use super::release_queue::{FIRST_PAUSE, MAX_PAUSE, MAX_QUEUED, Queued, RETRY_FOR, TICK};
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};

use super::deadline::{Stamp, within};
use super::reply::map_err;
use super::script::Inner;
use crate::metrics::SlotRelease;
use crate::store::StoreError;

impl Inner {
    /// [`release`](Self::release) within the deadline; a failure is
    /// queued to be sent again (see `release.rs`).
    pub(crate) async fn release_bounded(self: &Arc<Self>, pool: &Pool, key: &str, slot: &str) {
        if let Err(e) = self.release_within(pool, key, slot).await {
            self.release_failed(pool, key, slot, &e);
        }
    }

    /// [`release`](Self::release), waited for within the deadline.
    pub(crate) async fn release_within(
        &self,
        pool: &Pool,
        key: &str,
        slot: &str,
    ) -> Result<(), StoreError> {
        let stamp = Stamp::new(self.deadline, &self.stalls);
        let mut release = std::pin::pin!(self.release(pool, key, slot));
        within(&mut release, self.deadline, stamp, &self.io, &self.stalls)
            .await
            .unwrap_or(Err(StoreError::Timeout))
    }

    /// `ZREM` of a concurrency slot from its key's set, on the primary
    /// owning the key on a cluster; fail-fast, one attempt, the caller
    /// bounds it by the deadline.
    pub(crate) async fn release(
        &self,
        pool: &Pool,
        key: &str,
        slot: &str,
    ) -> Result<(), StoreError> {
        let node;
        let pool = match &self.nodes {
            Some(nodes) => {
                node = nodes.for_slot(fred::util::redis_keyslot(key.as_bytes()))?;
                &node.pool
            }
            None => pool,
        };
        let zrem = CustomCommand::new_static("ZREM", ClusterHash::FirstKey, false);
        let _removed: Value = pool
            .with_options(&self.options)
            .custom(zrem, vec![Value::from(key), Value::from(slot)])
            .await
            .map_err(map_err)?;
        Ok(())
    }

    /// A release of `slot` from `key` failed with `e`: queued to be sent
    /// again, unless Redis refused it on the key's data.
    pub(crate) fn release_failed(
        self: &Arc<Self>,
        pool: &Pool,
        key: &str,
        slot: &str,
        e: &StoreError,
    ) {
        if refused(e) {
            return self.release_refused(e);
        }
        self.metrics.slot_release(SlotRelease::Failed, 1);
        if let Some(suppressed) = self.release_log.event() {
            tracing::warn!(
                target: "fleetlimit",
                error = %e,
                suppressed,
                "could not release a concurrency slot: sent again when Redis answers"
            );
        }
        let q = Queued {
            key: key.to_owned(),
            slot: slot.to_owned(),
            since: Instant::now(),
        };
        let (dropped, start) = self.releases.put(vec![q], false);
        self.dropped(dropped);
        if start {
            let task = drain(Arc::downgrade(self), pool.clone());
            // On the caller's runtime when there is one; else on fred's own.
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(task)),
                Err(_) => drop(self.io.spawn(task)),
            }
        }
    }

    fn dropped(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.metrics.slot_release(SlotRelease::Dropped, n as u64);
        tracing::warn!(
            target: "fleetlimit",
            dropped = n,
            max = MAX_QUEUED,
            "too many concurrency slots to release: the oldest count until their max_hold"
        );
    }

    fn release_refused(&self, e: &StoreError) {
        self.metrics.slot_release(SlotRelease::Refused, 1);
        tracing::warn!(
            target: "fleetlimit",
            error = %e,
            "a concurrency slot's key is not a set of slots: nothing to release"
        );
    }

    /// The primary owning `key` (`None`: standalone, or not known).
    fn node_of(&self, key: &str) -> Option<(String, u16)> {
        let nodes = self.nodes.as_ref()?;
        nodes.owner(fred::util::redis_keyslot(key.as_bytes()))
    }

    /// Sends `batch` once; what still fails, in order. Stops at a node's
    /// first failure: its other entries are not sent this round.
    async fn round(&self, pool: &Pool, batch: Vec<Queued>) -> (Vec<Queued>, bool) {
        let mut failed = Vec::new();
        let mut down: Vec<Option<(String, u16)>> = Vec::new();
        let mut sent = false;
        for q in batch {
            if q.since.elapsed() > RETRY_FOR {
                self.metrics.slot_release(SlotRelease::Expired, 1);
                continue;
            }
            let node = self.node_of(&q.key);
            if down.contains(&node) {
                failed.push(q);
                continue;
            }
            match self.release_within(pool, &q.key, &q.slot).await {
                Ok(()) => {
                    sent = true;
                    self.metrics.slot_release(SlotRelease::Retried, 1);
                }
                Err(e) if refused(&e) => self.release_refused(&e),
                Err(_) => {
                    down.push(node);
                    failed.push(q);
                }
            }
        }
        (failed, sent)
    }
}

/// Redis answered the `ZREM` with an error on the key's data.
fn refused(e: &StoreError) -> bool {
    matches!(e, StoreError::Redis(text) | StoreError::Script(text) if text.contains("WRONGTYPE"))
}

/// Sends a store's queue until it is empty or the store is gone.
async fn drain(inner: Weak<Inner>, pool: Pool) {
    let mut pause = FIRST_PAUSE;
    let mut last = Instant::now();
    let mut answered = inner.upgrade().map_or(0, |i| i.health.last_answer());
    loop {
        tokio::time::sleep(TICK).await;
        let Some(inner) = inner.upgrade() else { return };
        // A check answered since the last round: Redis is back (on a
        // cluster, maybe another primary: rounds stay FIRST_PAUSE apart).
        let back = inner.health.last_answer() != answered;
        let since = last.elapsed();
        if since < pause && !(back && since >= FIRST_PAUSE) {
            continue;
        }
        answered = inner.health.last_answer();
        let Some(batch) = inner.releases.take() else {
            return;
        };
        let (failed, sent) = inner.round(&pool, batch).await;
        let all = failed.is_empty();
        let (dropped, _) = inner.releases.put(failed, true);
        inner.dropped(dropped);
        pause = if sent || all {
            FIRST_PAUSE
        } else {
            (pause * 2).min(MAX_PAUSE)
        };
        last = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::release_queue::Releases;

    fn q(n: usize) -> Queued {
        Queued {
            key: "k".into(),
            slot: n.to_string(),
            since: Instant::now(),
        }
    }

    #[test]
    fn bounded_the_oldest_dropped_and_one_task() {
        let r = Releases::new();
        let (dropped, start) = r.put(vec![q(0)], false);
        assert_eq!((dropped, start), (0, true));
        let (dropped, start) = r.put((1..MAX_QUEUED + 10).map(q).collect(), false);
        assert_eq!((dropped, start), (10, false), "a task runs already");
        assert_eq!(r.len(), MAX_QUEUED);
        let all = r.take().unwrap();
        assert_eq!(all[0].slot, "10", "the oldest went");
        assert_eq!(all.last().unwrap().slot, (MAX_QUEUED + 9).to_string());
        // During a round, its entries count against the bound.
        let (dropped, _) = r.put((0..5).map(|n| q(MAX_QUEUED + n)).collect(), false);
        assert_eq!(dropped, 5);
        assert_eq!(r.len(), 0);
        assert_eq!(r.put(Vec::new(), true), (0, false), "the round is over");
        // A round puts the failed back before what came meanwhile.
        r.put(vec![q(100)], false);
        r.put(vec![q(1), q(2)], true);
        let order: Vec<String> = r.take().unwrap().into_iter().map(|q| q.slot).collect();
        assert_eq!(order, ["1", "2", "100"]);
        // Empty: the task ends, and the next failure starts one.
        assert!(r.take().is_none());
        assert_eq!(r.put(vec![q(3)], false), (0, true));
    }

    #[test]
    fn wrongtype_is_an_answer_other_errors_are_sent_again() {
        let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
        assert!(refused(&StoreError::Redis(wrongtype.into())));
        assert!(!refused(&StoreError::Timeout));
        assert!(!refused(&StoreError::Unavailable("reset".into())));
        assert!(!refused(&StoreError::Redis("OOM".into())));
    }
}
