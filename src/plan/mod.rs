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
//! The cache is a bounded map (`bounded.rs`) of about `[plan_cache] max_keys` keys
//! (stale answers and abandoned lookups go first, then the oldest).
//! The Redis key does not depend on the plan: an upgrade raises the ceiling
//! over the usage so far, and a downgrade does not forgive it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "postgres")]
mod postgres;
mod resolver;

#[cfg(feature = "postgres")]
pub use self::postgres::PostgresPlans;
pub use self::resolver::PlanResolver;

use crate::bounded::{Bounded, Evict};
use crate::log_throttle::Throttle;
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// How long an error stands for a key before the resolver is asked again
/// (at most the cache TTL).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A resolver that is slower than this is skipped (base numbers, logged).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(1);

/// A lookup shared by every request of its key that waits meanwhile (one
/// resolver call, not one per request): the plan, and how long it holds.
type Lookup = Arc<OnceCell<(Option<Arc<str>>, Duration)>>;

/// What the cache knows of a key, and since when.
#[derive(Debug)]
struct Cached {
    plan: Plan,
    at: Instant,
}

#[derive(Debug)]
enum Plan {
    /// Looked up; fresh until `stale_at` (`None`: a TTL beyond the clock).
    Known {
        plan: Option<Arc<str>>,
        stale_at: Option<Instant>,
    },
    InFlight(Lookup),
}

impl Plan {
    fn is(&self, lookup: &Lookup) -> bool {
        matches!(self, Plan::InFlight(l) if Arc::ptr_eq(l, lookup))
    }
}

/// Stale answers and lookups nobody waits on any more go first.
impl Evict for Cached {
    type Time = Instant;
    fn expired(&self, now: Instant) -> bool {
        match &self.plan {
            Plan::Known { stale_at, .. } => stale_at.is_some_and(|t| now >= t),
            Plan::InFlight(lookup) => Arc::strong_count(lookup) == 1,
        }
    }
    fn rank(&self) -> Instant {
        self.at
    }
}

/// The static table, then the resolver behind a bounded per-key cache.
pub(crate) struct Plans {
    assignments: HashMap<String, Arc<str>>,
    resolver: Option<Arc<dyn PlanResolver>>,
    /// The plans the configuration defines: a resolver's answer outside
    /// them is the base numbers, and logged.
    known: HashSet<Arc<str>>,
    unknown_log: Throttle,
    ttl: Duration,
    /// Answers, and the lookups in flight.
    cache: Bounded<Cached>,
    /// Failed or slow lookups: one log line a second.
    errors_logged: Throttle,
    /// Cache hits and misses (feature `metrics`).
    metrics: crate::metrics::PlanMetrics,
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
        known: HashSet<Arc<str>>,
        ttl: Duration,
        max_keys: usize,
    ) -> Self {
        Self {
            assignments,
            resolver,
            known,
            unknown_log: Throttle::default(),
            ttl,
            cache: Bounded::new(max_keys),
            errors_logged: Throttle::default(),
            metrics: crate::metrics::PlanMetrics::new(),
        }
    }

    /// The caller's plan; `None` for the base numbers.
    pub(crate) async fn plan_of(&self, key: &str) -> Option<Arc<str>> {
        if let Some(p) = self.assignments.get(key) {
            return Some(Arc::clone(p));
        }
        let resolver = self.resolver.as_ref()?;
        let now = Instant::now();
        // Requests of one key that miss the cache together share one call.
        // If the caller running it goes away, a waiting one takes over
        // (`OnceCell::get_or_init` is cancel-safe).
        let cell = {
            let mut slot = self.cache.slot(key);
            let cached = slot.get_or_insert_with(now, || Cached {
                plan: Plan::InFlight(Lookup::default()),
                at: now,
            });
            match &cached.plan {
                Plan::Known { plan, stale_at } if stale_at.is_none_or(|t| now < t) => {
                    self.metrics.hit();
                    return plan.clone();
                }
                Plan::InFlight(cell) => Arc::clone(cell),
                Plan::Known { .. } => {
                    let cell = Lookup::default();
                    *cached = Cached {
                        plan: Plan::InFlight(Arc::clone(&cell)),
                        at: now,
                    };
                    cell
                }
            }
        };
        self.metrics.miss();
        let (plan, fresh_for) = cell
            .get_or_init(|| async {
                match tokio::time::timeout(RESOLVE_TIMEOUT, resolver.resolve(key)).await {
                    Ok(Ok(Some(p))) => match self.known.get(p.as_str()) {
                        Some(known) => (Some(Arc::clone(known)), self.ttl),
                        None => {
                            // A bad row must not go unnoticed; the caller
                            // (whose key is not logged) keeps the base numbers.
                            if let Some(held) = self.unknown_log.event() {
                                let plan: String = p.chars().take(64).collect();
                                tracing::warn!(
                                    target: "fleetlimit",
                                    plan = ?plan,
                                    suppressed = held,
                                    "plan resolver named a plan the configuration does not define; using the base numbers"
                                );
                            }
                            (None, self.ttl)
                        }
                    },
                    Ok(Ok(None)) => (None, self.ttl),
                    Ok(Err(e)) => {
                        // Not "no plan": asked again soon, not after a TTL.
                        if let Some(suppressed) = self.errors_logged.event() {
                            tracing::warn!(target: "fleetlimit", error = %e, suppressed, "plan resolver failed; using the base numbers");
                        }
                        (None, self.ttl.min(RETRY_AFTER))
                    }
                    Err(_) => {
                        // Cached like an answer, so a slow resolver costs
                        // each key this wait once per TTL, not per request.
                        if let Some(suppressed) = self.errors_logged.event() {
                            tracing::warn!(target: "fleetlimit", suppressed, "plan resolver timed out; using the base numbers");
                        }
                        (None, self.ttl)
                    }
                }
            })
            .await
            .clone();
        // Cached for the next requests, unless a newer lookup took the
        // key's place meanwhile (this one was evicted).
        let mut slot = self.cache.slot(key);
        if slot
            .get_mut()
            .is_none_or(|c| c.plan.is(&cell) || matches!(c.plan, Plan::Known { .. }))
        {
            let known = Cached {
                plan: Plan::Known {
                    plan: plan.clone(),
                    stale_at: now.checked_add(fresh_for),
                },
                at: now,
            };
            slot.insert(known, now);
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::resolver::PlanError;
    use super::*;
    use std::future::Future;
    use std::pin::Pin;

    /// What a resolver written by hand returns.
    type PlanFuture<'a> =
        Pin<Box<dyn Future<Output = Result<Option<String>, PlanError>> + Send + 'a>>;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counting(AtomicUsize);

    fn known(names: impl IntoIterator<Item = String>) -> HashSet<Arc<str>> {
        names.into_iter().map(Arc::from).collect()
    }

    impl PlanResolver for Counting {
        fn resolve<'a>(&'a self, key: &'a str) -> PlanFuture<'a> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok((n > 0).then(|| format!("{key}-{n}"))) })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn cached_for_the_ttl_then_asked_again() {
        let r = Arc::new(Counting(AtomicUsize::new(0)));
        let mut static_table = HashMap::new();
        static_table.insert("vip".to_owned(), Arc::<str>::from("gold"));
        let plans = Plans::new(
            static_table,
            Some(r.clone()),
            known(["k-1".to_owned()]),
            Duration::from_secs(5),
            100,
        );
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
                Ok(Some(format!("{key}-plan")))
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_of_one_key_share_one_lookup_in_flight() {
        let r = Arc::new(Slow(AtomicUsize::new(0)));
        let plans = Arc::new(Plans::new(
            HashMap::new(),
            Some(r.clone()),
            known(["a", "b", "c"].map(|k| format!("{k}-plan"))),
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
        for key in ["a", "b"] {
            let mut slot = plans.cache.slot(key);
            let cached = slot.get_mut().map(|c| &c.plan);
            assert!(
                matches!(cached, Some(Plan::Known { .. })),
                "{key} still in flight"
            );
        }

        // A caller that goes away mid-lookup: the next one takes over.
        let gone = tokio::time::timeout(Duration::from_millis(10), plans.plan_of("c")).await;
        assert!(gone.is_err());
        assert_eq!(plans.plan_of("c").await.as_deref(), Some("c-plan"));
        assert_eq!(r.0.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_and_lookups_in_flight_are_bounded() {
        let r = Arc::new(Slow(AtomicUsize::new(0)));
        let plans = Arc::new(Plans::new(
            HashMap::new(),
            Some(r.clone()),
            known((0..200).map(|i| format!("k{i}-plan"))),
            Duration::from_secs(5),
            8,
        ));
        // 200 keys in flight at once, each with a waiter.
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..200 {
            let plans = Arc::clone(&plans);
            tasks.spawn(async move { (i, plans.plan_of(&format!("k{i}")).await) });
        }
        // Every lookup is under way (the resolver answers after 100 ms).
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(r.0.load(Ordering::SeqCst), 200);
        assert!(plans.cache.len() <= 8, "{}", plans.cache.len());
        while let Some(done) = tasks.join_next().await {
            let (i, plan) = done.unwrap();
            assert_eq!(plan.as_deref(), Some(format!("k{i}-plan").as_str()));
        }
        assert!(plans.cache.len() <= 8, "{}", plans.cache.len());
        assert_eq!(r.0.load(Ordering::SeqCst), 200);
    }

    /// An error is not "no plan": base numbers now, asked again after
    /// `RETRY_AFTER` rather than after the TTL; an `async fn` is a resolver.
    #[tokio::test(start_paused = true)]
    async fn an_error_is_retried_soon_and_an_async_fn_resolves() {
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        async fn flaky(key: String) -> Result<Option<String>, PlanError> {
            match CALLS.fetch_add(1, Ordering::SeqCst) {
                0 => Err("connection refused".into()),
                _ => Ok(Some(format!("{key}-pro"))),
            }
        }
        let plans = Plans::new(
            HashMap::new(),
            Some(Arc::new(flaky)),
            known(["k-pro".to_owned()]),
            Duration::from_secs(60),
            100,
        );
        assert_eq!(plans.plan_of("k").await, None, "the error: base numbers");
        assert_eq!(plans.plan_of("k").await, None, "cached for a moment");
        assert_eq!(CALLS.load(Ordering::SeqCst), 1);
        tokio::time::advance(RETRY_AFTER + Duration::from_millis(1)).await;
        assert_eq!(plans.plan_of("k").await.as_deref(), Some("k-pro"));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(
            plans.plan_of("k").await.as_deref(),
            Some("k-pro"),
            "an answer holds for the TTL"
        );
        assert_eq!(CALLS.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_plan_the_configuration_does_not_define_is_the_base_numbers() {
        let r = Arc::new(Slow(AtomicUsize::new(0)));
        let plans = Plans::new(
            HashMap::new(),
            Some(r.clone()),
            known(["good-plan".to_owned()]),
            Duration::from_secs(5),
            100,
        );
        assert_eq!(plans.plan_of("good").await.as_deref(), Some("good-plan"));
        assert_eq!(plans.plan_of("bad").await, None);
        assert_eq!(plans.plan_of("bad").await, None, "cached");
        assert_eq!(r.0.load(Ordering::SeqCst), 2);
    }

    // The removed `PlanError` example: `?` turns a row's parse error into
    // a `PlanError` that keeps its message.
    #[test]
    fn a_parse_error_becomes_a_plan_error_by_question_mark() {
        fn parse(row: &str) -> Result<Option<String>, PlanError> {
            let tier: u8 = row.parse()?;
            Ok((tier > 0).then(|| "pro".to_owned()))
        }
        assert_eq!(parse("1").unwrap().as_deref(), Some("pro"));
        assert_eq!(parse("0").unwrap(), None);
        assert!(
            parse("x")
                .unwrap_err()
                .to_string()
                .contains("invalid digit")
        );
    }
}
