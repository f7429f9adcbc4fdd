//! Configuration: one model, which a TOML file deserialises into and code
//! builds ([`ConfigBuilder`] and its parts: [`LimitConfig`],
//! [`RouteConfig`], `BreakerConfig`, `RegionsConfig`, the smaller
//! tables in `sections.rs`); [`ConfigBuilder::build`] checks it
//! (`validate/`) and compiles it once into the runtime's [`Config`]. An
//! error found after the file was read is placed in it by the setting's
//! path (`place.rs`).
//!
//! The schema is documented on [`Config`].

mod build;
mod builder;
pub(crate) mod de;
mod descriptors;
mod error;
mod limit;
mod numbers;
#[cfg(feature = "tls")]
pub(crate) mod pem;
mod place;
mod redis;
pub(crate) mod redis_url;
mod regions;
mod route;
mod sections;
mod units;
mod validate;

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::Method;

pub use builder::ConfigBuilder;
#[cfg_attr(not(feature = "rls"), allow(unused_imports))]
pub(crate) use descriptors::{DescriptorRule, EntryIs};
pub use error::ConfigError;
pub use limit::LimitConfig;
pub(crate) use redis::RedisSettings;
pub use redis_url::redact_url;
pub(crate) use regions::Regions;
pub use route::RouteConfig;
pub(crate) use sections::BreakerConfig;
pub use units::Rate;
// The command's arguments and output read and write durations as the file does.
#[cfg(any(test, feature = "cli"))]
pub(crate) use units::{format_duration, parse_duration};
// Defined with the routes they govern; named here too, where they always were.
pub use crate::route::FailurePolicy;

use crate::algorithm::fmt_duration;
use crate::key::{ClientIpRules, SecretOrigin};
use crate::route::{Limit, Policy, RouteEntry};

/// A value kept out of `Debug` output (secrets, callers' API keys): `Debug`
/// says only that it is there.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Hidden<T>(pub(crate) T);

impl<T> fmt::Debug for Hidden<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<hidden>")
    }
}

/// A validated configuration, ready for [`RateLimitLayer`](crate::RateLimitLayer):
/// from a TOML file ([`from_toml_file`](Self::from_toml_file)) or from code
/// ([`Config::builder`]).
///
/// ```
/// use fleetlimit::Config;
///
/// let cfg = Config::from_toml_str(r#"
///     [limits.per-ip]
///     key = "ip"
///     capacity = 10
///     refill = "1/s"
///
///     [default]
///     limits = ["per-ip"]
/// "#)?;
/// assert_eq!(cfg.redis_url(), None); // no [redis] section: in-process buckets
/// println!("{}", cfg.describe());
/// # Ok::<(), fleetlimit::ConfigError>(())
/// ```
///
/// # The TOML schema
///
/// ```toml
/// [redis]                       # no [redis] section: the in-process store
/// url = "redis://127.0.0.1:6379"
/// pool_size = 4
/// deadline = "5ms"              # per check, NOSCRIPT recovery included
/// key_prefix = "rl"
///
/// [fleet]
/// size = 2                      # N for the `local` fallback (limit ÷ N)
///
/// [client_ip]
/// trusted_proxies = ["10.0.0.0/8"]
/// forwarded_header = "x-forwarded-for"   # or "forwarded"
/// ipv6_prefix = 64
///
/// [limits.per-key]              # a token bucket (the default algorithm)
/// key = "header:x-api-key"
/// on_missing = "ip"             # or "reject" (401)
/// capacity = 5                  # burst
/// refill = "1/s"
///
/// [limits.api]                  # a window: "fixed-window" or "sliding-window"
/// key = "header:x-api-key"
/// algorithm = "fixed-window"
/// limit = 100
/// window = "60s"
/// mode = "shadow"               # count and log, never refuse
///
/// [plans.pro.api]               # callers on plan "pro" get these numbers
/// limit = 500
///
/// [plan_assignments]            # key → plan (or bring a PlanResolver)
/// "key-of-a-pro-customer" = "pro"
///
/// [[routes]]
/// path = "/search"              # axum route template (MatchedPath)
/// methods = ["GET"]             # optional; all methods when absent
/// limits = ["per-key", "api"]   # decided together: all charged or none
/// cost = 2
/// on_redis_error = "local"      # "open" | "closed" | "local"
/// priority = "critical"         # with [shedding]: "critical" | "normal" | "sheddable"
///
/// [default]                     # routes not listed; absent = not limited
/// limits = ["per-key"]
/// on_redis_error = "open"
///
/// [limits.failed-sign-ins]      # login defence (docs/algorithms.md)
/// key = "account:x-account"
/// count = "failures"            # only answers in failure_statuses count
/// failure_statuses = [401, 403]
/// on_exceed = "challenge"       # or "refuse" (429), or "delay" + delay = "2s"
/// capacity = 10
/// refill = "10/h"
///
/// [escalation]
/// max_delayed = 100             # requests held by `delay` at once per instance
/// [headers]
/// style = "both"                # "legacy" (X-RateLimit-*, default), "ietf" or "both"
/// [shedding]                    # load shedding; absent = off
/// max_in_flight = 200           # this instance's requests in flight at pressure 1.0
/// queue_delay_target = "5ms"    # CoDel: overloaded while the shortest wait
/// queue_delay_interval = "100ms"#   over an interval stays above target
/// fleet_signal_refresh = "1s"   # how often <key_prefix>:shed:{fleet} is read
/// retry_after = "1s"
/// sheddable_at = 0.8            # priority = "sheddable" shed from this pressure
/// critical_at = 1.5             # priority = "critical" shed from this one ("normal": 1.0)
/// [regions]                     # global limits across regions; absent = one region
/// this = "eu"                   # or this_env = "FLEETLIMIT_REGION"
/// interval = "2s"               # how often quotas move (100ms to 60s)
/// [regions.exchange]            # every region (two or more) and its Redis URL
/// eu = "redis://10.0.0.1:6379"
/// us = "redis://10.1.0.1:6379"
///                               # and on a token bucket: scope = "global",
///                               #   split = { eu = 0.6, us = 0.4 } (default: equal)
/// ```
///
/// Unknown fields, unknown limit or plan names, malformed rates or
/// durations, zero capacities, costs larger than a limit's capacity and
/// numbers beyond what both stores carry exactly (capacities above 2^53,
/// refills above 10^6/s, buckets taking over 10 years to fill, windows that
/// are not whole milliseconds) are all errors at start-up, reported as
/// `file:line:column: message`.
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) redis: Option<RedisSettings>,
    /// `[regions]`: this instance's region and the others (`region/`).
    pub(crate) regions: Option<Regions>,
    pub(crate) deadline: Duration,
    pub(crate) key_prefix: Arc<str>,
    /// What API keys are hashed with in Redis key names.
    pub(crate) key_secret: crate::key::KeySecret,
    pub(crate) closed_retry_after: Duration,
    pub(crate) fleet_size: u32,
    pub(crate) memory_max_keys: usize,
    pub(crate) client_ip: ClientIpRules,
    pub(crate) limits: Vec<Arc<Limit>>,
    pub(crate) routes: Vec<RouteEntry>,
    pub(crate) default_route: Option<Arc<Policy>>,
    /// `[[descriptors]]`: what `fleetlimit rls` charges Envoy's descriptors to.
    pub(crate) descriptors: Vec<Arc<DescriptorRule>>,
    /// Keyed by callers' key values (API keys among them): never printed.
    pub(crate) plan_assignments: Hidden<HashMap<String, Arc<str>>>,
    pub(crate) plan_cache_ttl: Duration,
    pub(crate) plan_cache_keys: usize,
    pub(crate) breaker: BreakerConfig,
    pub(crate) heartbeat: Option<Heartbeat>,
    /// Most keys the refused-key cache holds (0: off).
    pub(crate) refused_cache_keys: usize,
    /// Most requests held by `on_exceed = "delay"` at once per instance.
    pub(crate) max_delayed: usize,
    /// Load shedding (`[shedding]`; `None`: off).
    pub(crate) shedding: Option<crate::shed::SheddingConfig>,
    pub(crate) header_style: crate::headers::HeaderStyle,
    /// The `WWW-Authenticate` challenge of a missing key's 401.
    pub(crate) www_authenticate: http::HeaderValue,
    /// The file it was read from, for errors found when a layer is built.
    pub(crate) file: Option<std::path::PathBuf>,
    /// Limit name → where its `custom:<name>` key was written (line,
    /// column), for the error of a layer built without that extractor.
    pub(crate) custom_key_at: HashMap<Arc<str>, Option<(usize, usize)>>,
}

/// Fleet discovery: each instance heartbeats into Redis and counts the live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Heartbeat {
    /// How often each instance heartbeats and re-reads the count.
    pub(crate) every: Duration,
    /// An instance silent this long is dead.
    pub(crate) dead_after: Duration,
}

const DEFAULT_DEADLINE: Duration = Duration::from_millis(5);
const DEFAULT_MEMORY_KEYS: usize = 100_000;
const DEFAULT_PLAN_CACHE_TTL: Duration = Duration::from_secs(5);
const DEFAULT_PLAN_CACHE_KEYS: usize = 10_000;
const DEFAULT_REFUSED_CACHE_KEYS: usize = 10_000;
const DEFAULT_MAX_DELAYED: usize = 100;

impl Config {
    /// Parses and validates a TOML configuration.
    pub fn from_toml_str(source: &str) -> Result<Self, ConfigError> {
        let mut model: ConfigBuilder = toml::from_str(source)
            .map_err(|e| ConfigError::at(source, e.span(), error::toml_message(e.message())))?;
        model.src = Hidden(source.to_owned());
        model.build()
    }

    /// Reads, parses and validates a TOML configuration file; errors name
    /// the file, line and column.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let source = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(format!("cannot read the configuration: {e}")).in_file(path)
        })?;
        let mut cfg = Self::from_toml_str(&source).map_err(|e| e.in_file(path))?;
        cfg.file = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// Whether no request is limited: no `[[routes]]` entry, no `[default]`
    /// and no `[[descriptors]]` entry names a limit (an empty or truncated file, say).
    /// `fleetlimit check-config` warns about it, and a reload to it is
    /// refused unless forced ([`ReloadHandle::force`](crate::reload::ReloadHandle::force)).
    ///
    /// ```
    /// use fleetlimit::Config;
    ///
    /// assert!(Config::from_toml_str("")?.limits_nothing());
    /// let cfg = Config::from_toml_str(
    ///     "[limits.ip]\nkey = \"ip\"\ncapacity = 5\nrefill = \"1/s\"\n\n[default]\nlimits = [\"ip\"]\n",
    /// )?;
    /// assert!(!cfg.limits_nothing());
    /// # Ok::<(), fleetlimit::ConfigError>(())
    /// ```
    #[must_use]
    pub fn limits_nothing(&self) -> bool {
        self.routes.iter().all(|r| r.policy.limits.is_empty())
            && self
                .default_route
                .as_ref()
                .is_none_or(|p| p.limits.is_empty())
            && self.descriptors.iter().all(|d| d.policy.limits.is_empty())
    }

    /// Whether some limit is keyed by custom key `name`.
    pub(crate) fn uses_custom_key(&self, name: &str) -> bool {
        self.limits
            .iter()
            .any(|l| matches!(&l.key, crate::key::KeySource::Custom(n) if n == name))
    }

    /// The Redis key of the fleet's heartbeat (instances counting each
    /// other). No limit's key can be it: theirs end in a tagged key value.
    pub(crate) fn heartbeat_key(&self) -> String {
        format!("{}:fleet:{{instances}}", self.key_prefix)
    }

    /// The Redis key of the fleet-wide shedding signal, which an operator
    /// sets (`SET <prefix>:shed:{fleet} 1.2 EX 600`). No limit's key can be
    /// it: theirs end in a tagged key value.
    pub(crate) fn shed_fleet_key(&self) -> String {
        format!("{}:shed:{{fleet}}", self.key_prefix)
    }

    /// A configuration built in code.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// A new configuration: this one on Redis at `url` (from `REDIS_URL`
    /// or a command line, say), keeping the other Redis settings, checked
    /// as [`build`](ConfigBuilder::build) checks a `[redis]` section
    /// (scheme, TLS support and files, host and port). A `Config` is never
    /// changed in place: what it holds was checked when it was built.
    ///
    /// ```
    /// use fleetlimit::Config;
    ///
    /// let cfg = Config::builder().build()?;
    /// if cfg!(feature = "redis") {
    ///     let on_redis = cfg.clone().try_with_redis_url("redis://127.0.0.1:6379")?;
    ///     assert_eq!(on_redis.redis_url(), Some("redis://127.0.0.1:6379"));
    /// }
    /// let err = cfg.try_with_redis_url("notaurl://x").unwrap_err();
    /// assert!(err.message().starts_with("unsupported Redis URL scheme"), "{err}");
    /// # Ok::<(), fleetlimit::ConfigError>(())
    /// ```
    pub fn try_with_redis_url(self, url: impl Into<String>) -> Result<Self, ConfigError> {
        let mut redis = self.redis.clone().unwrap_or_default();
        redis.url = url.into();
        validate::Validator::new("").redis(&redis)?;
        Ok(Self {
            redis: Some(redis),
            ..self
        })
    }

    /// A new configuration: this one on the in-process store. Nothing is
    /// left to check: every check of the Redis settings reads only them.
    #[must_use]
    pub fn without_redis(mut self) -> Self {
        self.redis = None;
        self
    }

    /// The Redis URL, if the configuration uses Redis. It may carry a
    /// password: show [`redact_url`] of it instead.
    #[must_use]
    pub fn redis_url(&self) -> Option<&str> {
        self.redis.as_ref().map(|r| r.url.as_str())
    }

    /// The per-check deadline.
    #[must_use]
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Which rate-limit fields responses carry.
    #[must_use]
    pub fn header_style(&self) -> crate::headers::HeaderStyle {
        self.header_style
    }

    /// The `WWW-Authenticate` challenge of a missing key's `401`.
    #[must_use]
    pub fn www_authenticate(&self) -> &str {
        self.www_authenticate.to_str().unwrap_or("")
    }

    /// The prefix of every Redis key.
    #[must_use]
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// The effective policy table, one line per limit and route, for humans.
    #[must_use]
    pub fn describe(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let store = match &self.redis {
            Some(r) => {
                let mut tls = String::new();
                if let Some(f) = &r.tls_ca_file {
                    tls.push_str(&format!("; TLS CA file {}", f.display()));
                }
                if let Some(f) = &r.tls_client_cert {
                    tls.push_str(&format!("; TLS client certificate {}", f.display()));
                }
                format!(
                    "redis {} (pool {}, deadline {}{tls})",
                    redact_url(&r.url),
                    r.pool_size,
                    fmt_duration(self.deadline)
                )
            }
            None => "in-process memory".to_owned(),
        };
        let _ = writeln!(
            out,
            "store: {store}; key prefix {:?}; fleet size {}",
            self.key_prefix, self.fleet_size
        );
        for l in &self.limits {
            let _ = writeln!(out, "limit {}", l.describe());
        }
        if let Some(r) = &self.regions {
            let _ = writeln!(out, "{}", r.describe());
            let global: Vec<String> = (self.limits.iter())
                .filter_map(|l| Some(format!("{} ({})", l.name, r.shares(l.global.as_ref()?))))
                .collect();
            if !global.is_empty() {
                let _ = writeln!(out, "global limits: {}", global.join(", "));
            }
        }
        for r in &self.routes {
            let methods = r.methods.as_ref().map_or_else(
                || "*".to_owned(),
                |m| m.iter().map(Method::as_str).collect::<Vec<_>>().join(","),
            );
            let _ = writeln!(out, "route {methods} {}: {}", r.path, r.policy.describe());
        }
        for d in &self.descriptors {
            let _ = writeln!(out, "descriptor {}: {}", d.describe(), d.policy.describe());
        }
        match &self.default_route {
            Some(p) => {
                let _ = writeln!(out, "default: {}", p.describe());
            }
            None => out.push_str("default: not limited\n"),
        }
        let secret = match self.key_secret.origin() {
            SecretOrigin::Env(name) => format!("the secret in ${name}"),
            SecretOrigin::Code => "the secret set in code".to_owned(),
            SecretOrigin::Default => {
                "the built-in secret of the prefix (not secret: set [keys] secret_env)".to_owned()
            }
        };
        if let Some(s) = &self.shedding {
            let _ = writeln!(
                out,
                "shedding: max_in_flight {:?}, queue delay {} over {}, sheddable from {}, critical from {}, \
                 fleet signal every {}",
                s.max_in_flight,
                fmt_duration(s.queue_delay_target),
                fmt_duration(s.queue_delay_interval),
                s.sheddable_at,
                s.critical_at,
                fmt_duration(s.fleet_signal_refresh)
            );
        }
        let _ = writeln!(
            out,
            "keys: header values (API keys) stored as keyed digests (SipHash-2-4) with {secret}"
        );
        out
    }
}

#[cfg(test)]
mod tests;
