//! One bounded map, used by every cache of the limiter: the memory store's
//! buckets, the refused-key cache, hot-key leases and the plan cache (with
//! its lookups in flight).
//!
//! The one eviction policy: keys are sharded by their hash, and a shard holds
//! at most `capacity / shards` entries (rounded up). When a new key would
//! overflow its shard, the entries that say they are [expired](Evict::expired)
//! go first (forgetting them loses nothing); if the shard is still full, the
//! eighth of it with the lowest [rank](Evict::rank) goes (at least one entry;
//! exactly that many, ties in table order), so the sweep's cost is shared by
//! many inserts. A map never holds more than `capacity + shards - 1` entries.
//! Clients inventing keys therefore cost bounded memory, and only the
//! entries each cache values least are forgotten:
//!
//! | cache            | expired                                  | lowest rank           |
//! |------------------|------------------------------------------|-----------------------|
//! | memory store     | bucket refilled to full / window over    | least recently seen   |
//! | refused cache    | the refusal is over                      | ends soonest          |
//! | leases           | no live lease and no hit in the last 1 s | hit window oldest     |
//! | plans (+ lookups)| answer stale / lookup nobody waits on    | asked longest ago     |
//!
//! A key is hashed once per operation with hashbrown's default hasher
//! (foldhash, seeded at random per map, so clients cannot aim keys at one
//! shard or slot without first recovering the seed; a shard is bounded, so
//! even then a lookup scans at most one shard's entries): the hash picks
//! the shard and the slot in that shard's table. Finding a key copies nothing; its `String` is
//! made only when the key is inserted.

use std::cmp::Ordering as Cmp;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use hashbrown::{DefaultHashBuilder, HashTable};

use crate::sync::lock;

/// Shards of a map holding at least this many keys (fewer for smaller ones).
pub(crate) const SHARDS: usize = 16;

/// What a map's values tell the eviction policy.
pub(crate) trait Evict {
    /// The clock the values are judged by.
    type Time: Copy + PartialOrd;
    /// Forgetting the value at `now` loses nothing (it is as good as absent).
    fn expired(&self, now: Self::Time) -> bool;
    /// In a shard full of live values, the lowest ranks go first.
    fn rank(&self) -> Self::Time;
}

type Table<V> = HashTable<(String, V)>;

/// A sharded map from `String` keys, bounded by the policy above.
pub(crate) struct Bounded<V> {
    shards: Box<[Mutex<Table<V>>]>,
    per_shard: usize,
    /// Entries held, kept under the shards' locks: a reader can skip an
    /// empty map without hashing or locking.
    len: AtomicUsize,
    hasher: DefaultHashBuilder,
}

impl<V> fmt::Debug for Bounded<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bounded")
            .field("len", &self.len.load(Ordering::Relaxed))
            .field("shards", &self.shards.len())
            .field("per_shard", &self.per_shard)
            .finish()
    }
}

impl<V: Evict> Bounded<V> {
    /// A map holding at most about `capacity` entries (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        // A power of two, so a hash picks its shard with a mask.
        let shards = 1 << capacity.min(SHARDS).ilog2();
        Self {
            shards: (0..shards).map(|_| Mutex::new(HashTable::new())).collect(),
            per_shard: capacity.div_ceil(shards),
            len: AtomicUsize::new(0),
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// Entries held now.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key's hash, for [`shard_of`](Self::shard_of) and the [`Shard`]
    /// methods.
    pub(crate) fn hash(&self, key: &str) -> u64 {
        hash(&self.hasher, key)
    }

    /// The shard of a hash: bits the tables do not use to place their
    /// entries (they use the low bits for the slot, the top seven as a tag).
    pub(crate) fn shard_of(&self, hash: u64) -> usize {
        ((hash >> 32) as usize) & (self.shards.len() - 1)
    }

    /// Locks one shard. Several at once only in index order (no deadlock).
    pub(crate) fn lock(&self, shard: usize) -> Shard<'_, V> {
        Shard {
            table: lock(&self.shards[shard]),
            map: self,
        }
    }

    /// The key's place: hashed once, its shard locked until the slot drops.
    pub(crate) fn slot<'k>(&self, key: &'k str) -> Slot<'_, 'k, V> {
        let hash = self.hash(key);
        Slot {
            shard: self.lock(self.shard_of(hash)),
            hash,
            key,
        }
    }

    pub(crate) fn remove(&self, key: &str) -> Option<V> {
        self.slot(key).remove()
    }

    /// Keeps only the entries whose key `keep` accepts.
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        for shard in self.shards.iter() {
            let mut table = lock(shard);
            let before = table.len();
            table.retain(|(k, _)| keep(k));
            self.len.fetch_sub(before - table.len(), Ordering::Relaxed);
        }
    }

    /// Removes up to `n` entries (any: a shard at a time) and hands them
    /// over.
    pub(crate) fn take_some(&self, n: usize) -> Vec<(String, V)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let want = n.saturating_sub(out.len());
            if want == 0 {
                break;
            }
            let mut table = lock(shard);
            let mut taken = 0;
            out.extend(table.extract_if(|_| {
                taken += 1;
                taken <= want
            }));
            self.len.fetch_sub(taken.min(want), Ordering::Relaxed);
        }
        out
    }

    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut table = lock(shard);
            self.len.fetch_sub(table.len(), Ordering::Relaxed);
            table.clear();
        }
    }
}

/// One locked shard of a [`Bounded`] map.
pub(crate) struct Shard<'a, V> {
    table: MutexGuard<'a, Table<V>>,
    map: &'a Bounded<V>,
}

impl<V> fmt::Debug for Shard<'_, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard")
            .field("len", &self.table.len())
            .finish()
    }
}

impl<V: Evict> Shard<'_, V> {
    pub(crate) fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut V> {
        self.table.find_mut(hash, |(k, _)| k == key).map(|(_, v)| v)
    }

    /// The key's value, made by `make` (room made first) if absent.
    pub(crate) fn get_or_insert_with(
        &mut self,
        hash: u64,
        key: &str,
        now: V::Time,
        make: impl FnOnce() -> V,
    ) -> &mut V {
        let map = self.map;
        match self.table.find_entry(hash, |(k, _)| k == key) {
            Ok(found) => &mut found.into_mut().1,
            Err(absent) => insert_new(map, absent.into_table(), hash, key, make(), now),
        }
    }

    /// Sets the key's value (room made first if it is new); the old value.
    pub(crate) fn insert(&mut self, hash: u64, key: &str, value: V, now: V::Time) -> Option<V> {
        let map = self.map;
        match self.table.find_entry(hash, |(k, _)| k == key) {
            Ok(found) => Some(std::mem::replace(&mut found.into_mut().1, value)),
            Err(absent) => {
                insert_new(map, absent.into_table(), hash, key, value, now);
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, hash: u64, key: &str) -> Option<V> {
        let found = self.table.find_entry(hash, |(k, _)| k == key).ok()?;
        self.map.len.fetch_sub(1, Ordering::Relaxed);
        Some(found.remove().0.1)
    }
}

/// A key's hash: its bytes in one write (`str`'s `Hash` adds a second,
/// of one byte, which only keys hashed together with others need).
fn hash(hasher: &DefaultHashBuilder, key: &str) -> u64 {
    hasher.hash_one(key.as_bytes())
}

/// Inserts a key known to be absent, making room first: the only place a
/// key's `String` is made.
fn insert_new<'t, V: Evict>(
    map: &Bounded<V>,
    table: &'t mut Table<V>,
    hash: u64,
    key: &str,
    value: V,
    now: V::Time,
) -> &'t mut V {
    make_room(map, table, now);
    map.len.fetch_add(1, Ordering::Relaxed);
    let hasher = &map.hasher;
    let entry = (key.to_owned(), value);
    &mut table
        .insert_unique(hash, entry, |(k, _)| self::hash(hasher, k))
        .into_mut()
        .1
}

/// Drops expired entries, then the lowest-ranked eighth, while the table is
/// full.
fn make_room<V: Evict>(map: &Bounded<V>, table: &mut Table<V>, now: V::Time) {
    let cap = map.per_shard;
    if table.len() < cap {
        return;
    }
    let before = table.len();
    table.retain(|(_, v)| !v.expired(now));
    if table.len() >= cap && !table.is_empty() {
        let mut ranks: Vec<V::Time> = table.iter().map(|(_, v)| v.rank()).collect();
        let cut = (cap / 8).clamp(1, ranks.len());
        let by = |a: &V::Time, b: &V::Time| a.partial_cmp(b).unwrap_or(Cmp::Equal);
        let (_, &mut threshold, _) = ranks.select_nth_unstable_by(cut - 1, by);
        // Drop exactly `cut`: everything ranked below the threshold, then ties.
        let below = ranks.iter().filter(|&&r| r < threshold).count();
        let mut ties = cut.saturating_sub(below);
        table.retain(|(_, v)| {
            let r = v.rank();
            if r < threshold {
                false
            } else if r == threshold && ties > 0 {
                ties -= 1;
                false
            } else {
                true
            }
        });
    }
    map.len.fetch_sub(before - table.len(), Ordering::Relaxed);
}

/// One key's place in a [`Bounded`] map, its shard locked.
#[derive(Debug)]
pub(crate) struct Slot<'a, 'k, V> {
    shard: Shard<'a, V>,
    hash: u64,
    key: &'k str,
}

impl<V: Evict> Slot<'_, '_, V> {
    pub(crate) fn get_mut(&mut self) -> Option<&mut V> {
        self.shard.get_mut(self.hash, self.key)
    }

    pub(crate) fn get_or_insert_with(&mut self, now: V::Time, make: impl FnOnce() -> V) -> &mut V {
        self.shard
            .get_or_insert_with(self.hash, self.key, now, make)
    }

    pub(crate) fn insert(&mut self, value: V, now: V::Time) -> Option<V> {
        self.shard.insert(self.hash, self.key, value, now)
    }

    pub(crate) fn remove(&mut self) -> Option<V> {
        self.shard.remove(self.hash, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Expires at `until`, ranked by `seen`.
    #[derive(Debug, PartialEq)]
    struct V {
        until: u64,
        seen: u64,
    }

    impl Evict for V {
        type Time = u64;
        fn expired(&self, now: u64) -> bool {
            self.until <= now
        }
        fn rank(&self) -> u64 {
            self.seen
        }
    }

    fn v(until: u64, seen: u64) -> V {
        V { until, seen }
    }

    #[test]
    fn get_insert_remove() {
        let m = Bounded::new(100);
        assert!(m.is_empty());
        assert_eq!(m.slot("a").insert(v(10, 1), 0), None);
        assert_eq!(m.slot("a").insert(v(20, 2), 0), Some(v(10, 1)));
        assert_eq!(m.slot("a").get_mut(), Some(&mut v(20, 2)));
        assert_eq!(m.slot("b").get_mut(), None);
        m.slot("b").get_or_insert_with(0, || v(5, 5)).seen = 6;
        assert_eq!(m.slot("b").get_or_insert_with(0, || v(0, 0)), &mut v(5, 6));
        assert_eq!(m.len(), 2);
        assert_eq!(m.remove("a"), Some(v(20, 2)));
        assert_eq!(m.remove("a"), None);
        assert_eq!(m.len(), 1);
        m.clear();
        assert!(m.is_empty());
        assert_eq!(m.slot("b").get_mut(), None);
    }

    #[test]
    fn the_capacity_bound_holds() {
        for cap in [1, 7, 16, 100, 1_000] {
            let m = Bounded::new(cap);
            for i in 0..20_000u64 {
                m.slot(&format!("k{i}")).insert(v(u64::MAX, i), 0);
                assert!(m.len() <= cap + SHARDS, "{cap}: {}", m.len());
            }
            let held: usize = (0..m.shards.len()).map(|s| m.lock(s).table.len()).sum();
            assert_eq!(held, m.len());
        }
    }

    #[test]
    fn expired_entries_go_first_then_the_lowest_ranks() {
        // One shard of 16.
        let m = Bounded {
            shards: vec![Mutex::new(HashTable::new())].into(),
            per_shard: 16,
            len: AtomicUsize::new(0),
            hasher: DefaultHashBuilder::default(),
        };
        // Eight expire at 100; eight live on, the oldest seen first.
        for i in 0..16 {
            let until = if i % 2 == 0 { 100 } else { u64::MAX };
            m.slot(&format!("k{i}")).insert(v(until, i), 0);
        }
        // Before 100 nothing is expired: the oldest two (16 / 8) go.
        m.slot("new").insert(v(u64::MAX, 50), 50);
        assert_eq!(m.len(), 15);
        assert!(m.slot("k0").get_mut().is_none() && m.slot("k1").get_mut().is_none());
        m.slot("new2").insert(v(u64::MAX, 51), 51);
        assert_eq!(m.len(), 16);
        // At 100 the expired ones go, whatever their rank; the live stay.
        m.slot("new3").insert(v(u64::MAX, 0), 100);
        assert_eq!(m.len(), 16 - 7 + 1);
        for i in (3..16).step_by(2) {
            assert!(m.slot(&format!("k{i}")).get_mut().is_some(), "k{i}");
        }
        assert!(m.slot("k2").get_mut().is_none());
    }

    #[test]
    fn concurrent_use_from_threads() {
        let m = Arc::new(Bounded::new(256));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let m = Arc::clone(&m);
                std::thread::spawn(move || {
                    for i in 0..5_000u64 {
                        // A shared hot key, counted by every thread.
                        m.slot("hot")
                            .get_or_insert_with(0, || v(u64::MAX, u64::MAX))
                            .until -= 1;
                        let key = format!("t{t}-{i}");
                        m.slot(&key).insert(v(u64::MAX, i), 0);
                        if i % 3 == 0 {
                            m.remove(&key);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(m.len() <= 256 + SHARDS, "{}", m.len());
        let hot = m.slot("hot").get_mut().map(|h| h.until);
        assert_eq!(hot, Some(u64::MAX - 20_000), "the hot key lost a count");
        let held: usize = (0..m.shards.len()).map(|s| m.lock(s).table.len()).sum();
        assert_eq!(held, m.len());
    }
}
