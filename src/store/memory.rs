//! Bounded in-process buckets (all three algorithms): the embedded default
//! and the `local` fallback.
//!
//! Buckets live in a [`Bounded`] map (a `std` mutex per shard, never held
//! across an await) of about `max_keys` buckets. When a new key would
//! overflow its shard, buckets that have refilled to full are dropped first
//! (forgetting a full bucket loses nothing), then the least recently used
//! eighth. Clients inventing keys therefore cost bounded memory, and only
//! the idlest keys forget their usage.
//!
//! A key is hashed once per decision: the hash picks the shard and finds the
//! bucket in that shard's table.
//!
//! A concurrency limit's key keeps its slots (id and deadline) beside its
//! state, so a slot is released by id; other buckets keep an empty list
//! (no allocation).

use std::time::Duration;

use tokio::time::Instant;

use super::{Bucket, Check, Lease, LeaseFuture, Outcome, Store, StoreFuture};
use crate::algorithm::{Level, LimitCheck, LimitState, Rule, Slots, State, decide};
use crate::bounded::{Bounded, Evict, Shard};

/// In-process buckets with the same semantics as the Redis scripts.
///
/// Decided through the [`Store`] trait (at once, without a future);
/// [`check_one`](Self::check_one) decides one bucket without a future, for
/// benchmarks of your own.
///
/// ```
/// use fleetlimit::store::{Bucket, Check, MemoryStore, Rule, Store};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fleetlimit::StoreError> {
/// let store = MemoryStore::new(10_000);
/// let check = Check {
///     slot: None,
///     cost: 1.0,
///     buckets: vec![Bucket {
///         key: "rl:per-key:{h:abc}".to_owned(),
///         rule: Rule::TokenBucket { capacity: 2.0, refill_per_sec: 0.001 },
///         shadow: false,
///     }],
/// };
/// assert!(store.check(&check).await?.allowed);
/// assert!(store.check(&check).await?.allowed);
/// assert!(!store.check(&check).await?.allowed);
/// assert_eq!(store.len(), 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    buckets: Bounded<Entry>,
    epoch: Instant,
}

#[derive(Clone, Debug)]
struct Entry {
    state: State,
    /// A concurrency limit's slots: id and deadline (seconds).
    held: Vec<(Box<str>, f64)>,
    /// When the state is the same as a missing key (bucket full, window
    /// over): past this, it can go for free.
    idle_at: f64,
    /// Last time any request (admitted or refused) touched it.
    seen: f64,
}

impl Entry {
    fn new(state: State, idle_at: f64, seen: f64) -> Self {
        Self {
            state,
            held: Vec::new(),
            idle_at,
            seen,
        }
    }

    /// The state `rule` reads at `now`: a concurrency limit's live slots
    /// (the others forgotten), else the stored state.
    fn read(&mut self, rule: &Rule, now: f64) -> State {
        if !rule.is_concurrency() {
            return self.state;
        }
        self.held.retain(|&(_, deadline)| deadline > now);
        State::Slots(Slots::of(self.held.iter().map(|&(_, d)| d)))
    }

    /// Records the slot a concurrency limit just took (`cost > 0`).
    fn take(&mut self, rule: &Rule, cost: f64, slot: Option<&str>) {
        if let (true, State::Slots(s)) = (rule.is_concurrency() && cost > 0.0, self.state) {
            self.held.push((slot.unwrap_or("").into(), s.last));
        }
    }
}

/// Seconds since the store's epoch.
impl Evict for Entry {
    type Time = f64;
    fn expired(&self, now: f64) -> bool {
        self.idle_at <= now
    }
    fn rank(&self) -> f64 {
        self.seen
    }
}

impl MemoryStore {
    /// A store holding at most about `max_keys` buckets.
    #[must_use]
    pub fn new(max_keys: usize) -> Self {
        Self {
            buckets: Bounded::new(max_keys),
            epoch: Instant::now(),
        }
    }

    /// How many buckets the store holds now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether the store holds no bucket.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides synchronously (the memory store never waits).
    #[must_use]
    pub(crate) fn check_now(&self, check: &Check) -> Outcome {
        let now = self.epoch.elapsed();
        if let [bucket] = check.buckets.as_slice() {
            if !bucket.rule.is_concurrency() {
                let (allowed, state) =
                    self.check_one_at(&bucket.key, bucket.rule, bucket.shadow, check.cost, now);
                return Outcome {
                    allowed,
                    limits: vec![state],
                };
            }
        }
        self.check_all_at(check, now)
    }

    /// Every bucket of `check` under one lock per shard; `now`: since the
    /// store's epoch.
    fn check_all_at(&self, check: &Check, now: Duration) -> Outcome {
        let secs = now.as_secs_f64();
        let hashes: Vec<u64> = check
            .buckets
            .iter()
            .map(|b| self.buckets.hash(&b.key))
            .collect();
        // Lock every shard involved, in index order, so the decision is
        // atomic across buckets and two requests cannot deadlock.
        let mut idx: Vec<usize> = hashes.iter().map(|&h| self.buckets.shard_of(h)).collect();
        let per_bucket = idx.clone();
        idx.sort_unstable();
        idx.dedup();
        let mut guards: Vec<Shard<'_, Entry>> = idx.iter().map(|&i| self.buckets.lock(i)).collect();
        // Which guard holds each bucket's shard (`idx` is sorted).
        let slots: Vec<usize> = per_bucket
            .iter()
            .map(|i| idx.binary_search(i).unwrap_or(0))
            .collect();

        let mut limits: Vec<LimitCheck> = check
            .buckets
            .iter()
            .zip(&slots)
            .zip(&hashes)
            .map(|((b, &g), &h)| {
                // A refused key is still a busy key: mark it seen, so LRU
                // eviction never forgets a client that keeps hammering.
                let stored = guards[g].get_mut(h, &b.key).map(|e| {
                    e.seen = secs;
                    e.read(&b.rule, secs)
                });
                LimitCheck::new(Level::read(b.rule, stored, now), b.shadow)
            })
            .collect();
        let allowed = decide(&mut limits, check.cost);
        for (i, b) in check.buckets.iter().enumerate() {
            if let Some((state, idle_at)) = limits[i].charged {
                let make = || Entry::new(state, idle_at, secs);
                let e = guards[slots[i]].get_or_insert_with(hashes[i], &b.key, secs, make);
                e.state = state;
                e.idle_at = idle_at;
                e.seen = secs;
                e.take(&b.rule, check.cost, check.slot.as_deref());
            }
        }
        let limits = limits.iter().map(|l| l.report(check.cost)).collect();
        Outcome { allowed, limits }
    }
}

impl MemoryStore {
    /// Decides one bucket, the common case (what the layer does for a route
    /// with one limit): one hash, one lock, one lookup, no allocation once
    /// the key is known. Whether it is allowed (always, in shadow mode), and
    /// the bucket's state after the charge.
    #[must_use]
    pub fn check_one(&self, b: &Bucket, cost: f64) -> (bool, LimitState) {
        self.check_one_at(&b.key, b.rule, b.shadow, cost, self.epoch.elapsed())
    }

    /// `now`: since the store's epoch.
    fn check_one_at(
        &self,
        key: &str,
        rule: Rule,
        shadow: bool,
        cost: f64,
        now: Duration,
    ) -> (bool, LimitState) {
        if rule.is_concurrency() {
            // Slots: the general path (an anonymous slot, see `Check::slot`).
            let check = Check {
                cost,
                buckets: vec![Bucket {
                    key: key.to_owned(),
                    rule,
                    shadow,
                }],
                slot: None,
            };
            let o = self.check_all_at(&check, now);
            return (o.allowed, o.limits[0]);
        }
        let secs = now.as_secs_f64();
        let mut slot = self.buckets.slot(key);
        // One lookup: the entry found is read and written in place.
        let mut entry = slot.get_mut();
        // A refused key is still a busy key (see `check_now`).
        let stored = entry.as_deref_mut().map(|e| {
            e.seen = secs;
            e.state
        });
        let mut one = [LimitCheck::new(Level::read(rule, stored, now), shadow)];
        let allowed = decide(&mut one, cost);
        if let Some((state, idle_at)) = one[0].charged {
            if let Some(e) = entry {
                e.state = state;
                e.idle_at = idle_at;
            } else {
                slot.insert(Entry::new(state, idle_at, secs), secs);
            }
        }
        drop(slot);
        (allowed, one[0].report(cost))
    }
}

impl MemoryStore {
    /// [`Store::lease`] at once: the whole cost, else as many `step`s as
    /// the refusal says are free (a second check under the same rule).
    fn lease_now(&self, check: &Check, step: f64) -> Lease {
        let refill = match check.buckets.as_slice() {
            [b] => match b.rule {
                Rule::TokenBucket { refill_per_sec, .. } => refill_per_sec,
                _ => 0.0,
            },
            _ => 0.0,
        };
        let whole = self.check_now(check);
        let Some(&first) = whole.limits.first() else {
            return Lease {
                granted: 0.0,
                state: LimitState {
                    enough: false,
                    remaining: 0.0,
                    wait: 0.0,
                    reset: 0.0,
                    capacity: 0.0,
                },
            };
        };
        if whole.allowed {
            return Lease {
                granted: check.cost,
                state: first,
            };
        }
        let steps = (first.remaining / step).floor();
        if step <= 0.0 || steps < 1.0 || refill <= 0.0 {
            return Lease {
                granted: 0.0,
                state: first,
            };
        }
        let part = Check {
            cost: steps * step,
            ..check.clone()
        };
        let o = self.check_now(&part);
        match o.limits.first() {
            Some(&s) if o.allowed => {
                let wait = ((check.cost - s.remaining) / refill).max(0.0);
                Lease {
                    granted: part.cost,
                    state: LimitState { wait, ..s },
                }
            }
            Some(&s) => Lease {
                granted: 0.0,
                state: s,
            },
            None => Lease {
                granted: 0.0,
                state: first,
            },
        }
    }
}

impl Store for MemoryStore {
    fn check(&self, check: &Check) -> StoreFuture {
        let outcome = self.check_now(check);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn lease(&self, check: &Check, step: f64) -> LeaseFuture {
        Box::pin(std::future::ready(Ok(self
            .lease_now(check, step)
            .into_parts())))
    }

    fn decide_now(&self, check: &Check, outcome: &mut Outcome) -> bool {
        let now = self.epoch.elapsed();
        outcome.limits.clear();
        if let [bucket] = check.buckets.as_slice() {
            if !bucket.rule.is_concurrency() {
                let (allowed, state) =
                    self.check_one_at(&bucket.key, bucket.rule, bucket.shadow, check.cost, now);
                outcome.allowed = allowed;
                outcome.limits.push(state);
                return true;
            }
        }
        *outcome = self.check_all_at(check, now);
        true
    }

    fn release(&self, key: &str, slot: &str) {
        let now = self.epoch.elapsed().as_secs_f64();
        let mut found = self.buckets.slot(key);
        let Some(e) = found.get_mut() else {
            return;
        };
        e.held.retain(|(id, d)| &**id != slot && *d > now);
        if e.held.is_empty() {
            if matches!(e.state, State::Slots(_)) {
                // No slot left: the same as no key.
                found.remove();
            }
            return;
        }
        let s = Slots::of(e.held.iter().map(|&(_, d)| d));
        e.state = State::Slots(s);
        e.idle_at = s.last;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounded::SHARDS;
    use crate::store::Bucket;
    use std::time::Duration;

    fn check(keys: &[&str], cap: f64, rate: f64, cost: f64) -> Check {
        Check {
            slot: None,
            cost,
            buckets: keys
                .iter()
                .map(|k| Bucket {
                    key: (*k).into(),
                    rule: Rule::TokenBucket {
                        capacity: cap,
                        refill_per_sec: rate,
                    },
                    shadow: false,
                })
                .collect(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn admits_capacity_then_refills_on_the_clock() {
        let s = MemoryStore::new(100);
        let c = check(&["k"], 5.0, 1.0, 1.0);
        let admitted = (0..10).filter(|_| s.check_now(&c).allowed).count();
        assert_eq!(admitted, 5);
        let refused = s.check_now(&c);
        assert!(!refused.allowed);
        assert!((refused.limits[0].wait - 1.0).abs() < 1e-6);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!((0..10).filter(|_| s.check_now(&c).allowed).count(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn all_or_nothing() {
        let s = MemoryStore::new(100);
        let small = check(&["a"], 1.0, 0.001, 1.0);
        assert!(s.check_now(&small).allowed);
        // "a" is empty, so a request counted against "a" and "b" takes from neither.
        let both = Check {
            slot: None,
            cost: 1.0,
            buckets: vec![
                small.buckets[0].clone(),
                check(&["b"], 3.0, 0.001, 1.0).buckets[0].clone(),
            ],
        };
        let o = s.check_now(&both);
        assert!(!o.allowed);
        assert!((o.limits[1].remaining - 3.0).abs() < 1e-9);
        assert_eq!(s.len(), 1, "the refused request wrote nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_slots_are_released_by_id_or_expire() {
        let s = MemoryStore::new(100);
        let bucket = Bucket {
            key: "c".into(),
            rule: Rule::Concurrency {
                max_in_flight: 2.0,
                max_hold: Duration::from_secs(10),
            },
            shadow: false,
        };
        let take = |slot: &str, cost: f64| Check {
            cost,
            buckets: vec![bucket.clone()],
            slot: Some(slot.into()),
        };
        // One slot each, whatever the cost; the third finds none.
        assert!(s.check_now(&take("a", 5.0)).allowed);
        assert!(s.check_now(&take("b", 1.0)).allowed);
        let refused = s.check_now(&take("c", 1.0));
        assert!(!refused.allowed);
        assert_eq!(refused.limits[0].wait, 1.0, "at least a second");
        // A refund gives nothing back; a release by id does.
        assert!(s.check_now(&take("x", -1.0)).allowed);
        assert!(!s.check_now(&take("c", 1.0)).allowed);
        s.release("c", "a");
        s.release("c", "unknown");
        let o = s.check_now(&take("c", 1.0));
        assert!(o.allowed);
        assert_eq!(o.limits[0].remaining, 0.0);
        // Never released: they stop counting at their deadline.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(s.check_now(&take("d", 1.0)).limits[0].remaining, 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded_and_busy_keys_keep_their_counts() {
        let s = MemoryStore::new(1_000);
        let busy = check(&["busy"], 10.0, 0.001, 1.0);
        for _ in 0..10 {
            assert!(s.check_now(&busy).allowed);
        }
        for i in 0..50_000 {
            tokio::time::advance(Duration::from_micros(10)).await;
            let _ = s.check_now(&check(&[&format!("junk-{i}")], 10.0, 0.001, 1.0));
            // The busy key keeps hammering (and keeps being refused).
            if i % 10 == 0 {
                assert!(
                    !s.check_now(&busy).allowed,
                    "the busy key forgot its usage at {i}"
                );
            }
        }
        assert!(s.len() <= 1_000 + SHARDS, "{}", s.len());
    }
}
