//! Hot-key token leases (opt-in per token-bucket limit).
//!
//! When one key is busier on this instance than `lease_above` (requests per
//! second), the instance stops asking Redis once per request: one call
//! takes up to `lease_batch` tokens, as many whole requests' worth as are
//! free, possibly none (a partial lease, `lua/token_bucket_lease.lua`), and
//! the instance spends them locally for at most [`LEASE_TTL`]. A lease that
//! came short also says when a whole batch fits again: until then (at most
//! [`LEASE_TTL`]) the instance refuses the key by itself once its tokens are
//! spent, with that wait as `Retry-After`, instead of asking Redis per
//! request. So a key at or over its limit costs about one call per batch
//! per instance ([`take.rs`](take)).
//!
//! Leased tokens are charged in Redis before they are spent, so the fleet
//! never admits more than the bucket does (burst + refill × elapsed). What
//! leases cost is precision the other way (docs/accuracy.md, "Hot-key
//! leases"): up to `lease_batch` tokens per instance per hot key may sit
//! unspent on one instance while another refuses ("early" refusals), and
//! up to one batch may refill in Redis while the instances wait for it;
//! tokens unspent when a lease lapses are not given back (stranded; at
//! most `lease_batch` per instance per `LEASE_TTL`, counted by the
//! `metrics` feature). Bounded (see [`Bounded`]): the map forgets keys
//! with neither a live lease nor a hit in the last second first, then
//! those whose hit window began longest ago.

pub(super) mod take;

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

use crate::bounded::{Bounded, Evict};

/// A lease lives this long at most; so does a wait for the next one.
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
    /// The last lease came short: no lease is asked for before this (when
    /// the script said a whole batch fits again, at most `LEASE_TTL`).
    until: Instant,
    /// The last lease got nothing: the free tokens were all taken, by the
    /// leases of other instances or their requests.
    empty: bool,
    /// A lease is being taken: the key's other requests wait for it
    /// ([`Leases::wait_taken`]) instead of each asking Redis.
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
    /// Told when a lease being taken is granted or not.
    taken: Notify,
}

/// What the lease table says about one request.
#[derive(Debug, PartialEq)]
pub(crate) enum LeaseUse {
    /// Spent from a lease: admit. Tokens left in the lease and in Redis.
    Spent { lease_left: f64, shared_left: f64 },
    /// The last lease came short and its tokens are spent: refuse here for
    /// `left` more, when the next ones come. `empty`: it got nothing.
    Wait {
        left: Duration,
        empty: bool,
        shared_left: f64,
    },
    /// The key is hot: ask Redis for a lease of up to a batch.
    Take,
    /// Another request of the key is taking a lease: wait for it
    /// ([`Leases::wait_taken`]), then ask the table again.
    Pending,
    /// Not hot: ask Redis as usual.
    Normal,
}

/// What Redis granted a lease (see [`Leases::granted`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Grant {
    /// Tokens for the key's next requests here (after the request that
    /// took the lease took its cost, when it could).
    pub(crate) tokens: f64,
    /// Remaining in Redis after the lease.
    pub(crate) shared_left: f64,
    /// Short of a whole batch: when a whole batch fits again.
    pub(crate) wait: Option<Duration>,
    /// Nothing was granted.
    pub(crate) empty: bool,
}

impl Leases {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            map: Bounded::new(max_keys),
            resets: AtomicU64::new(0),
            taken: Notify::new(),
        }
    }

    /// Counts the request and spends from a live lease when it can. Also
    /// answers the tokens of a lease found lapsed unspent (stranded).
    pub(crate) fn use_for(&self, key: &str, cost: f64, above: u32) -> (LeaseUse, f64) {
        self.using(key, cost, above, true)
    }

    /// [`use_for`](Self::use_for) again after [`wait_taken`](Self::wait_taken):
    /// the request is not counted twice.
    pub(crate) fn use_again(&self, key: &str, cost: f64, above: u32) -> (LeaseUse, f64) {
        self.using(key, cost, above, false)
    }

    fn using(&self, key: &str, cost: f64, above: u32, count: bool) -> (LeaseUse, f64) {
        let now = Instant::now();
        let mut slot = self.map.slot(key);
        let e = slot.get_or_insert_with(now, || Entry {
            hits: 0,
            window: now,
            tokens: 0.0,
            expires: now,
            shared_left: 0.0,
            until: now,
            empty: false,
            taking: false,
        });
        let since = now.duration_since(e.window);
        if since >= Duration::from_secs(1) {
            // Hot in the window just ended: still hot (no `above` requests
            // to Redis one by one every second).
            let hot = e.hits > above && since < Duration::from_secs(2);
            e.hits = if hot { above } else { 0 };
            e.window = now;
        }
        if count {
            e.hits = e.hits.saturating_add(1);
        }
        let mut stranded = 0.0;
        if e.expires <= now && e.tokens > 0.0 {
            stranded = std::mem::take(&mut e.tokens);
        }
        if e.expires > now && e.tokens >= cost {
            e.tokens -= cost;
            let spent = LeaseUse::Spent {
                lease_left: e.tokens,
                shared_left: e.shared_left,
            };
            return (spent, stranded);
        }
        let what = if e.until > now {
            LeaseUse::Wait {
                left: e.until - now,
                empty: e.empty,
                shared_left: e.shared_left,
            }
        } else if e.taking {
            LeaseUse::Pending
        } else if e.hits > above {
            e.taking = true;
            LeaseUse::Take
        } else {
            LeaseUse::Normal
        };
        (what, stranded)
    }

    /// Resets applied so far: read before asking Redis for a lease, and
    /// handed to [`granted`](Self::granted) with the answer.
    pub(crate) fn resets(&self) -> u64 {
        self.resets.load(Ordering::Acquire)
    }

    /// A lease was granted by a call made when [`resets`](Self::resets)
    /// was `seen`. Dropped if a reset came since: the tokens may be the old
    /// bucket's. Answers the tokens of the lease it replaces (stranded).
    pub(crate) fn granted(&self, key: &str, g: Grant, seen: u64) -> f64 {
        let mut slot = self.map.slot(key);
        // Read under the lock `forget` takes after counting: a reset either
        // removes this lease or is seen here (see `refused.rs`).
        let fresh = self.resets.load(Ordering::Acquire) == seen;
        // Waiters check again under the lock: told now, they see this.
        self.taken.notify_waiters();
        let Some(e) = slot.get_mut().filter(|e| e.taking) else {
            return 0.0;
        };
        e.taking = false;
        if !fresh {
            return 0.0;
        }
        let now = Instant::now();
        let stranded = if e.expires > now { e.tokens } else { 0.0 };
        e.tokens = g.tokens;
        e.expires = now + LEASE_TTL;
        e.shared_left = g.shared_left;
        e.until = now + g.wait.map_or(Duration::ZERO, |w| w.min(LEASE_TTL));
        e.empty = g.empty;
        stranded
    }

    /// No lease this time (Redis failed, or the request went away).
    pub(crate) fn not_granted(&self, key: &str) {
        if let Some(e) = self.map.slot(key).get_mut() {
            e.taking = false;
        }
        self.taken.notify_waiters();
    }

    /// Waits until the lease being taken for `key` is granted or not, at
    /// most `LEASE_TTL` (its taker waits within the store's deadline, and
    /// a taker that goes away says so). `false`: still being taken.
    pub(crate) async fn wait_taken(&self, key: &str) -> bool {
        let until = Instant::now() + LEASE_TTL;
        loop {
            // Registered before the check: a grant between them still wakes.
            let told = self.taken.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            let taking = self.map.slot(key).get_mut().is_some_and(|e| e.taking);
            if !taking {
                return true;
            }
            if tokio::time::timeout_at(until, told).await.is_err() {
                return false;
            }
        }
    }

    /// A reset of `keys`: their leases and hit counts go, and leases asked
    /// for before it are not granted.
    pub(crate) fn forget(&self, keys: &[&str]) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        for key in keys {
            self.map.remove(key);
        }
        self.taken.notify_waiters();
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
        self.taken.notify_waiters();
    }

    /// Forgets every lease (a reset may have been missed).
    pub(crate) fn clear(&self) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        self.map.clear();
        self.taken.notify_waiters();
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

    fn full(tokens: f64, shared_left: f64) -> Grant {
        Grant {
            tokens,
            shared_left,
            wait: None,
            empty: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_keeps_the_leases_of_unchanged_limits_only() {
        let l = Leases::new(100);
        for key in ["app:rl:hot:{h#aa}", "app:rl:changed:{h#aa}"] {
            for _ in 0..2 {
                let _ = l.use_for(key, 1.0, 1);
            }
            l.granted(key, full(5.0, 50.0), l.resets());
        }
        let asked_before = l.resets();
        l.retain_limits("app:rl", |limit| limit != "changed");
        assert!(matches!(
            l.use_for("app:rl:hot:{h#aa}", 1.0, 1).0,
            LeaseUse::Spent { lease_left, .. } if lease_left == 4.0
        ));
        assert_eq!(
            l.use_for("app:rl:changed:{h#aa}", 1.0, 1).0,
            LeaseUse::Normal
        );
        // A lease asked for before the reload is not granted after it.
        assert_eq!(l.use_for("app:rl:changed:{h#aa}", 1.0, 1).0, LeaseUse::Take);
        l.granted("app:rl:changed:{h#aa}", full(5.0, 50.0), asked_before);
        assert_eq!(l.use_for("app:rl:changed:{h#aa}", 1.0, 1).0, LeaseUse::Take);
    }

    #[tokio::test(start_paused = true)]
    async fn hot_keys_take_leases_and_spend_them_until_they_lapse() {
        let l = Leases::new(100);
        assert_eq!(l.use_for("k", 1.0, 2).0, LeaseUse::Normal);
        assert_eq!(l.use_for("k", 1.0, 2).0, LeaseUse::Normal);
        assert_eq!(l.use_for("k", 1.0, 2).0, LeaseUse::Take);
        assert_eq!(
            l.use_for("k", 1.0, 2).0,
            LeaseUse::Pending,
            "one lease taken at a time"
        );
        l.granted("k", full(2.0, 50.0), l.resets());
        assert!(matches!(l.use_for("k", 1.0, 2).0, LeaseUse::Spent { .. }));
        assert!(
            matches!(l.use_for("k", 1.0, 2).0, LeaseUse::Spent { lease_left, .. } if lease_left == 0.0)
        );
        assert_eq!(l.use_for("k", 1.0, 2).0, LeaseUse::Take);
        l.granted("k", full(5.0, 40.0), l.resets());
        tokio::time::advance(LEASE_TTL + Duration::from_millis(1)).await;
        assert_eq!(
            l.use_for("k", 1.0, 2),
            (LeaseUse::Take, 5.0),
            "lapsed unspent (stranded, counted once); hot in the last second"
        );
        l.not_granted("k");
        assert_eq!(l.use_for("k", 1.0, 2), (LeaseUse::Take, 0.0));
        l.not_granted("k");
        // Quiet for a second: the window restarts cold.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(l.use_for("k", 1.0, 2), (LeaseUse::Normal, 0.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_claim_lets_the_key_take_a_lease_again() {
        let l = Leases::new(100);
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Normal);
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Take);
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Pending, "being taken");
        // The request taking it went away before Redis answered.
        drop(l.claim("k"));
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Take);
        // A granted claim is disarmed: the lease is spent, not taken again.
        l.claim("k").disarm();
        l.granted("k", full(2.0, 50.0), l.resets());
        assert!(matches!(l.use_for("k", 1.0, 1).0, LeaseUse::Spent { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_drops_the_lease_and_one_asked_for_before_it() {
        let l = Leases::new(100);
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Normal);
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Take);
        l.granted("k", full(5.0, 50.0), l.resets());
        assert!(matches!(l.use_for("k", 1.0, 1).0, LeaseUse::Spent { .. }));
        l.forget(&["k"]);
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Normal, "to Redis");
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Take);
        // Redis granted it before a reset; the answer comes after.
        let seen = l.resets();
        l.forget(&["other"]);
        l.granted("k", full(5.0, 50.0), seen);
        assert_eq!(
            l.use_for("k", 1.0, 1).0,
            LeaseUse::Take,
            "no lease, not stuck"
        );
        l.clear();
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Normal);
    }

    #[tokio::test(start_paused = true)]
    async fn bounded() {
        let l = Leases::new(64);
        for i in 0..10_000 {
            let _ = l.use_for(&format!("k{i}"), 1.0, 1);
        }
        assert!(l.map.len() <= 64, "{}", l.map.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_lease_refuses_here_until_its_wait_then_asks_again() {
        let l = Leases::new(100);
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Normal);
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Take);
        let short = Grant {
            tokens: 2.0,
            shared_left: 0.0,
            wait: Some(Duration::from_millis(50)),
            empty: false,
        };
        l.granted("k", short, l.resets());
        for _ in 0..2 {
            assert!(matches!(l.use_for("k", 1.0, 1).0, LeaseUse::Spent { .. }));
        }
        let wait = |left: u64, empty| LeaseUse::Wait {
            left: Duration::from_millis(left),
            empty,
            shared_left: 0.0,
        };
        assert_eq!(l.use_for("k", 1.0, 1).0, wait(50, false));
        tokio::time::advance(Duration::from_millis(20)).await;
        assert_eq!(l.use_for("k", 1.0, 1).0, wait(30, false));
        tokio::time::advance(Duration::from_millis(30)).await;
        assert_eq!(l.use_for("k", 1.0, 1).0, LeaseUse::Take, "the wait is over");
        // Nothing was free, and a whole batch is far off: the TTL bounds it.
        let empty = Grant {
            tokens: 0.0,
            shared_left: 0.0,
            wait: Some(Duration::from_secs(3600)),
            empty: true,
        };
        l.granted("k", empty, l.resets());
        assert_eq!(l.use_for("k", 1.0, 1).0, wait(1000, true));
        tokio::time::advance(LEASE_TTL).await;
        assert_eq!(
            l.use_for("k", 1.0, 1).0,
            LeaseUse::Take,
            "hot in the last second: still hot"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_replaced_before_it_lapsed_strands_what_it_held() {
        let l = Leases::new(100);
        let _ = l.use_for("k", 3.0, 0);
        l.granted("k", full(4.0, 10.0), l.resets());
        assert!(matches!(l.use_for("k", 3.0, 0).0, LeaseUse::Spent { .. }));
        // One unit left: not a request of cost 3.
        assert_eq!(l.use_for("k", 3.0, 0).0, LeaseUse::Take);
        assert_eq!(l.granted("k", full(6.0, 10.0), l.resets()), 1.0);
        // A grant nobody asked for (dropped claim) strands nothing.
        assert_eq!(l.granted("k", full(6.0, 10.0), l.resets()), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_during_a_take_wait_for_it_then_spend_from_it() {
        let l = std::sync::Arc::new(Leases::new(100));
        assert_eq!(l.use_for("k", 1.0, 0).0, LeaseUse::Take);
        assert_eq!(l.use_for("k", 1.0, 0).0, LeaseUse::Pending);
        let waiter = {
            let l = std::sync::Arc::clone(&l);
            tokio::spawn(async move { l.wait_taken("k").await })
        };
        tokio::task::yield_now().await;
        l.granted("k", full(3.0, 10.0), l.resets());
        assert!(waiter.await.unwrap(), "told when granted");
        assert!(matches!(
            l.use_again("k", 1.0, 0).0,
            LeaseUse::Spent { lease_left, .. } if lease_left == 2.0
        ));
        // Never answered (a taker stuck): the wait ends at LEASE_TTL.
        let _ = l.use_for("k", 3.0, 0);
        assert_eq!(l.use_for("k", 3.0, 0).0, LeaseUse::Pending);
        let start = Instant::now();
        assert!(!l.wait_taken("k").await);
        assert_eq!(start.elapsed(), LEASE_TTL);
        // A reset while it is taken wakes the waiters.
        let waiter = {
            let l = std::sync::Arc::clone(&l);
            tokio::spawn(async move { l.wait_taken("k").await })
        };
        tokio::task::yield_now().await;
        l.forget(&["k"]);
        assert!(waiter.await.unwrap());
    }
}
