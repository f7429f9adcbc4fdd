//! The refused-key cache: after Redis refuses a key with `Retry-After` T,
//! this instance refuses that key by itself until T, without calling Redis.
//! A client looping on a refused key then costs Redis about one call per
//! refusal window per instance instead of one per request.
//!
//! It stays honest: the answer carries the same limit, the remaining count
//! Redis reported (it can only have grown since), and `Retry-After` counted
//! down to the same moment. An entry only answers requests costing at least
//! what was refused (a cheaper request might fit sooner). Bounded (see
//! [`Bounded`]): expired entries go first, then those closest to expiring.
//! An entry remembers the
//! numbers it was refused under, so a caller whose plan changed goes to Redis
//! again at once.
//!
//! An entry counts the refusals it answered: when a reset voids a live
//! entry they are counted as `refused_cache_voided` (feature `metrics`),
//! an upper bound of the refusals answered after the reset was made and
//! before it reached this instance. A reload starts the cache empty, so
//! none is answered after it.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::{Duration, Instant};

use crate::algorithm::{LimitState, Rule};
use crate::bounded::{Bounded, Evict};
use crate::metrics::RefusedMetrics;

#[derive(Clone, Debug)]
pub(crate) struct Refused {
    pub(crate) until: Instant,
    pub(crate) cost: f64,
    /// The numbers it was refused under (a plan change voids the entry).
    pub(crate) rule: Rule,
    /// The refused bucket's state, as Redis reported it.
    pub(crate) state: LimitState,
    /// When it was refused (its reset counts down from then).
    pub(crate) at: Instant,
    /// Refusals answered from it so far.
    pub(crate) answered: u64,
}

/// Expired when the refusal ends; the soonest to end go first.
impl Evict for Refused {
    type Time = Instant;
    fn expired(&self, now: Instant) -> bool {
        self.until <= now
    }
    fn rank(&self) -> Instant {
        self.until
    }
}

#[derive(Debug)]
pub(crate) struct RefusedCache {
    /// `None`: the cache is off (`refused_cache_keys = 0`).
    map: Option<Bounded<Refused>>,
    /// Resets applied so far (see [`forget`](Self::forget)).
    resets: AtomicU64,
    metrics: RefusedMetrics,
}

impl RefusedCache {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            map: (max_keys > 0).then(|| Bounded::new(max_keys)),
            resets: AtomicU64::new(0),
            metrics: RefusedMetrics::new(),
        }
    }

    /// Whether refusals are remembered (not for the in-process store,
    /// nor with `refused_cache_keys = 0`).
    pub(crate) fn is_on(&self) -> bool {
        self.map.is_some()
    }

    /// A live refusal of `key` under `rule` for a request costing `cost`,
    /// counted as answered.
    pub(crate) fn get(&self, key: &str, cost: f64, rule: &Rule) -> Option<Refused> {
        // No entry, the common case: no hash, no lock.
        let map = self.map.as_ref().filter(|m| !m.is_empty())?;
        let now = Instant::now();
        let mut slot = map.slot(key);
        let r = slot.get_mut()?;
        if r.until <= now {
            slot.remove();
            return None;
        }
        if cost < r.cost || r.rule != *rule {
            return None;
        }
        r.answered += 1;
        Some(r.clone())
    }

    /// Resets applied so far: read before asking Redis, and handed to
    /// [`insert`](Self::insert) with the answer.
    pub(crate) fn resets(&self) -> u64 {
        self.resets.load(Ordering::Acquire)
    }

    /// Remembers a refusal Redis answered to a call made at `asked` when
    /// [`resets`](Self::resets) was `seen`; not if a reset came since (the
    /// refusal may predate it). It lasts `wait` from `asked`: Redis decided
    /// it after then, so the entry never outlives the refusal by the
    /// answer's way back (it may end a round trip early: one more call).
    pub(crate) fn insert(
        &self,
        key: &str,
        wait: Duration,
        entry_without_until: Refused,
        seen: u64,
        asked: Option<Instant>,
    ) {
        let Some(map) = self.map.as_ref().filter(|_| !wait.is_zero()) else {
            return;
        };
        let now = Instant::now();
        let until = asked.unwrap_or(now).min(now) + wait;
        if until <= now {
            return;
        }
        let entry = Refused {
            until,
            ..entry_without_until
        };
        let mut slot = map.slot(key);
        // Under the shard's lock, which `forget` takes after counting: a
        // reset either sees this entry or this sees the reset.
        if self.resets.load(Ordering::Acquire) != seen {
            return;
        }
        slot.insert(entry, now);
    }

    /// A reset of `keys`: forgets them, and keeps refusals of calls made
    /// before it out.
    pub(crate) fn forget(&self, keys: &[&str]) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        if let Some(map) = &self.map {
            let now = Instant::now();
            let voided: u64 = keys
                .iter()
                .filter_map(|key| map.remove(key))
                .filter(|r| r.until > now)
                .map(|r| r.answered)
                .sum();
            self.metrics.voided(voided);
        }
    }

    /// Forgets every refusal (a reset may have been missed).
    pub(crate) fn clear(&self) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        if let Some(map) = &self.map {
            let now = Instant::now();
            let voided: u64 = map
                .take_some(usize::MAX)
                .into_iter()
                .filter(|(_, r)| r.until > now)
                .map(|(_, r)| r.answered)
                .sum();
            self.metrics.voided(voided);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.as_ref().map_or(0, Bounded::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounded::SHARDS;

    fn entry(cost: f64) -> Refused {
        let now = Instant::now();
        Refused {
            until: now,
            cost,
            rule: Rule::TokenBucket {
                capacity: 5.0,
                refill_per_sec: 1.0,
            },
            state: LimitState {
                enough: false,
                remaining: 0.0,
                wait: 5.0,
                reset: 5.0,
                capacity: 5.0,
            },
            at: now,
            answered: 0,
        }
    }

    const RULE: Rule = Rule::TokenBucket {
        capacity: 5.0,
        refill_per_sec: 1.0,
    };

    #[tokio::test(start_paused = true)]
    async fn refuses_until_the_retry_then_forgets() {
        let c = RefusedCache::new(100);
        assert!(c.get("k", 1.0, &RULE).is_none());
        c.insert("k", Duration::from_secs(2), entry(2.0), c.resets(), None);
        assert!(c.get("k", 2.0, &RULE).is_some());
        assert!(
            c.get("k", 1.0, &RULE).is_none(),
            "a cheaper request may fit sooner"
        );
        tokio::time::advance(Duration::from_millis(2001)).await;
        assert!(c.get("k", 2.0, &RULE).is_none());
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
                None,
            );
        }
        assert!(c.len() <= 800 + SHARDS, "{}", c.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_forgets_the_keys_and_refusals_asked_before_it() {
        let c = RefusedCache::new(100);
        let seen = c.resets();
        c.insert("a", Duration::from_secs(60), entry(1.0), seen, None);
        c.insert("b", Duration::from_secs(60), entry(1.0), seen, None);
        c.forget(&["a", "nope"]);
        assert!(c.get("a", 1.0, &RULE).is_none());
        assert!(c.get("b", 1.0, &RULE).is_some());
        assert_eq!(c.len(), 1);
        // Redis refused before the reset, the answer arrives after it.
        c.insert("a", Duration::from_secs(60), entry(1.0), seen, None);
        assert!(
            c.get("a", 1.0, &RULE).is_none(),
            "a stale refusal is not kept"
        );
        c.insert("a", Duration::from_secs(60), entry(1.0), c.resets(), None);
        assert!(c.get("a", 1.0, &RULE).is_some());
        c.clear();
        assert_eq!(c.len(), 0);
        assert!(c.get("b", 1.0, &RULE).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_lasts_from_when_redis_was_asked() {
        let c = RefusedCache::new(100);
        let asked = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        c.insert(
            "k",
            Duration::from_secs(1),
            entry(1.0),
            c.resets(),
            Some(asked),
        );
        tokio::time::advance(Duration::from_millis(699)).await;
        assert!(c.get("k", 1.0, &RULE).is_some());
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(c.get("k", 1.0, &RULE).is_none(), "not past Redis's moment");
        // An answer that came after its refusal ended is not kept.
        let asked = Instant::now();
        tokio::time::advance(Duration::from_secs(2)).await;
        c.insert(
            "k",
            Duration::from_secs(1),
            entry(1.0),
            c.resets(),
            Some(asked),
        );
        assert_eq!(c.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_count_and_other_numbers_are_not_answered() {
        let c = RefusedCache::new(100);
        c.insert("k", Duration::from_secs(60), entry(1.0), c.resets(), None);
        let other = Rule::TokenBucket {
            capacity: 50.0,
            refill_per_sec: 1.0,
        };
        assert!(c.get("k", 1.0, &other).is_none(), "a plan change voids it");
        assert!(c.get("k", 1.0, &RULE).is_some());
        assert_eq!(c.get("k", 1.0, &RULE).map(|r| r.answered), Some(2));
    }
}
