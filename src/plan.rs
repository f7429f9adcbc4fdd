//! Plans (tiers): which numbers a caller gets.
//!
//! A limit's numbers can depend on the caller's plan: `[plans.pro.api]`
//! gives callers on `pro` other numbers for limit `api`. A caller's plan is
//! found by key (the limit's key value: API key, account): first in the
//! static `[plan_assignments]` table, then by your [`PlanResolver`] (a
//! database lookup, say), whose answers are cached per key for
//! `[plan_cache] ttl` (5 s by default) — so a plan change takes effect within
//! that time. The Redis key does not depend on the plan: an upgrade raises
//! the ceiling over the usage so far, and a downgrade does not forgive it.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// The static table, then the resolver behind a bounded per-key cache.
pub(crate) struct Plans {
    assignments: HashMap<String, Arc<str>>,
    resolver: Option<Arc<dyn PlanResolver>>,
    ttl: Duration,
    max_keys: usize,
    cache: Mutex<Cache>,
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
        }
    }

    /// The caller's plan; `None` for the base numbers.
    pub(crate) async fn plan_of(&self, key: &str) -> Option<Arc<str>> {
        if let Some(p) = self.assignments.get(key) {
            return Some(Arc::clone(p));
        }
        let resolver = self.resolver.as_ref()?;
        let now = Instant::now();
        if let Some((plan, at)) = self.lock().get(key) {
            if now.duration_since(*at) < self.ttl {
                return plan.clone();
            }
        }
        let plan = match tokio::time::timeout(RESOLVE_TIMEOUT, resolver.resolve(key)).await {
            Ok(p) => p.map(Arc::<str>::from),
            Err(_) => {
                // Cached like an answer, so a slow resolver costs each key
                // this wait once per TTL, not on every request.
                tracing::warn!(target: "fleetlimit", "plan resolver timed out; using the base numbers");
                None
            }
        };
        let mut cache = self.lock();
        if cache.len() >= self.max_keys {
            // Bounded: drop what is stale, and if that is not enough, all.
            cache.retain(|_, (_, at)| now.duration_since(*at) < self.ttl);
            if cache.len() >= self.max_keys {
                cache.clear();
            }
        }
        cache.insert(key.to_owned(), (plan.clone(), now));
        plan
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
}
