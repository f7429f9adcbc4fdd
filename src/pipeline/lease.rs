//! Hot-key token leases (opt-in per token-bucket limit).
//!
//! When one key is busier on this instance than `lease_above` (requests per
//! second), the instance stops asking Redis once per request: it takes
//! `lease_batch` tokens in one call and spends them locally, for at most
//! `LEASE_TTL`. Leased tokens are charged in Redis before they are spent, so
//! a lease never admits more than the limit; what it costs is precision the
//! other way: at any moment up to `lease_batch` tokens per instance per hot
//! key may sit unspent on an instance while another is refused ("early"
//! tokens), and tokens unspent when a lease expires are not given back
//! (stranded; at most `lease_batch` per instance per `LEASE_TTL`). Bounded
//! (see [`Bounded`]): the map forgets keys with neither a live lease nor a
//! hit in the last second first, then those whose hit window began longest
//! ago.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::{Duration, Instant};

use crate::bounded::{Bounded, Evict};

/// A lease lives this long at most.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Entry {
    /// Requests seen in the current one-second window, and when it began.
    hits: u32,
    window: Instant,
    /// Leased tokens not spent yet, and when they lapse.
    tokens: f64,
    expires: Instant,
    /// Remaining in Redis when the lease was taken (for honest headers).
    shared_left: f64,
    /// A lease is being taken: the key's other requests ask Redis as usual
    /// meanwhile instead of each taking a lease of its own.
    taking: bool,
}

impl Evict for Entry {
    type Time = Instant;
    fn expired(&self, now: Instant) -> bool {
        self.expires <= now && now.duration_since(self.window) >= Duration::from_secs(1)
    }
    fn rank(&self) -> Instant {
        self.window
    }
}

#[derive(Debug)]
pub(crate) struct Leases {
    map: Bounded<Entry>,
    /// Resets applied so far (see [`forget`](Leases::forget)).
    resets: AtomicU64,
}

/// What the lease table says about one request.
#[derive(Debug, PartialEq)]
pub(crate) enum LeaseUse {
    /// Spent from a lease: admit. Tokens left in the lease and in Redis.
    Spent { lease_left: f64, shared_left: f64 },
    /// The key is hot: ask Redis for a lease of `batch`.
    Take,
    /// Not hot: ask Redis as usual.
    Normal,
}

impl Leases {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            map: Bounded::new(max_keys),
            resets: AtomicU64::new(0),
        }
    }

    /// Counts the request and spends from a live lease when it can.
    pub(crate) fn use_for(&self, key: &str, cost: f64, above: u32) -> LeaseUse {
        let now = Instant::now();
        let mut slot = self.map.slot(key);
        let e = slot.get_or_insert_with(now, || Entry {
            hits: 0,
            window: now,
            tokens: 0.0,
            expires: now,
            shared_left: 0.0,
            taking: false,
        });
        if now.duration_since(e.window) >= Duration::from_secs(1) {
            e.hits = 0;
            e.window = now;
        }
        e.hits = e.hits.saturating_add(1);
        if e.expires > now && e.tokens >= cost {
            e.tokens -= cost;
            return LeaseUse::Spent {
                lease_left: e.tokens,
                shared_left: e.shared_left,
            };
        }
        if e.hits > above && !e.taking {
            e.taking = true;
            LeaseUse::Take
        } else {
            LeaseUse::Normal
        }
    }

    /// Resets applied so far: read before asking Redis for a lease, and
    /// handed to [`granted`](Self::granted) with the answer.
    pub(crate) fn resets(&self) -> u64 {
        self.resets.load(Ordering::Acquire)
    }

    /// A lease of `tokens` was granted (after this request took its cost)
    /// by a call made when [`resets`](Self::resets) was `seen`. Dropped if a
    /// reset came since: the tokens may be the old bucket's.
    pub(crate) fn granted(&self, key: &str, tokens: f64, shared_left: f64, seen: u64) {
        let mut slot = self.map.slot(key);
        // Read under the lock `forget` takes after counting: a reset either
        // removes this lease or is seen here (see `refused.rs`).
        let fresh = self.resets.load(Ordering::Acquire) == seen;
        if let Some(e) = slot.get_mut().filter(|e| e.taking) {
            e.taking = false;
            if fresh {
                e.tokens = tokens;
                e.expires = Instant::now() + LEASE_TTL;
                e.shared_left = shared_left;
            }
        }
    }

    /// No lease this time (refused, or Redis failed).
    pub(crate) fn not_granted(&self, key: &str) {
        if let Some(e) = self.map.slot(key).get_mut() {
            e.taking = false;
        }
    }

    /// A reset of `keys`: their leases and hit counts go, and leases asked
    /// for before it are not granted.
    pub(crate) fn forget(&self, keys: &[&str]) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        for key in keys {
            self.map.remove(key);
        }
    }

    /// Keeps the leases of the limits `keep` accepts by name (a reload: the
    /// others' numbers changed); leases asked for before it are not granted.
    /// Store keys are `<prefix>:<limit>:{…}`.
    pub(crate) fn retain_limits(&self, prefix: &str, keep: impl Fn(&str) -> bool) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        self.map.retain(|key| {
            let limit = key
                .strip_prefix(prefix)
                .and_then(|k| k.strip_prefix(':'))
                .and_then(|k| k.split(":{").next());
            limit.is_some_and(&keep)
        });
    }

    /// Forgets every lease (a reset may have been missed).
    pub(crate) fn clear(&self) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        self.map.clear();
    }

    /// The key's lease is being taken: [`not_granted`](Self::not_granted)
    /// when the claim is dropped, unless it was disarmed (granted).
    pub(crate) fn claim<'a>(&'a self, key: &'a str) -> Claim<'a> {
        Claim {
            leases: self,
            key,
            armed: true,
        }
    }
}

/// See [`Leases::claim`].
#[derive(Debug)]
pub(crate) struct Claim<'a> {
    leases: &'a Leases,
    key: &'a str,
    armed: bool,
}

impl Claim<'_> {
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.leases.not_granted(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reload_keeps_the_leases_of_unchanged_limits_only() {
        let l = Leases::new(100);
        for key in ["app:rl:hot:{h#aa}", "app:rl:changed:{h#aa}"] {
            for _ in 0..2 {
                l.use_for(key, 1.0, 1);
            }
            l.granted(key, 5.0, 50.0, l.resets());
        }
        let asked_before = l.resets();
        l.retain_limits("app:rl", |limit| limit != "changed");
        assert!(matches!(
            l.use_for("app:rl:hot:{h#aa}", 1.0, 1),
            LeaseUse::Spent { lease_left, .. } if lease_left == 4.0
        ));
        assert_eq!(l.use_for("app:rl:changed:{h#aa}", 1.0, 1), LeaseUse::Normal);
        // A lease asked for before the reload is not granted after it.
        assert_eq!(l.use_for("app:rl:changed:{h#aa}", 1.0, 1), LeaseUse::Take);
        l.granted("app:rl:changed:{h#aa}", 5.0, 50.0, asked_before);
        assert_eq!(l.use_for("app:rl:changed:{h#aa}", 1.0, 1), LeaseUse::Take);
    }

    #[tokio::test(start_paused = true)]
    async fn hot_keys_take_leases_and_spend_them_until_they_lapse() {
        let l = Leases::new(100);
        assert_eq!(l.use_for("k", 1.0, 2), LeaseUse::Normal);
        assert_eq!(l.use_for("k", 1.0, 2), LeaseUse::Normal);
        assert_eq!(l.use_for("k", 1.0, 2), LeaseUse::Take);
        assert_eq!(
            l.use_for("k", 1.0, 2),
            LeaseUse::Normal,
            "one lease taken at a time"
        );
        l.granted("k", 2.0, 50.0, l.resets());
        assert!(matches!(l.use_for("k", 1.0, 2), LeaseUse::Spent { .. }));
        assert!(
            matches!(l.use_for("k", 1.0, 2), LeaseUse::Spent { lease_left, .. } if lease_left == 0.0)
        );
        assert_eq!(l.use_for("k", 1.0, 2), LeaseUse::Take);
        l.granted("k", 5.0, 40.0, l.resets());
        tokio::time::advance(LEASE_TTL + Duration::from_millis(1)).await;
        assert_eq!(
            l.use_for("k", 1.0, 2),
            LeaseUse::Normal,
            "lapsed, and the window restarted"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_claim_lets_the_key_take_a_lease_again() {
        let l = Leases::new(100);
        assert_eq!(l.use_for("k", 1.0, 1), LeaseUse::Normal);
        assert_eq!(l.use_for("k", 1.0, 1), LeaseUse::Take);
        assert_eq!(l.use_for("k", 1.0, 1), LeaseUse::Normal, "being taken");
        // The request taking it went away before Redis answered.
        drop(l.claim("k"));
        assert_eq!(l.use_for("k", 1.0, 1), LeaseUse::Take);
        // A granted claim is disarmed: the lease is spent, not taken again.
        l.claim("k").disarm();
        l.granted("k", 2.0, 50.0, l.resets());
        assert!(matches!(l.use_for("k", 1.0, 1), LeaseUse::Spent { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_drops_the_lease_and_one_asked_for_before_it() {
        let l = Leases::new(100);
        assert_eq!(l.use_for("k", 1.0, 1), LeaseUse::Normal);
        assert_eq!(l.use_for("k", 1.0, 1), LeaseUse::Take);
        l.granted("k", 5.0, 50.0, l.resets());
        assert!(matches!(l.use_for("k", 1.0, 1), LeaseUse::Spent { .. }));
        l.forget(&["k"]);
        assert_eq!(l.use_for("k", 1.0, 1), LeaseUse::Normal, "to Redis");
        assert_eq!(l.use_for("k", 1.0, 1), LeaseUse::Take);
        // Redis granted it before a reset; the answer comes after.
        let seen = l.resets();
        l.forget(&["other"]);
        l.granted("k", 5.0, 50.0, seen);
        assert_eq!(
            l.use_for("k", 1.0, 1),
            LeaseUse::Take,
            "no lease, not stuck"
        );
        l.clear();
        assert_eq!(l.use_for("k", 1.0, 1), LeaseUse::Normal);
    }

    #[tokio::test(start_paused = true)]
    async fn bounded() {
        let l = Leases::new(64);
        for i in 0..10_000 {
            let _ = l.use_for(&format!("k{i}"), 1.0, 1);
        }
        assert!(l.map.len() <= 64, "{}", l.map.len());
    }
}
