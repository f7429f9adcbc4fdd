//! The refused-key cache: after Redis refuses a key with `Retry-After` T,
//! this instance refuses that key by itself until T, without calling Redis.
//! A client looping on a refused key then costs Redis about one call per
//! refusal window per instance instead of one per request.
//!
//! It stays honest: the answer carries the same limit, the remaining count
//! Redis reported (it can only have grown since), and `Retry-After` counted
//! down to the same moment. An entry only answers requests costing at least
//! what was refused (a cheaper request might fit sooner). Bounded: expired
//! entries go first, then those closest to expiring. An entry remembers the
//! numbers it was refused under, so a caller whose plan changed goes to Redis
//! again at once.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::time::{Duration, Instant};

use crate::algorithm::Rule;
use crate::pipeline::response::RateHeaders;

const SHARDS: usize = 8;

#[derive(Clone, Debug)]
pub(crate) struct Refused {
    pub(crate) until: Instant,
    pub(crate) cost: f64,
    /// The numbers it was refused under (a plan change voids the entry).
    pub(crate) rule: Rule,
    pub(crate) headers: RateHeaders,
    /// When the bucket is full, as reported at the refusal.
    pub(crate) full_at: Instant,
}

#[derive(Debug)]
pub(crate) struct RefusedCache {
    shards: Box<[Mutex<HashMap<String, Refused>>]>,
    per_shard: usize,
    /// Entries held: lets the hot path skip the lookup when there are none.
    len: AtomicUsize,
    hasher: RandomState,
    /// Resets applied so far (see [`forget`](Self::forget)).
    resets: AtomicU64,
}

impl RefusedCache {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: max_keys.div_ceil(SHARDS),
            len: AtomicUsize::new(0),
            hasher: RandomState::new(),
            resets: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<String, Refused>> {
        let i = (self.hasher.hash_one(key) as usize) % SHARDS;
        crate::sync::lock(&self.shards[i])
    }

    /// A live refusal of `key` for a request costing `cost`.
    pub(crate) fn get(&self, key: &str, cost: f64) -> Option<Refused> {
        if self.per_shard == 0 || self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let now = Instant::now();
        let mut shard = self.shard(key);
        match shard.get(key) {
            Some(r) if r.until > now && cost >= r.cost => Some(r.clone()),
            Some(r) if r.until <= now => {
                shard.remove(key);
                self.len.fetch_sub(1, Ordering::Relaxed);
                None
            }
            _ => None,
        }
    }

    /// Resets applied so far: read before asking Redis, and handed to
    /// [`insert`](Self::insert) with the answer.
    pub(crate) fn resets(&self) -> u64 {
        self.resets.load(Ordering::Acquire)
    }

    /// Remembers a refusal Redis answered to a call made when
    /// [`resets`](Self::resets) was `seen`; not if a reset came since (the
    /// refusal may predate it).
    pub(crate) fn insert(
        &self,
        key: &str,
        wait: Duration,
        entry_without_until: Refused,
        seen: u64,
    ) {
        if self.per_shard == 0 || wait.is_zero() {
            return;
        }
        let now = Instant::now();
        let entry = Refused {
            until: now + wait,
            ..entry_without_until
        };
        let mut shard = self.shard(key);
        // Under the shard's lock, which `forget` takes after counting: a
        // reset either sees this entry or this sees the reset.
        if self.resets.load(Ordering::Acquire) != seen {
            return;
        }
        if !shard.contains_key(key) && shard.len() >= self.per_shard {
            let before = shard.len();
            shard.retain(|_, r| r.until > now);
            if shard.len() >= self.per_shard {
                // Still full of live refusals: drop the eighth closest to ending.
                let mut ends: Vec<Instant> = shard.values().map(|r| r.until).collect();
                let cut = (self.per_shard / 8).clamp(1, ends.len());
                let (_, &mut t, _) = ends.select_nth_unstable(cut - 1);
                shard.retain(|_, r| r.until > t);
            }
            self.len.fetch_sub(before - shard.len(), Ordering::Relaxed);
        }
        if shard.insert(key.to_owned(), entry).is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A reset of `keys`: forgets them, and keeps refusals of calls made
    /// before it out.
    pub(crate) fn forget(&self, keys: &[&str]) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        if self.per_shard == 0 {
            return;
        }
        for key in keys {
            if self.shard(key).remove(*key).is_some() {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Forgets every refusal (a reset may have been missed).
    pub(crate) fn clear(&self) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        for shard in self.shards.iter() {
            let mut shard = crate::sync::lock(shard);
            self.len.fetch_sub(shard.len(), Ordering::Relaxed);
            shard.clear();
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(cost: f64) -> Refused {
        let now = Instant::now();
        Refused {
            until: now,
            cost,
            rule: Rule::TokenBucket {
                capacity: 5.0,
                refill_per_sec: 1.0,
            },
            headers: RateHeaders::new(5.0, 0.0, 5.0),
            full_at: now + Duration::from_secs(5),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refuses_until_the_retry_then_forgets() {
        let c = RefusedCache::new(100);
        assert!(c.get("k", 1.0).is_none());
        c.insert("k", Duration::from_secs(2), entry(2.0), c.resets());
        assert!(c.get("k", 2.0).is_some());
        assert!(
            c.get("k", 1.0).is_none(),
            "a cheaper request may fit sooner"
        );
        tokio::time::advance(Duration::from_millis(2001)).await;
        assert!(c.get("k", 2.0).is_none());
        assert_eq!(c.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn bounded() {
        let c = RefusedCache::new(800);
        for i in 0..100_000 {
            c.insert(
                &format!("k{i}"),
                Duration::from_secs(60 + (i % 7)),
                entry(1.0),
                0,
            );
        }
        assert!(c.len() <= 800 + SHARDS, "{}", c.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_forgets_the_keys_and_refusals_asked_before_it() {
        let c = RefusedCache::new(100);
        let seen = c.resets();
        c.insert("a", Duration::from_secs(60), entry(1.0), seen);
        c.insert("b", Duration::from_secs(60), entry(1.0), seen);
        c.forget(&["a", "nope"]);
        assert!(c.get("a", 1.0).is_none());
        assert!(c.get("b", 1.0).is_some());
        assert_eq!(c.len(), 1);
        // Redis refused before the reset, the answer arrives after it.
        c.insert("a", Duration::from_secs(60), entry(1.0), seen);
        assert!(c.get("a", 1.0).is_none(), "a stale refusal is not kept");
        c.insert("a", Duration::from_secs(60), entry(1.0), c.resets());
        assert!(c.get("a", 1.0).is_some());
        c.clear();
        assert_eq!(c.len(), 0);
        assert!(c.get("b", 1.0).is_none());
    }
}
