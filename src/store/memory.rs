//! Bounded in-process buckets (all three algorithms): the embedded default
//! and the `local` fallback.
//!
//! Buckets live in shards (a `std` mutex each, never held across an await).
//! Each shard holds at most `max_keys / shards` buckets; when a new key
//! would overflow it, buckets that have refilled to full are dropped first
//! (forgetting a full bucket loses nothing), then the least recently used
//! eighth. Clients inventing keys therefore cost bounded memory, and only
//! the idlest keys forget their usage.
//!
//! A key is hashed once per decision (std's keyed SipHash, so clients
//! cannot aim keys at one slot): the hash picks the shard and finds the
//! bucket in that shard's table.

use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};

use hashbrown::HashTable;
use tokio::time::Instant;

use super::{Bucket, Check, Outcome, Store, StoreFuture};
use crate::algorithm::{Level, LimitState, State};
use crate::sync::lock;

const SHARDS: usize = 16;

/// The shard of a key's hash: bits the tables do not use to place their
/// entries (they use the low bits for the slot and the top seven as a tag).
fn shard_of(hash: u64) -> usize {
    ((hash >> 32) as usize) % SHARDS
}

/// In-process buckets with the same semantics as the Redis scripts.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    epoch: Instant,
}

#[derive(Default)]
struct Shard {
    buckets: HashTable<(String, Entry)>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

impl Shard {
    fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        self.buckets
            .find_mut(hash, |(k, _)| k == key)
            .map(|(_, e)| e)
    }

    /// Inserts a key known to be absent.
    fn insert(&mut self, hasher: &RandomState, hash: u64, key: String, entry: Entry) {
        self.buckets
            .insert_unique(hash, (key, entry), |(k, _)| hasher.hash_one(k.as_str()));
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    state: State,
    /// When the state is the same as a missing key (bucket full, window
    /// over): past this, it can go for free.
    idle_at: f64,
    /// Last time any request (admitted or refused) touched it.
    seen: f64,
}

impl MemoryStore {
    /// A store holding at most about `max_keys` buckets.
    #[must_use]
    pub fn new(max_keys: usize) -> Self {
        let per_shard = max_keys.div_ceil(SHARDS).max(1);
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard,
            hasher: RandomState::new(),
            epoch: Instant::now(),
        }
    }

    /// How many buckets the store holds now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).buckets.len()).sum()
    }

    /// Whether the store holds no bucket.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides synchronously (the memory store never waits).
    #[must_use]
    pub fn check_now(&self, check: &Check) -> Outcome {
        let now = self.epoch.elapsed().as_secs_f64();
        if let [bucket] = check.buckets.as_slice() {
            let (allowed, state) = self.check_one_at(bucket, check.cost, now);
            return Outcome {
                allowed,
                limits: vec![state],
            };
        }
        let hashes: Vec<u64> = check
            .buckets
            .iter()
            .map(|b| self.hasher.hash_one(b.key.as_str()))
            .collect();
        // Lock every shard involved, in index order, so the decision is
        // atomic across buckets and two requests cannot deadlock.
        let mut idx: Vec<usize> = hashes.iter().map(|&h| shard_of(h)).collect();
        let per_bucket = idx.clone();
        idx.sort_unstable();
        idx.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            idx.iter().map(|&i| lock(&self.shards[i])).collect();
        // Which guard holds each bucket's shard (`idx` is sorted).
        let slots: Vec<usize> = per_bucket
            .iter()
            .map(|i| idx.binary_search(i).unwrap_or(0))
            .collect();

        let mut levels: Vec<Level> = check
            .buckets
            .iter()
            .zip(&slots)
            .zip(&hashes)
            .map(|((b, &g), &h)| {
                // A refused key is still a busy key: mark it seen, so LRU
                // eviction never forgets a client that keeps hammering.
                let stored = guards[g].get_mut(h, &b.key).map(|e| {
                    e.seen = now;
                    e.state
                });
                Level::read(b.rule, stored, now)
            })
            .collect();
        let cost = check.cost;
        let enough: Vec<bool> = levels
            .iter()
            .map(|l| cost <= 0.0 || l.avail() >= cost)
            .collect();
        let allowed = check
            .buckets
            .iter()
            .zip(&enough)
            .all(|(b, &e)| e || b.shadow);
        let mut limits = Vec::with_capacity(levels.len());
        for (i, b) in check.buckets.iter().enumerate() {
            if allowed && enough[i] {
                let (state, idle_at) = levels[i].write(cost);
                let entry = Entry {
                    state,
                    idle_at,
                    seen: now,
                };
                let shard = &mut guards[slots[i]];
                if let Some(e) = shard.get_mut(hashes[i], &b.key) {
                    *e = entry;
                } else {
                    shard.make_room(self.per_shard, now);
                    shard.insert(&self.hasher, hashes[i], b.key.clone(), entry);
                }
            }
            limits.push(levels[i].report(cost, enough[i]));
        }
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
        self.check_one_at(b, cost, self.epoch.elapsed().as_secs_f64())
    }

    fn check_one_at(&self, b: &Bucket, cost: f64, now: f64) -> (bool, LimitState) {
        let hash = self.hasher.hash_one(b.key.as_str());
        let mut shard = lock(&self.shards[shard_of(hash)]);
        let decide = |level: &mut Level| {
            let enough = cost <= 0.0 || level.avail() >= cost;
            let written = enough.then(|| level.write(cost));
            (enough, written)
        };
        let (level, enough) = if let Some(e) = shard.get_mut(hash, &b.key) {
            // A refused key is still a busy key (see `check_now`).
            e.seen = now;
            let mut level = Level::read(b.rule, Some(e.state), now);
            let (enough, written) = decide(&mut level);
            if let Some((state, idle_at)) = written {
                e.state = state;
                e.idle_at = idle_at;
            }
            (level, enough)
        } else {
            let mut level = Level::read(b.rule, None, now);
            let (enough, written) = decide(&mut level);
            if let Some((state, idle_at)) = written {
                shard.make_room(self.per_shard, now);
                shard.insert(
                    &self.hasher,
                    hash,
                    b.key.clone(),
                    Entry {
                        state,
                        idle_at,
                        seen: now,
                    },
                );
            }
            (level, enough)
        };
        drop(shard);
        (enough || b.shadow, level.report(cost, enough))
    }
}

impl Shard {
    fn make_room(&mut self, cap: usize, now: f64) {
        if self.buckets.len() < cap {
            return;
        }
        // Full buckets are the same as missing ones: drop them for free.
        self.buckets.retain(|(_, e)| e.idle_at > now);
        if self.buckets.len() < cap {
            return;
        }
        // Still full of live buckets: forget the least recently used eighth,
        // so the sweep's cost is shared by many inserts.
        let mut ages: Vec<f64> = self.buckets.iter().map(|(_, e)| e.seen).collect();
        let cut = (cap / 8).max(1).min(ages.len());
        let (_, &mut threshold, _) = ages.select_nth_unstable_by(cut - 1, f64::total_cmp);
        // Drop exactly `cut`: everything older than the threshold, then ties.
        let mut ties = cut - ages.iter().filter(|&&a| a < threshold).count();
        self.buckets.retain(|(_, e)| {
            if e.seen < threshold {
                false
            } else if e.seen == threshold && ties > 0 {
                ties -= 1;
                false
            } else {
                true
            }
        });
    }
}

impl Store for MemoryStore {
    fn check(&self, check: &Check) -> StoreFuture {
        let outcome = self.check_now(check);
        Box::pin(std::future::ready(Ok(outcome)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Bucket, Rule};
    use std::time::Duration;

    fn check(keys: &[&str], cap: f64, rate: f64, cost: f64) -> Check {
        Check {
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
