//! Plans (tiers): which numbers a caller gets.
//!
//! A limit's numbers can depend on the caller's plan: `[plans.pro.api]`
//! gives callers on `pro` other numbers for limit `api`. A caller's plan is
//! found by key (the limit's key value: API key, account): first in the
//! static `[plan_assignments]` table, then by your [`PlanResolver`] (a
//! database lookup, say), whose answers are cached per key for
//! `[plan_cache] ttl` (5 s by default) — so a plan change takes effect within
//! that time. Requests of one key that arrive while its lookup is in flight
//! wait for that lookup: a burst from a new key costs the resolver one call.
//! The Redis key does not depend on the plan: an upgrade raises the ceiling
//! over the usage so far, and a downgrade does not forgive it.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sync::lock;
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// The future a [`PlanResolver`] returns.
pub type PlanFuture<'a> = Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>>;

/// Finds a caller's plan by key (API key, account id...). `None`: the
/// limit's base numbers.
///
/// ```
/// use fleetlimit::plan::{PlanFuture, PlanResolver};
///
/// struct FromDatabase;
///
/// impl PlanResolver for FromDatabase {
///     fn resolve<'a>(&'a self, key: &'a str) -> PlanFuture<'a> {
///         Box::pin(async move {
///             // e.g. SELECT plan FROM api_keys WHERE key = $1
///             key.starts_with("pro_").then(|| "pro".to_owned())
///         })
///     }
/// }
/// ```
pub trait PlanResolver: Send + Sync + 'static {
    /// The plan of the caller with this key.
    fn resolve<'a>(&'a self, key: &'a str) -> PlanFuture<'a>;
}

/// A resolver that is slower than this is skipped (base numbers, logged).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(1);

/// Key → (its plan, when it was looked up).
type Cache = HashMap<String, (Option<Arc<str>>, Instant)>;

/// Key → the lookup in flight for it, shared by every request that waits
/// on that key meanwhile (one resolver call, not one per request).
type InFlight = HashMap<String, Arc<OnceCell<Option<Arc<str>>>>>;

/// The static table, then the resolver behind a bounded per-key cache.
pub(crate) struct Plans {
    assignments: HashMap<String, Arc<str>>,
    resolver: Option<Arc<dyn PlanResolver>>,
    ttl: Duration,
    max_keys: usize,
    cache: Mutex<Cache>,
    in_flight: Mutex<InFlight>,
}

impl fmt::Debug for Plans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plans")
            .field("assignments", &self.assignments.len())
            .field("resolver", &self.resolver.is_some())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Plans {
    pub(crate) fn new(
        assignments: HashMap<String, Arc<str>>,
        resolver: Option<Arc<dyn PlanResolver>>,
        ttl: Duration,
        max_keys: usize,
    ) -> Self {
        Self {
            assignments,
            resolver,
            ttl,
            max_keys: max_keys.max(1),
            cache: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// The caller's plan; `None` for the base numbers.
    pub(crate) async fn plan_of(&self, key: &str) -> Option<Arc<str>> {
        if let Some(p) = self.assignments.get(key) {
            return Some(Arc::clone(p));
        }
        let resolver = self.resolver.as_ref()?;
        let now = Instant::now();
        if let Some((plan, at)) = lock(&self.cache).get(key) {
            if now.duration_since(*at) < self.ttl {
                return plan.clone();
            }
        }
        // Requests of one key that miss the cache together share one call.
        // If the caller running it goes away, a waiting one takes over
        // (`OnceCell::get_or_init` is cancel-safe).
        let cell = {
            let mut in_flight = lock(&self.in_flight);
            if in_flight.len() >= self.max_keys && !in_flight.contains_key(key) {
                // Bounded: drop lookups nobody waits on any more.
                in_flight.retain(|_, c| Arc::strong_count(c) > 1);
            }
            Arc::clone(in_flight.entry(key.to_owned()).or_default())
        };
        let plan = cell
            .get_or_init(|| async {
                match tokio::time::timeout(RESOLVE_TIMEOUT, resolver.resolve(key)).await {
                    Ok(p) => p.map(Arc::<str>::from),
                    Err(_) => {
                        // Cached like an answer, so a slow resolver costs
                        // each key this wait once per TTL, not per request.
                        tracing::warn!(target: "fleetlimit", "plan resolver timed out; using the base numbers");
                        None
                    }
                }
            })
            .await
            .clone();
        {
            let mut cache = lock(&self.cache);
            if cache.len() >= self.max_keys {
                // Bounded: drop what is stale, and if that is not enough, all.
                cache.retain(|_, (_, at)| now.duration_since(*at) < self.ttl);
                if cache.len() >= self.max_keys {
                    cache.clear();
                }
            }
            cache.insert(key.to_owned(), (plan.clone(), now));
        }
        // Cached first, then retired: a request in between finds one or the other.
        let mut in_flight = lock(&self.in_flight);
        if in_flight.get(key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            in_flight.remove(key);
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counting(AtomicUsize);

    impl PlanResolver for Counting {
        fn resolve<'a>(&'a self, key: &'a str) -> PlanFuture<'a> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { (n > 0).then(|| format!("{key}-{n}")) })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn cached_for_the_ttl_then_asked_again() {
        let r = Arc::new(Counting(AtomicUsize::new(0)));
        let mut static_table = HashMap::new();
        static_table.insert("vip".to_owned(), Arc::<str>::from("gold"));
        let plans = Plans::new(static_table, Some(r.clone()), Duration::from_secs(5), 100);
        assert_eq!(plans.plan_of("vip").await.as_deref(), Some("gold"));
        assert_eq!(plans.plan_of("k").await, None);
        assert_eq!(plans.plan_of("k").await, None, "cached");
        assert_eq!(r.0.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(plans.plan_of("k").await.as_deref(), Some("k-1"));
    }

    /// Answers after 100 ms (paused time), counting its calls.
    struct Slow(AtomicUsize);

    impl PlanResolver for Slow {
        fn resolve<'a>(&'a self, key: &'a str) -> PlanFuture<'a> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Some(format!("{key}-plan"))
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_of_one_key_share_one_lookup_in_flight() {
        let r = Arc::new(Slow(AtomicUsize::new(0)));
        let plans = Arc::new(Plans::new(
            HashMap::new(),
            Some(r.clone()),
            Duration::from_secs(5),
            100,
        ));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..20 {
            let plans = Arc::clone(&plans);
            let key = if i % 2 == 0 { "a" } else { "b" };
            tasks.spawn(async move { (key, plans.plan_of(key).await) });
        }
        while let Some(done) = tasks.join_next().await {
            let (key, plan) = done.unwrap();
            assert_eq!(plan.as_deref(), Some(format!("{key}-plan").as_str()));
        }
        assert_eq!(
            r.0.load(Ordering::SeqCst),
            2,
            "one call per key, not per request"
        );
        assert!(lock(&plans.in_flight).is_empty());

        // A caller that goes away mid-lookup: the next one takes over.
        let gone = tokio::time::timeout(Duration::from_millis(10), plans.plan_of("c")).await;
        assert!(gone.is_err());
        assert_eq!(plans.plan_of("c").await.as_deref(), Some("c-plan"));
        assert_eq!(r.0.load(Ordering::SeqCst), 4);
    }
}
