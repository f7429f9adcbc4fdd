//! The parts of a [`ConfigBuilder`](super::ConfigBuilder): limits and route
//! policies, with where the TOML wrote them (nothing for code).

use std::time::Duration;

use http::Method;

use super::regions::{GlobalSpans, Split};
use super::validate::{exact_count, LoginSpans, RouteSettings, RuleSpans, Span};
use super::Rate;
use crate::algorithm::Rule;
use crate::key::KeySource;
use crate::route::RecordConfig;
use crate::route::{FailurePolicy, OnExceed, OnMissing};
use crate::shed::Priority;

/// A limit for [`ConfigBuilder::limit`](super::ConfigBuilder::limit).
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::{Account, KeySource, LimitConfig, OnMissing, Rate};
///
/// // 100 requests a minute per API key; a request without one counts by IP.
/// let api = LimitConfig::fixed_window(KeySource::header("x-api-key"), 100, Duration::from_secs(60))
///     .on_missing(OnMissing::Ip)
///     .plan("pro", LimitConfig::fixed_window(KeySource::header("x-api-key"), 1_000, Duration::from_secs(60)));
/// // A burst of 5 sign-in attempts per account and address, one more every 12 s.
/// let sign_in = LimitConfig::token_bucket(KeySource::IpAndAccount(None), 5, Rate::per_minute(5));
/// # let _ = (api, sign_in, Account::new("bob"));
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct LimitConfig {
    pub(super) key: KeySource,
    pub(super) on_missing: OnMissing,
    pub(super) rule: Rule,
    pub(super) shadow: bool,
    /// `(lease_batch, lease_above)`.
    pub(super) lease: Option<(u32, u32)>,
    pub(super) plans: Vec<PlanRule>,
    pub(super) at: LimitSpans,
    /// Failure-only counting: the statuses that count (`None`: all do).
    pub(super) failures: Option<Vec<u16>>,
    pub(super) on_exceed: OnExceed,
    /// Its decisions are recorded in Redis.
    pub(super) record: Option<RecordConfig>,
    /// `scope = "global"`: how its shares start (`None`: decided in each
    /// region against the whole limit).
    pub(super) global: Option<Split>,
}

/// A limit's numbers for callers on one plan.
#[derive(Clone, Debug)]
pub(super) struct PlanRule {
    pub(super) plan: String,
    pub(super) rule: Rule,
    pub(super) at: PlanSpans,
}

/// Where a limit's settings were written.
#[derive(Clone, Debug, Default)]
pub(super) struct LimitSpans {
    pub(super) name: Span,
    pub(super) rule: RuleSpans,
    pub(super) lease: Span,
    pub(super) login: LoginSpans,
    /// `record`'s `max_len` and `max_age` (else `record`), from TOML.
    pub(super) record: [Span; 2],
    /// `scope` and `split`.
    pub(super) global: GlobalSpans,
}

/// The statuses `count = "failures"` counts when `failure_statuses` is
/// not given: a refused sign-in.
pub(super) const DEFAULT_FAILURE_STATUSES: [u16; 2] = [401, 403];

/// Where a `[plans.<plan>.<limit>]` table was written.
#[derive(Clone, Debug, Default)]
pub(super) struct PlanSpans {
    pub(super) plan: Span,
    pub(super) limit: Span,
    pub(super) rule: RuleSpans,
}

impl LimitConfig {
    /// A token bucket of `capacity` (burst) refilled at `refill`.
    pub fn token_bucket(key: KeySource, capacity: u64, refill: Rate) -> Self {
        Self::new(
            key,
            Rule::TokenBucket {
                capacity: exact_count(capacity),
                refill_per_sec: refill.tokens_per_second(),
            },
        )
    }

    /// At most `limit` per `window`, the window opening with a key's first
    /// request.
    pub fn fixed_window(key: KeySource, limit: u64, window: Duration) -> Self {
        Self::new(
            key,
            Rule::FixedWindow {
                limit: exact_count(limit),
                window,
            },
        )
    }

    /// About `limit` per sliding `window`.
    pub fn sliding_window(key: KeySource, limit: u64, window: Duration) -> Self {
        Self::new(
            key,
            Rule::SlidingWindow {
                limit: exact_count(limit),
                window,
            },
        )
    }

    /// At most `max_in_flight` requests of a key in flight at once, over
    /// the fleet; each slot counts until the response is over, or for
    /// `max_hold` at most (`algorithm = "concurrency"` in TOML).
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetlimit::{Config, KeySource, LimitConfig, RouteConfig};
    ///
    /// // At most 5 requests of one client address in flight at once.
    /// let in_flight = LimitConfig::concurrency(KeySource::ClientIp, 5, Duration::from_secs(30));
    /// let config = Config::builder()
    ///     .limit("in-flight", in_flight)
    ///     .default_route(RouteConfig::new(["in-flight"]))
    ///     .build();
    /// assert!(config.is_ok());
    /// ```
    pub fn concurrency(key: KeySource, max_in_flight: u64, max_hold: Duration) -> Self {
        Self::new(
            key,
            Rule::Concurrency {
                max_in_flight: exact_count(max_in_flight),
                max_hold,
            },
        )
    }

    pub(super) fn new(key: KeySource, rule: Rule) -> Self {
        Self {
            key,
            on_missing: OnMissing::Reject,
            rule,
            shadow: false,
            lease: None,
            plans: Vec::new(),
            at: LimitSpans::default(),
            failures: None,
            on_exceed: OnExceed::Refuse,
            record: None,
            global: None,
        }
    }

    /// What to do when a request lacks the key.
    pub fn on_missing(mut self, on_missing: OnMissing) -> Self {
        self.on_missing = on_missing;
        self
    }

    /// Shadow mode: count and log, never refuse.
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// Hot-key leases (token buckets only): `batch` tokens (2 to the
    /// capacity) per lease, for keys above `above` requests a second on one
    /// instance (`lease_batch` and `lease_above` in TOML; 50 there when unset).
    pub fn lease(mut self, batch: u32, above: u32) -> Self {
        self.lease = Some((batch, above));
        self
    }

    /// Count only requests whose response has one of these statuses (e.g.
    /// `[401, 403]`, failed sign-ins); `count = "failures"` and
    /// `failure_statuses` in TOML. A request is charged up front like any
    /// other, and its unit given back in one atomic call when the handler
    /// answers another status.
    pub fn count_failures(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.failures = Some(statuses.into_iter().collect());
        self
    }

    /// What exceeding the limit does (default [`OnExceed::Refuse`]).
    pub fn on_exceed(mut self, on_exceed: OnExceed) -> Self {
        self.on_exceed = on_exceed;
        self
    }

    /// Record each decision about this limit in a Redis stream, for
    /// `fleetlimit explain` (`record = true` or `[limits.<name>.record]` in
    /// TOML). Off by default; with the in-process store nothing is recorded.
    pub fn record(mut self, record: RecordConfig) -> Self {
        self.record = Some(record);
        self
    }

    /// A global limit (`scope = "global"` in TOML): with
    /// [`ConfigBuilder::regions`](super::ConfigBuilder::regions), decided
    /// in each region by its own Redis against that region's share of the
    /// limit, the shares starting equal (each region 1/n of the capacity
    /// and of the refill) and moving toward the regions that use them.
    /// Token buckets only, without leases or plans.
    ///
    /// ```
    /// use fleetlimit::{Config, KeySource, LimitConfig, Rate, RegionsConfig};
    ///
    /// let per_key = LimitConfig::token_bucket(KeySource::header("x-api-key"), 100, Rate::per_second(10))
    ///     .global();
    /// // Without [regions], a global limit is an error.
    /// let err = Config::builder().limit("per-key", per_key).build().unwrap_err();
    /// assert!(err.message().contains("needs [regions]"), "{err}");
    /// ```
    pub fn global(mut self) -> Self {
        self.global = Some(Split::Equal);
        self
    }

    /// A [`global`](Self::global) limit whose shares start as `weights`
    /// say, by region (`split = { eu = 0.5, us = 0.3, ap = 0.2 }` in TOML):
    /// each a fraction of the limit, finite and not negative, together at
    /// most 1; a region not named starts with none of it.
    ///
    /// ```
    /// use fleetlimit::{Config, KeySource, LimitConfig, Rate, RegionsConfig, RouteConfig};
    ///
    /// let per_key = LimitConfig::token_bucket(KeySource::header("x-api-key"), 100, Rate::per_second(10))
    ///     .global_split([("eu", 0.7), ("us", 0.3)]);
    /// let regions = RegionsConfig::new("eu")
    ///     .region("eu", "redis://10.0.0.1:6379")
    ///     .region("us", "redis://10.1.0.1:6379");
    /// let cfg = Config::builder()
    ///     .redis_url("redis://10.0.0.1:6379")
    ///     .regions(regions)
    ///     .limit("per-key", per_key)
    ///     .default_route(RouteConfig::new(["per-key"]))
    ///     .build();
    /// # #[cfg(feature = "redis")]
    /// assert!(cfg?.describe().contains("global limits: per-key (eu 70%, us 30%)"));
    /// # Ok::<(), fleetlimit::ConfigError>(())
    /// ```
    pub fn global_split<I, S>(mut self, weights: I) -> Self
    where
        I: IntoIterator<Item = (S, f64)>,
        S: Into<String>,
    {
        let weights = weights.into_iter().map(|(r, w)| (r.into(), w)).collect();
        self.global = Some(Split::Weights(weights));
        self
    }

    /// Other numbers for callers on `plan`, with the same algorithm (the
    /// capacity of `numbers` and, for windows, its window).
    pub fn plan(mut self, plan: impl Into<String>, numbers: LimitConfig) -> Self {
        self.plans.push(PlanRule {
            plan: plan.into(),
            rule: numbers.rule,
            at: PlanSpans::default(),
        });
        self
    }
}

/// A route policy for [`ConfigBuilder::route`](super::ConfigBuilder::route).
///
/// ```
/// use http::Method;
/// use fleetlimit::{FailurePolicy, RouteConfig};
///
/// // POST /upload counts 10 units against both limits, all or nothing, and
/// // answers 503 when Redis cannot decide.
/// let upload = RouteConfig::new(["per-key", "per-ip"])
///     .methods([Method::POST])
///     .cost(10)
///     .on_redis_error(FailurePolicy::Closed);
/// # let _ = upload;
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct RouteConfig {
    pub(super) limits: Vec<String>,
    pub(super) methods: Option<Vec<Method>>,
    pub(super) cost: u32,
    pub(super) on_redis_error: FailurePolicy,
    pub(super) shadow: bool,
    pub(super) refund: bool,
    pub(super) at: RouteSpans,
    /// When its requests are shed (`[shedding]`).
    pub(super) priority: Priority,
}

/// Where a route's settings were written.
#[derive(Clone, Debug, Default)]
pub(super) struct RouteSpans {
    pub(super) path: Span,
    /// One per limit name, in order.
    pub(super) limits: Vec<Span>,
    pub(super) cost: Span,
}

impl RouteConfig {
    /// The limits (by name) every request of the route is counted against.
    pub fn new<I, S>(limits: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            limits: limits.into_iter().map(Into::into).collect(),
            methods: None,
            cost: 1,
            on_redis_error: FailurePolicy::Open,
            shadow: false,
            refund: false,
            at: RouteSpans::default(),
            priority: Priority::Normal,
        }
    }

    pub(super) fn settings(&self) -> RouteSettings {
        RouteSettings {
            cost: self.cost,
            cost_span: self.at.cost.clone(),
            on_redis_error: self.on_redis_error,
            shadow: self.shadow,
            refund: self.refund,
            priority: self.priority,
        }
    }

    /// The limit names, each with where it was written.
    pub(super) fn named_limits(&self) -> impl Iterator<Item = (&str, Span)> {
        let spans = self
            .at
            .limits
            .iter()
            .cloned()
            .chain(std::iter::repeat(None));
        self.limits.iter().map(String::as_str).zip(spans)
    }

    /// Units each request takes (default 1).
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = cost;
        self
    }

    /// Only these methods (default: all).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = Some(methods.into_iter().collect());
        self
    }

    /// What to do when Redis fails (default `open`).
    pub fn on_redis_error(mut self, policy: FailurePolicy) -> Self {
        self.on_redis_error = policy;
        self
    }

    /// Shadow mode for the whole route: count and log, never refuse.
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// Admitted requests carry a [`Refund`](crate::Refund) handle in their
    /// extensions, so the handler can give back units it did not need
    /// (`refund = true` in TOML). Off by default: the handle costs every
    /// request an allocation and an extension insert.
    pub fn refund(mut self) -> Self {
        self.refund = true;
        self
    }

    /// How early the route's requests are shed when the backend is
    /// saturated (`priority` in TOML; default [`Priority::Normal`]; only
    /// with [`ConfigBuilder::shedding`](super::ConfigBuilder::shedding)).
    /// A route with no limits and a priority is still shed.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }
}

/// Breaker settings: when the circuit breaker in front of Redis opens, and
/// for how long.
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::{BreakerConfig, Config};
///
/// let cfg = Config::builder()
///     .breaker(BreakerConfig { cool_off: Duration::from_secs(1), ..BreakerConfig::default() })
///     .build()?;
/// # let _ = cfg;
/// # Ok::<(), fleetlimit::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Failed checks, with no success in between, that open it: definite
    /// errors in a row open it at once; timeouts also need `window`.
    pub failures: u32,
    /// How long checks must keep failing, with no success, before it opens
    /// (well above the deadline: one late moment is not an outage).
    pub window: Duration,
    /// How long it stays open before probing.
    pub cool_off: Duration,
    /// Probe calls allowed at once while half-open.
    pub probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: 3,
            window: Duration::from_millis(100),
            cool_off: Duration::from_millis(500),
            probes: 1,
        }
    }
}
