//! A limit, as the file writes it and as code builds it: `[limits.<name>]`
//! deserialises into [`LimitConfig`], whose methods set the same fields.
//! `validate/limit.rs` checks it and compiles it into the runtime's
//! `route::Limit`.
//!
//! A new per-limit option is a field here (with its serde attribute and
//! its method), its check and compilation in `validate/limit.rs`, and its
//! line in the schema on [`Config`](super::Config) (`mod.rs`).

use std::time::Duration;

use serde::Deserialize;

use super::Rate;
use super::de::{self, Amount};
use super::numbers::{Algorithm, Numbers};
use crate::key::KeySource;
use crate::route::RecordConfig;
use crate::route::{OnExceed, OnMissing};

/// A limit for [`ConfigBuilder::limit`](super::ConfigBuilder::limit).
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::Account;
/// use fleetlimit::configuration::{KeySource, LimitConfig, Rate};
///
/// // 100 requests a minute per API key; a request without one counts by IP.
/// let api = LimitConfig::fixed_window(KeySource::header("x-api-key"), 100, Duration::from_secs(60))
///     .missing_by_ip()
///     .plan("pro", LimitConfig::fixed_window(KeySource::header("x-api-key"), 1_000, Duration::from_secs(60)));
/// // A burst of 5 sign-in attempts per account and address, one more every 12 s.
/// let sign_in = LimitConfig::token_bucket(KeySource::IpAndAccount(None), 5, Rate::per_minute(5));
/// # let _ = (api, sign_in, Account::new("bob"));
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[must_use]
pub struct LimitConfig {
    #[serde(deserialize_with = "de::text")]
    pub(super) key: KeySource,
    #[serde(default)]
    pub(super) on_missing: OnMissing,
    #[serde(default)]
    pub(super) algorithm: Algorithm,
    pub(super) capacity: Option<Amount>,
    #[serde(default, deserialize_with = "de::some_text")]
    pub(super) refill: Option<Rate>,
    pub(super) limit: Option<Amount>,
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) window: Option<Duration>,
    #[serde(default)]
    pub(super) mode: Mode,
    pub(super) lease_batch: Option<u32>,
    /// Requests a second on one instance above which a key is leased
    /// (50 when unset).
    pub(super) lease_above: Option<u32>,
    #[serde(default)]
    pub(super) count: Count,
    /// The statuses that count when `count = "failures"` (`None`: 401 and 403).
    #[serde(default, deserialize_with = "de::statuses")]
    pub(super) failure_statuses: Option<Vec<u16>>,
    pub(super) on_exceed: Option<Exceed>,
    /// How long `on_exceed = "delay"` holds a request.
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) delay: Option<Duration>,
    /// `algorithm = "concurrency"`: slots per key, and the longest a slot
    /// counts (60 s when unset).
    pub(super) max_in_flight: Option<Amount>,
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) max_hold: Option<Duration>,
    /// Its decisions are recorded in Redis (`record = true` or a table).
    #[serde(default, deserialize_with = "de::record")]
    pub(super) record: Option<RecordConfig>,
    /// `"region"` (the default) or `"global"` (`[regions]`).
    #[serde(default)]
    pub(super) scope: Scope,
    /// A global limit's share per region, as weights (`None`: equal).
    #[serde(default, deserialize_with = "de::some_pairs")]
    pub(super) split: Option<Vec<(String, f64)>>,
    /// Other numbers by plan, from code (a file's are under `[plans]`).
    #[serde(skip)]
    pub(super) plans: Vec<(String, Numbers)>,
}

/// A limit's (or a route's) `mode`.
#[derive(Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Mode {
    #[default]
    Enforce,
    /// Count and log, never refuse.
    Shadow,
}

/// `count`: what a limit counts.
#[derive(Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Count {
    #[default]
    Requests,
    Failures,
}

/// `on_exceed`, as written (`delay` takes its duration from `delay`).
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Exceed {
    Refuse,
    Delay,
    Challenge,
}

/// A limit's `scope`.
#[derive(Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Scope {
    /// Decided by this region's Redis against the whole limit (as ever).
    #[default]
    Region,
    /// Decided in each region against its share (`[regions]`).
    Global,
}

impl LimitConfig {
    /// A token bucket of `capacity` (burst) refilled at `refill`.
    pub fn token_bucket(key: KeySource, capacity: u64, refill: Rate) -> Self {
        Self {
            capacity: Some(Amount(capacity)),
            refill: Some(refill),
            ..Self::new(key, Algorithm::TokenBucket)
        }
    }

    /// At most `limit` per `window`, the window opening with a key's first
    /// request.
    pub fn fixed_window(key: KeySource, limit: u64, window: Duration) -> Self {
        Self {
            limit: Some(Amount(limit)),
            window: Some(window),
            ..Self::new(key, Algorithm::FixedWindow)
        }
    }

    /// About `limit` per sliding `window`.
    pub fn sliding_window(key: KeySource, limit: u64, window: Duration) -> Self {
        Self {
            limit: Some(Amount(limit)),
            window: Some(window),
            ..Self::new(key, Algorithm::SlidingWindow)
        }
    }

    /// At most `max_in_flight` requests of a key in flight at once, over
    /// the fleet; each slot counts until the response is over, or for
    /// `max_hold` at most (`algorithm = "concurrency"` in TOML).
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetlimit::Config;
    /// use fleetlimit::configuration::{KeySource, LimitConfig, RouteConfig};
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
        Self {
            max_in_flight: Some(Amount(max_in_flight)),
            max_hold: Some(max_hold),
            ..Self::new(key, Algorithm::Concurrency)
        }
    }

    /// A limit of `algorithm` with every option at its default and no
    /// numbers yet.
    fn new(key: KeySource, algorithm: Algorithm) -> Self {
        Self {
            key,
            on_missing: OnMissing::default(),
            algorithm,
            capacity: None,
            refill: None,
            limit: None,
            window: None,
            mode: Mode::default(),
            lease_batch: None,
            lease_above: None,
            count: Count::default(),
            failure_statuses: None,
            on_exceed: None,
            delay: None,
            max_in_flight: None,
            max_hold: None,
            record: None,
            scope: Scope::default(),
            split: None,
            plans: Vec::new(),
        }
    }

    /// A request without the key is counted by its client IP instead, in
    /// a bucket apart from every key value (`on_missing = "ip"` in TOML).
    /// Otherwise (`on_missing = "reject"`, the default) it is refused with
    /// `401 Unauthorized`.
    pub fn missing_by_ip(mut self) -> Self {
        self.on_missing = OnMissing::Ip;
        self
    }

    /// Shadow mode: count and log, never refuse.
    pub fn shadow(mut self) -> Self {
        self.mode = Mode::Shadow;
        self
    }

    /// Hot-key leases (token buckets only): `batch` tokens (2 to the
    /// capacity) per lease, for keys above `above` requests a second on one
    /// instance (`lease_batch` and `lease_above` in TOML; 50 there when unset).
    pub fn lease(mut self, batch: u32, above: u32) -> Self {
        self.lease_batch = Some(batch);
        self.lease_above = Some(above);
        self
    }

    /// Count only requests whose response has one of these statuses (e.g.
    /// `[401, 403]`, failed sign-ins); `count = "failures"` and
    /// `failure_statuses` in TOML. A request is charged up front like any
    /// other, and its unit given back in one atomic call when the handler
    /// answers another status.
    pub fn count_failures(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.count = Count::Failures;
        self.failure_statuses = Some(statuses.into_iter().collect());
        self
    }

    /// What exceeding the limit does (default [`OnExceed::Refuse`]).
    pub fn on_exceed(mut self, on_exceed: OnExceed) -> Self {
        (self.on_exceed, self.delay) = match on_exceed {
            OnExceed::Refuse => (Some(Exceed::Refuse), None),
            OnExceed::Delay(d) => (Some(Exceed::Delay), Some(d)),
            OnExceed::Challenge => (Some(Exceed::Challenge), None),
        };
        self
    }

    /// Record each decision about this limit in a Redis stream, for
    /// `fleetlimit explain` (`record = true` in TOML): the last 10 000
    /// decisions of the last hour, whichever is fewer, unless
    /// [`record_max_len`](Self::record_max_len) or
    /// [`record_max_age`](Self::record_max_age) say otherwise. Off by
    /// default; with the in-process store nothing is recorded.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetlimit::configuration::{KeySource, LimitConfig, Rate};
    ///
    /// // The last 50 000 decisions of the last 2 hours, whichever is fewer.
    /// let api = LimitConfig::token_bucket(KeySource::header("x-api-key"), 50, Rate::per_second(10))
    ///     .record_max_len(50_000)
    ///     .record_max_age(Duration::from_secs(7200));
    /// # let _ = api;
    /// ```
    pub fn record(mut self) -> Self {
        self.record.get_or_insert_with(RecordConfig::default);
        self
    }

    /// Records this limit's decisions (as [`record`](Self::record)),
    /// keeping at most about `n` of them (`[limits.<name>.record] max_len`
    /// in TOML; trimmed with `MAXLEN ~`: Redis may keep up to one stream
    /// node more).
    pub fn record_max_len(mut self, n: u64) -> Self {
        self.record
            .get_or_insert_with(RecordConfig::default)
            .max_len = n;
        self
    }

    /// Records this limit's decisions (as [`record`](Self::record)),
    /// trimming those older than `age`; the stream expires `age` after its
    /// last write (`[limits.<name>.record] max_age` in TOML).
    pub fn record_max_age(mut self, age: Duration) -> Self {
        self.record
            .get_or_insert_with(RecordConfig::default)
            .max_age = age;
        self
    }

    /// A global limit (`scope = "global"` in TOML): with
    /// [`ConfigBuilder::this_region`](super::ConfigBuilder::this_region), decided
    /// in each region by its own Redis against that region's share of the
    /// limit, the shares starting equal (each region 1/n of the capacity
    /// and of the refill) and moving toward the regions that use them.
    /// Token buckets only, without leases or plans.
    ///
    /// ```
    /// use fleetlimit::Config;
    /// use fleetlimit::configuration::{KeySource, LimitConfig, Rate};
    ///
    /// let per_key = LimitConfig::token_bucket(KeySource::header("x-api-key"), 100, Rate::per_second(10))
    ///     .global();
    /// // Without [regions], a global limit is an error.
    /// let err = Config::builder().limit("per-key", per_key).build().unwrap_err();
    /// assert!(err.message().contains("needs [regions]"), "{err}");
    /// ```
    pub fn global(mut self) -> Self {
        self.scope = Scope::Global;
        self.split = None;
        self
    }

    /// A [`global`](Self::global) limit whose shares start as `weights`
    /// say, by region (`split = { eu = 0.5, us = 0.3, ap = 0.2 }` in TOML):
    /// each a fraction of the limit, finite and not negative, together at
    /// most 1; a region not named starts with none of it.
    ///
    /// ```
    /// use fleetlimit::Config;
    /// use fleetlimit::configuration::{KeySource, LimitConfig, Rate, RouteConfig};
    ///
    /// let per_key = LimitConfig::token_bucket(KeySource::header("x-api-key"), 100, Rate::per_second(10))
    ///     .global_split([("eu", 0.7), ("us", 0.3)]);
    /// let cfg = Config::builder()
    ///     .redis_url("redis://10.0.0.1:6379")
    ///     .this_region("eu")
    ///     .region("eu", "redis://10.0.0.1:6379")
    ///     .region("us", "redis://10.1.0.1:6379")
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
        self.scope = Scope::Global;
        self.split = Some(weights);
        self
    }

    /// Other numbers for callers on `plan`, with the same algorithm (the
    /// capacity of `numbers` and, for windows, its window).
    pub fn plan(mut self, plan: impl Into<String>, numbers: LimitConfig) -> Self {
        self.plans.push((plan.into(), numbers.numbers()));
        self
    }
}

impl LimitConfig {
    /// Its numbers, as a plan's are written.
    pub(super) fn numbers(&self) -> Numbers {
        Numbers {
            algorithm: Some(self.algorithm),
            capacity: self.capacity,
            refill: self.refill,
            limit: self.limit,
            window: self.window,
            max_in_flight: self.max_in_flight,
            max_hold: self.max_hold,
        }
    }
}
