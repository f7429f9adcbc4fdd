//! Write-back after `local`: what this instance admitted from its share
//! while the primary store failed is charged to it once it answers again,
//! so a key does not get its whole Redis bucket back after an outage.
//!
//! Each admission of the `local` policy adds its cost to a ledger, per
//! store key, under the limit's full rule (not the share). A task drains
//! the ledger (one per layer, started by the first entry, ending when the
//! ledger is empty or the layer is gone): after a random delay of up to
//! [`SPREAD`] (a recovering fleet does not charge Redis all at once), it
//! charges each key's units in one check through the circuit breaker, at
//! most [`BATCH`] keys per [`PACE`]; while the store still fails it tries
//! again later (backing off to [`MAX_BACKOFF`]), the entries kept.
//!
//! What the write-back costs in precision (docs/accuracy.md):
//! - a key is never put in debt: when its bucket holds less than what was
//!   admitted locally, what it holds is charged (the rest is "clamped");
//! - a charge still weighs only within its rule's horizon (a token
//!   bucket's full refill, a window, two sliding windows): an entry older
//!   than that is dropped ("expired"), as its units would have come back;
//! - the ledger is bounded (the in-process store's key bound): a key it
//!   forgets, and a limit a reload changed or removed, are "lost", counted;
//! - the units are charged when written back, not when admitted: a token
//!   bucket refills them from then (an over-count of at most the outage's
//!   length of refill);
//! - exactly once: a write-back given up on is charged by Redis only
//!   inside its deadline ("not after" on Redis's clock), and one whose
//!   answer comes late is given back (store/redis/script.rs `settle`), so
//!   the entry, kept until an answer says charged, is charged once — but
//!   for an answer lost in the network after Redis ran it (counted as an
//!   unknown outcome).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::time::{Duration, Instant};

use crate::bounded::{Bounded, Evict};
use crate::metrics::WriteBackUnits;
use crate::store::{Bucket, Check, Outcome, StoreError};

/// What the write-back needs of the layer: its ledger, and the primary
/// store behind the breaker (the layer's core; a trait, so this file does
/// not import the pipeline it belongs to).
pub(crate) trait Primary: Send + Sync + 'static {
    fn write_back(&self) -> &WriteBack;
    fn ask<'a>(
        &'a self,
        check: &'a Check,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Outcome, StoreError>> + Send + 'a>>;
}

/// The longest a recovering instance waits before its first write-back.
pub(crate) const SPREAD: Duration = Duration::from_secs(1);
/// Keys written back per round.
pub(crate) const BATCH: usize = 64;
/// Between rounds (so at most 1,280 keys a second per instance).
pub(crate) const PACE: Duration = Duration::from_millis(50);
/// The longest wait between tries while the store fails.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// One key's units admitted locally, not yet written back.
#[derive(Debug)]
struct Entry {
    bucket: Bucket,
    units: f64,
    /// The first admission not written back, and the last.
    first: Instant,
    last: Instant,
    /// Units dropped with the entry (evicted, or forgotten) count as lost.
    lost: Arc<WriteBackUnits>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.units > 0.0 {
            self.lost.lost(self.units);
        }
    }
}

impl Entry {
    /// Whether its units no longer weigh on the key (see the module guide).
    fn stale(&self, now: Instant) -> bool {
        self.bucket
            .rule
            .horizon()
            .is_some_and(|h| now.saturating_duration_since(self.first) >= h)
    }

    /// Takes its units: the entry then drops without counting them lost.
    fn take(&mut self) -> f64 {
        std::mem::take(&mut self.units)
    }
}

impl Evict for Entry {
    type Time = Instant;
    fn expired(&self, now: Instant) -> bool {
        self.stale(now)
    }
    fn rank(&self) -> Instant {
        self.last
    }
}

/// What `local` admitted, by store key, waiting to be written back.
pub(crate) struct WriteBack {
    ledger: Bounded<Entry>,
    /// The drain task runs.
    running: AtomicBool,
    units: Arc<WriteBackUnits>,
    /// Reloads that forgot entries so far. Units taken out before one and
    /// put back after may be a removed limit's: they are counted lost, not
    /// put back (a put-back and a forgetting hold this lock in turn).
    forgets: Mutex<u64>,
}

impl WriteBack {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            ledger: Bounded::new(max_keys),
            running: AtomicBool::new(false),
            units: Arc::new(WriteBackUnits::new()),
            forgets: Mutex::new(0),
        }
    }

    /// `local` admitted `cost` units of `bucket` (under its full rule).
    pub(crate) fn admitted(&self, bucket: &Bucket, cost: f64) {
        if bucket.rule.is_concurrency() || cost <= 0.0 {
            return;
        }
        let now = Instant::now();
        let mut slot = self.ledger.slot(&bucket.key);
        let e = self.entry(&mut slot, bucket, now);
        if e.bucket.rule != bucket.rule {
            // Another plan's numbers for the same key: the newer ones.
            let old = e.take();
            e.lost.lost(old);
            e.bucket.rule = bucket.rule;
            e.first = now;
        }
        e.units += cost;
        e.last = now;
    }

    /// Units `local` admitted and a refund gave back to its buckets.
    pub(crate) fn refunded(&self, key: &str, units: f64) {
        if let Some(e) = self.ledger.slot(key).get_mut() {
            e.units = (e.units - units).max(0.0);
        }
    }

    /// Forgets the entries of limits `keep` refuses (a reload changed
    /// their numbers or removed them): counted lost. Store keys are
    /// `<prefix>:<limit>:{…}`.
    pub(crate) fn retain_limits(&self, prefix: &str, keep: impl Fn(&str) -> bool) {
        let mut forgets = crate::sync::lock(&self.forgets);
        *forgets += 1;
        self.ledger.retain(|key| {
            let limit = key
                .strip_prefix(prefix)
                .and_then(|k| k.strip_prefix(':'))
                .and_then(|k| k.split(':').next());
            limit.is_none_or(&keep)
        });
    }

    /// Up to `n` entries taken out of the ledger (their units with them),
    /// and the forgettings so far, for [`put_back`](Self::put_back); stale
    /// ones are counted expired instead.
    fn take(&self, n: usize) -> (Vec<(Bucket, f64)>, u64) {
        let forgets = *crate::sync::lock(&self.forgets);
        let now = Instant::now();
        let mut out = Vec::new();
        for (_, mut e) in self.ledger.take_some(n) {
            if e.stale(now) {
                self.units.expired(e.take());
            } else if e.units > 0.0 {
                let units = e.take();
                out.push((e.bucket.clone(), units));
            }
        }
        (out, forgets)
    }

    /// Puts back what could not be written back (the store failed), taken
    /// out after `forgets` forgettings: lost instead when a reload forgot
    /// entries since (its limit may be gone).
    fn put_back(&self, bucket: Bucket, units: f64, forgets: u64) {
        let now_forgets = crate::sync::lock(&self.forgets);
        if *now_forgets != forgets {
            self.units.lost(units);
            return;
        }
        let mut slot = self.ledger.slot(&bucket.key);
        self.entry(&mut slot, &bucket, Instant::now()).units += units;
    }

    /// The bucket's entry in its locked `slot`, made empty if absent.
    fn entry<'s>(
        &self,
        slot: &'s mut crate::bounded::Slot<'_, '_, Entry>,
        bucket: &Bucket,
        now: Instant,
    ) -> &'s mut Entry {
        slot.get_or_insert_with(now, || Entry {
            bucket: bucket.clone(),
            units: 0.0,
            first: now,
            last: now,
            lost: Arc::clone(&self.units),
        })
    }

    /// The task stops: `false` when an entry came meanwhile and the task
    /// goes on.
    fn stop_if_empty(&self) -> bool {
        self.running.store(false, Ordering::Release);
        if self.ledger.is_empty() {
            return true;
        }
        // An admission raced the stop: whoever sets the flag drains.
        self.running.swap(true, Ordering::AcqRel)
    }

    /// Units waiting, the ledger emptied (tests).
    #[cfg(test)]
    fn waiting(&self) -> f64 {
        let all = self.ledger.take_some(usize::MAX);
        let total = all.iter().map(|(_, e)| e.units).sum();
        let forgets = *crate::sync::lock(&self.forgets);
        for (_, mut e) in all {
            self.put_back(e.bucket.clone(), e.take(), forgets);
        }
        total
    }
}

/// Starts the drain task of `core`'s write-back (see the module guide)
/// unless it runs or there is nothing to write back.
pub(crate) fn ensure<P: Primary>(core: &Arc<P>) {
    let wb = core.write_back();
    if wb.ledger.is_empty() || wb.running.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(drain(Arc::downgrade(core), spread()));
}

/// A random delay below [`SPREAD`], different per instance and per start.
fn spread() -> Duration {
    let h = std::hash::RandomState::new().hash_one(std::time::SystemTime::now());
    SPREAD.mul_f64((h % 1_000) as f64 / 1_000.0)
}

async fn drain<P: Primary>(core: Weak<P>, first: Duration) {
    tokio::time::sleep(first).await;
    let mut backoff = PACE;
    // Ends when the ledger is empty (entries expire, or are written back)
    // or the layer is gone.
    loop {
        let Some(c) = core.upgrade() else { return };
        let wb = c.write_back();
        let (batch, forgets) = wb.take(BATCH);
        if batch.is_empty() {
            if wb.stop_if_empty() {
                return;
            }
            drop(c);
            tokio::time::sleep(PACE).await;
            continue;
        }
        let mut failed = false;
        for (bucket, units) in batch {
            if failed {
                wb.put_back(bucket, units, forgets);
                continue;
            }
            match charge(&*c, &bucket, units, forgets).await {
                Ok(()) => {}
                Err(()) => {
                    failed = true;
                    wb.put_back(bucket, units, forgets);
                }
            }
        }
        drop(c);
        backoff = if failed {
            (backoff * 2).min(MAX_BACKOFF)
        } else {
            PACE
        };
        tokio::time::sleep(backoff).await;
    }
}

/// Charges `units` of `bucket`; when it holds less, what it holds. `Err`:
/// the store failed (nothing known charged: try again later).
async fn charge<P: Primary>(core: &P, bucket: &Bucket, units: f64, forgets: u64) -> Result<(), ()> {
    let wb = core.write_back();
    let check = |cost: f64| Check {
        cost,
        buckets: vec![bucket.clone()],
        slot: None,
    };
    let o = core.ask(&check(units)).await.map_err(|_| ())?;
    if o.allowed && o.limits[0].enough {
        wb.units.charged(units);
        return Ok(());
    }
    // Not room for it all: what the bucket holds, whole units.
    let room = o.limits[0].remaining.floor().min(units);
    if room >= 1.0 {
        match core.ask(&check(room)).await {
            Ok(o) if o.allowed && o.limits[0].enough => {
                wb.units.charged(room);
                wb.units.clamped(units - room);
                return Ok(());
            }
            Ok(_) => {}
            Err(_) => {
                wb.put_back(bucket.clone(), units, forgets);
                return Ok(());
            }
        }
    }
    wb.units.clamped(units);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Rule;

    fn bucket(key: &str, rule: Rule) -> Bucket {
        Bucket {
            key: key.into(),
            rule,
            shadow: false,
        }
    }

    const TB: Rule = Rule::TokenBucket {
        capacity: 100.0,
        refill_per_sec: 1.0,
    };

    #[tokio::test(start_paused = true)]
    async fn the_ledger_adds_per_key_and_forgets_what_no_longer_weighs() {
        let wb = WriteBack::new(1_000);
        wb.admitted(&bucket("rl:a:{x}", TB), 2.0);
        wb.admitted(&bucket("rl:a:{x}", TB), 3.0);
        // Nothing is consumed by a slot.
        wb.admitted(
            &bucket(
                "rl:in:{x}",
                Rule::Concurrency {
                    max_in_flight: 5.0,
                    max_hold: Duration::from_secs(30),
                },
            ),
            1.0,
        );
        wb.refunded("rl:a:{x}", 1.0);
        assert_eq!(wb.waiting(), 4.0);
        let (taken, _) = wb.take(BATCH);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].1, 4.0);
        assert_eq!(wb.waiting(), 0.0);
        // Past the bucket's full refill (100 s), units no longer weigh.
        wb.admitted(&bucket("rl:a:{y}", TB), 7.0);
        tokio::time::advance(Duration::from_secs(101)).await;
        assert!(wb.take(BATCH).0.is_empty());
        wb.running.store(true, Ordering::Release);
        assert!(wb.stop_if_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_forgets_the_entries_of_changed_limits() {
        let wb = WriteBack::new(1_000);
        wb.admitted(&bucket("rl:a:{x}", TB), 2.0);
        wb.admitted(&bucket("rl:b:{x}", TB), 3.0);
        wb.retain_limits("rl", |limit| limit != "a");
        let (taken, _) = wb.take(BATCH);
        assert_eq!(taken.len(), 1);
        assert_eq!((taken[0].0.key.as_str(), taken[0].1), ("rl:b:{x}", 3.0));
    }

    /// Units the drain held while a reload forgot entries (a failed
    /// charge, put back after) do not come back: their limit may be gone.
    #[tokio::test(start_paused = true)]
    async fn units_in_flight_across_a_reload_are_not_put_back() {
        let wb = WriteBack::new(1_000);
        wb.admitted(&bucket("rl:a:{x}", TB), 2.0);
        let (taken, forgets) = wb.take(BATCH);
        assert_eq!(taken.len(), 1);
        wb.retain_limits("rl", |limit| limit != "a");
        let (b, units) = taken.into_iter().next().unwrap();
        wb.put_back(b.clone(), units, forgets);
        assert_eq!(wb.waiting(), 0.0, "forgotten, not revived");
        // Without a reload between, a failed charge is put back whole.
        wb.admitted(&b, 2.0);
        let (taken, forgets) = wb.take(BATCH);
        let (b, units) = taken.into_iter().next().unwrap();
        wb.put_back(b, units, forgets);
        assert_eq!(wb.waiting(), 2.0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_ledger_is_bounded() {
        let wb = WriteBack::new(64);
        for i in 0..10_000 {
            wb.admitted(&bucket(&format!("rl:a:{{k{i}}}"), TB), 1.0);
        }
        assert!(wb.ledger.len() <= 64 + crate::bounded::SHARDS);
    }
}
