//! Configuration: the TOML schema, its validation, and a builder for code.
//!
//! ```toml
//! [redis]                       # no [redis] section: the in-process store
//! url = "redis://127.0.0.1:6379"
//! pool_size = 4
//! deadline = "5ms"              # per check, NOSCRIPT recovery included
//! key_prefix = "rl"
//!
//! [fleet]
//! size = 2                      # N for the `local` fallback (limit ÷ N)
//!
//! [client_ip]
//! trusted_proxies = ["10.0.0.0/8"]
//! forwarded_header = "x-forwarded-for"   # or "forwarded"
//! ipv6_prefix = 64
//!
//! [limits.per-key]
//! key = "header:x-api-key"
//! on_missing = "ip"             # or "reject" (401)
//! capacity = 5                  # burst
//! refill = "1/s"
//!
//! [[routes]]
//! path = "/search"              # axum route template (MatchedPath)
//! methods = ["GET"]             # optional; all methods when absent
//! limits = ["per-key"]
//! cost = 2
//! on_redis_error = "local"      # "open" | "closed" | "local"
//!
//! [default]                     # routes not listed; absent = not limited
//! limits = ["per-key"]
//! on_redis_error = "open"
//! ```
//!
//! Unknown fields, unknown limit names, malformed rates or durations, zero
//! capacities and costs larger than a limit's capacity are all errors at
//! start-up, reported as `file:line:column: message`.

mod error;
mod units;

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;

pub use error::ConfigError;
pub use units::{ParseUnitError, Rate};

use crate::key::{ClientIpRules, ForwardedHeader, KeySource};
use crate::policy::{Limit, Policy};
pub(crate) use units::fmt_duration;

/// What a route does when Redis cannot answer within the deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Serve the request unlimited (and log that it happened).
    Open,
    /// Answer `503 Service Unavailable` with `Retry-After`.
    Closed,
    /// Decide from in-process buckets sized limit ÷ fleet size.
    Local,
}

/// What a limit does when a request does not carry its key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMissing {
    /// Refuse the request with `401 Unauthorized` (the default).
    #[default]
    Reject,
    /// Count the request by its client IP instead, in a bucket apart from
    /// every header value.
    Ip,
}

/// Settings of the Redis store.
#[derive(Clone, Debug)]
pub struct RedisSettings {
    pub(crate) url: String,
    pub(crate) pool_size: usize,
    pub(crate) connect_timeout: Duration,
}

/// A validated configuration, ready for [`RateLimitLayer`](crate::RateLimitLayer).
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) redis: Option<RedisSettings>,
    pub(crate) deadline: Duration,
    pub(crate) key_prefix: Arc<str>,
    pub(crate) closed_retry_after: Duration,
    pub(crate) fleet_size: u32,
    pub(crate) memory_max_keys: usize,
    pub(crate) client_ip: ClientIpRules,
    pub(crate) limits: Vec<Arc<Limit>>,
    pub(crate) routes: Vec<RouteEntry>,
    pub(crate) default_route: Option<Arc<Policy>>,
}

/// One `[[routes]]` entry, resolved.
#[derive(Clone, Debug)]
pub(crate) struct RouteEntry {
    pub(crate) path: String,
    pub(crate) methods: Option<Vec<Method>>,
    pub(crate) policy: Arc<Policy>,
}

impl Config {
    /// Parses and validates a TOML configuration.
    pub fn from_toml_str(source: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig =
            toml::from_str(source).map_err(|e| ConfigError::at(source, e.span(), e.message()))?;
        raw.validate(source)
    }

    /// Reads, parses and validates a TOML configuration file; errors name
    /// the file, line and column.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let source = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(format!("cannot read the configuration: {e}")).in_file(path)
        })?;
        Self::from_toml_str(&source).map_err(|e| e.in_file(path))
    }

    /// A configuration built in code.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// The same configuration on Redis at `url` (for example from
    /// `REDIS_URL`), keeping the other Redis settings.
    #[must_use]
    pub fn with_redis_url(mut self, url: impl Into<String>) -> Self {
        let url = url.into();
        match &mut self.redis {
            Some(r) => r.url = url,
            None => {
                self.redis = Some(RedisSettings {
                    url,
                    ..RedisSettings::default()
                })
            }
        }
        self
    }

    /// The same configuration on the in-process store.
    #[must_use]
    pub fn without_redis(mut self) -> Self {
        self.redis = None;
        self
    }

    /// The Redis URL, if the configuration uses Redis.
    #[must_use]
    pub fn redis_url(&self) -> Option<&str> {
        self.redis.as_ref().map(|r| r.url.as_str())
    }

    /// The per-check deadline.
    #[must_use]
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The effective policy table, one line per route, for humans.
    #[must_use]
    pub fn describe(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let store = match &self.redis {
            Some(r) => format!(
                "redis {} (pool {}, deadline {})",
                r.url,
                r.pool_size,
                fmt_duration(self.deadline)
            ),
            None => "in-process memory".to_owned(),
        };
        let _ = writeln!(
            out,
            "store: {store}; key prefix {:?}; fleet size {}",
            self.key_prefix, self.fleet_size
        );
        for l in &self.limits {
            let _ = writeln!(
                out,
                "limit {}: key {} (missing: {:?}), capacity {}, refill {}",
                l.name, l.key, l.on_missing, l.capacity, l.refill
            );
        }
        for r in &self.routes {
            let methods = r.methods.as_ref().map_or_else(
                || "*".to_owned(),
                |m| m.iter().map(Method::as_str).collect::<Vec<_>>().join(","),
            );
            let _ = writeln!(out, "route {methods} {}: {}", r.path, r.policy.describe());
        }
        match &self.default_route {
            Some(p) => {
                let _ = writeln!(out, "default: {}", p.describe());
            }
            None => out.push_str("default: not limited\n"),
        }
        out
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            pool_size: 4,
            connect_timeout: Duration::from_secs(2),
        }
    }
}

/// A limit for [`ConfigBuilder::limit`]: a token bucket of `capacity`
/// tokens refilled at `refill`, counted by `key`.
#[derive(Clone, Debug)]
#[must_use]
pub struct LimitConfig {
    key: KeySource,
    on_missing: OnMissing,
    capacity: u64,
    refill: Rate,
}

impl LimitConfig {
    /// A token bucket of `capacity` (burst) refilled at `refill`.
    pub fn token_bucket(key: KeySource, capacity: u64, refill: Rate) -> Self {
        Self {
            key,
            on_missing: OnMissing::Reject,
            capacity,
            refill,
        }
    }

    /// What to do when a request lacks the key.
    pub fn on_missing(mut self, on_missing: OnMissing) -> Self {
        self.on_missing = on_missing;
        self
    }
}

/// A route policy for [`ConfigBuilder::route`].
#[derive(Clone, Debug)]
#[must_use]
pub struct RouteConfig {
    limits: Vec<String>,
    methods: Option<Vec<Method>>,
    cost: u32,
    on_redis_error: FailurePolicy,
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
        }
    }

    /// Tokens each request takes (default 1).
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
}

/// Builds a [`Config`] in code; [`build`](Self::build) validates it as the
/// TOML loader does.
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct ConfigBuilder {
    redis: Option<RedisSettings>,
    deadline: Option<Duration>,
    key_prefix: Option<String>,
    fleet_size: Option<u32>,
    memory_max_keys: Option<usize>,
    client_ip: ClientIpRules,
    limits: Vec<(String, LimitConfig)>,
    routes: Vec<(String, RouteConfig)>,
    default_route: Option<RouteConfig>,
}

impl ConfigBuilder {
    /// Use Redis at `url`.
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.redis.get_or_insert_with(RedisSettings::default).url = url.into();
        self
    }

    /// Connections in the fred pool (default 4).
    pub fn pool_size(mut self, n: usize) -> Self {
        self.redis
            .get_or_insert_with(RedisSettings::default)
            .pool_size = n;
        self
    }

    /// The per-check deadline (default 5 ms).
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = Some(d);
        self
    }

    /// The Redis key prefix (default `rl`).
    pub fn key_prefix(mut self, p: impl Into<String>) -> Self {
        self.key_prefix = Some(p.into());
        self
    }

    /// N for the `local` fallback.
    pub fn fleet_size(mut self, n: u32) -> Self {
        self.fleet_size = Some(n);
        self
    }

    /// Most keys the in-process store holds.
    pub fn memory_max_keys(mut self, n: usize) -> Self {
        self.memory_max_keys = Some(n);
        self
    }

    /// Proxies whose forwarded headers are believed.
    pub fn trusted_proxies(
        mut self,
        nets: impl IntoIterator<Item = IpNet>,
        header: ForwardedHeader,
    ) -> Self {
        self.client_ip.trusted = nets.into_iter().collect();
        self.client_ip.header = header;
        self
    }

    /// Adds a named limit.
    pub fn limit(mut self, name: impl Into<String>, limit: LimitConfig) -> Self {
        self.limits.push((name.into(), limit));
        self
    }

    /// Adds a route (an axum route template such as `/users/{id}`).
    pub fn route(mut self, path: impl Into<String>, route: RouteConfig) -> Self {
        self.routes.push((path.into(), route));
        self
    }

    /// The policy of routes not listed.
    pub fn default_route(mut self, route: RouteConfig) -> Self {
        self.default_route = Some(route);
        self
    }

    /// Validates and builds.
    pub fn build(self) -> Result<Config, ConfigError> {
        let mut b = Validator::new("");
        let prefix = self.key_prefix.unwrap_or_else(|| "rl".into());
        b.check_name("key prefix", &prefix, None)?;
        for (name, l) in self.limits {
            b.add_limit(&name, None, l.key, l.on_missing, l.capacity, None, l.refill)?;
        }
        let mut routes = Vec::new();
        for (path, r) in self.routes {
            let policy = b.policy(
                r.limits.iter().map(|n| (n.as_str(), None)),
                r.cost,
                None,
                r.on_redis_error,
            )?;
            b.check_route(&path, r.methods.as_deref(), None)?;
            routes.push(RouteEntry {
                path,
                methods: r.methods,
                policy,
            });
        }
        let default_route = match self.default_route {
            Some(r) => Some(b.policy(
                r.limits.iter().map(|n| (n.as_str(), None)),
                r.cost,
                None,
                r.on_redis_error,
            )?),
            None => None,
        };
        let fleet_size = self.fleet_size.unwrap_or(1);
        if fleet_size == 0 {
            return Err(ConfigError::new("fleet size must be at least 1"));
        }
        Ok(Config {
            redis: self.redis,
            deadline: self.deadline.unwrap_or(DEFAULT_DEADLINE),
            key_prefix: prefix.into(),
            closed_retry_after: Duration::from_secs(1),
            fleet_size,
            memory_max_keys: self.memory_max_keys.unwrap_or(DEFAULT_MEMORY_KEYS),
            client_ip: self.client_ip,
            limits: b.limits,
            routes,
            default_route,
        })
    }
}

const DEFAULT_DEADLINE: Duration = Duration::from_millis(5);
const DEFAULT_MEMORY_KEYS: usize = 100_000;

// ---- the TOML schema ------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    redis: Option<RawRedis>,
    #[serde(default)]
    fleet: RawFleet,
    #[serde(default)]
    client_ip: RawClientIp,
    #[serde(default)]
    memory: RawMemory,
    #[serde(default)]
    limits: BTreeMap<Spanned<String>, RawLimit>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    default: Option<RawDefault>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    url: Option<String>,
    pool_size: Option<Spanned<usize>>,
    deadline: Option<Spanned<String>>,
    connect_timeout: Option<Spanned<String>>,
    key_prefix: Option<Spanned<String>>,
    closed_retry_after: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFleet {
    size: Option<Spanned<u32>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawClientIp {
    #[serde(default)]
    trusted_proxies: Vec<Spanned<String>>,
    forwarded_header: Option<Spanned<String>>,
    ipv6_prefix: Option<Spanned<u8>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMemory {
    max_keys: Option<Spanned<usize>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    key: Spanned<String>,
    #[serde(default)]
    on_missing: OnMissing,
    capacity: Spanned<u64>,
    refill: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    path: Spanned<String>,
    methods: Option<Vec<Spanned<String>>>,
    limits: Vec<Spanned<String>>,
    cost: Option<Spanned<u32>>,
    on_redis_error: Option<FailurePolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefault {
    limits: Vec<Spanned<String>>,
    cost: Option<Spanned<u32>>,
    on_redis_error: Option<FailurePolicy>,
}

fn parse_at<T, E: std::fmt::Display>(
    source: &str,
    v: &Spanned<String>,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, ConfigError> {
    parse(v.get_ref()).map_err(|e| ConfigError::at(source, Some(v.span()), e.to_string()))
}

impl RawConfig {
    fn validate(self, src: &str) -> Result<Config, ConfigError> {
        let mut b = Validator::new(src);
        let mut deadline = DEFAULT_DEADLINE;
        let mut prefix = "rl".to_owned();
        let mut closed_retry_after = Duration::from_secs(1);
        let redis = match self.redis {
            None => None,
            Some(r) => {
                let mut s = RedisSettings::default();
                if let Some(url) = r.url {
                    s.url = url;
                }
                if let Some(n) = r.pool_size {
                    if *n.get_ref() == 0 {
                        return Err(ConfigError::at(
                            src,
                            Some(n.span()),
                            "pool_size must be at least 1",
                        ));
                    }
                    s.pool_size = n.into_inner();
                }
                if let Some(d) = &r.deadline {
                    deadline = parse_at(src, d, units::parse_duration)?;
                    if deadline.is_zero() {
                        return Err(ConfigError::at(
                            src,
                            Some(d.span()),
                            "deadline must be longer than zero",
                        ));
                    }
                }
                if let Some(d) = &r.connect_timeout {
                    s.connect_timeout = parse_at(src, d, units::parse_duration)?;
                }
                if let Some(d) = &r.closed_retry_after {
                    closed_retry_after = parse_at(src, d, units::parse_duration)?;
                }
                if let Some(p) = r.key_prefix {
                    b.check_name("key_prefix", p.get_ref(), Some(p.span()))?;
                    prefix = p.into_inner();
                }
                Some(s)
            }
        };
        let fleet_size = match self.fleet.size {
            Some(n) if *n.get_ref() == 0 => {
                return Err(ConfigError::at(
                    src,
                    Some(n.span()),
                    "fleet size must be at least 1",
                ));
            }
            Some(n) => n.into_inner(),
            None => 1,
        };
        let mut client_ip = ClientIpRules::default();
        for p in &self.client_ip.trusted_proxies {
            client_ip.trusted.push(parse_at(src, p, parse_net)?);
        }
        if let Some(h) = &self.client_ip.forwarded_header {
            client_ip.header = parse_at(src, h, |h| match h.to_ascii_lowercase().as_str() {
                "x-forwarded-for" => Ok(ForwardedHeader::XForwardedFor),
                "forwarded" => Ok(ForwardedHeader::Forwarded),
                _ => Err(format!(
                    "forwarded_header must be \"x-forwarded-for\" or \"forwarded\", not {h:?}"
                )),
            })?;
        }
        if let Some(p) = self.client_ip.ipv6_prefix {
            if *p.get_ref() > 128 {
                return Err(ConfigError::at(
                    src,
                    Some(p.span()),
                    "ipv6_prefix must be between 0 and 128",
                ));
            }
            client_ip.ipv6_prefix = p.into_inner();
        }
        for (name, l) in &self.limits {
            let key = parse_at(src, &l.key, KeySource::from_str)?;
            let refill = parse_at(src, &l.refill, Rate::from_str)?;
            b.add_limit(
                name.get_ref(),
                Some(name.span()),
                key,
                l.on_missing,
                *l.capacity.get_ref(),
                Some(l.capacity.span()),
                refill,
            )?;
        }
        let mut routes = Vec::new();
        for r in &self.routes {
            let methods = match &r.methods {
                None => None,
                Some(ms) => Some(
                    ms.iter()
                        .map(|m| parse_at(src, m, |s| Method::from_str(&s.to_ascii_uppercase())))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
            };
            b.check_route(r.path.get_ref(), methods.as_deref(), Some(r.path.span()))?;
            let policy = b.policy(
                r.limits
                    .iter()
                    .map(|l| (l.get_ref().as_str(), Some(l.span()))),
                r.cost.as_ref().map_or(1, |c| *c.get_ref()),
                r.cost.as_ref().map(Spanned::span),
                r.on_redis_error.unwrap_or(FailurePolicy::Open),
            )?;
            routes.push(RouteEntry {
                path: r.path.get_ref().clone(),
                methods,
                policy,
            });
        }
        let default_route = match &self.default {
            None => None,
            Some(d) => Some(
                b.policy(
                    d.limits
                        .iter()
                        .map(|l| (l.get_ref().as_str(), Some(l.span()))),
                    d.cost.as_ref().map_or(1, |c| *c.get_ref()),
                    d.cost.as_ref().map(Spanned::span),
                    d.on_redis_error.unwrap_or(FailurePolicy::Open),
                )?,
            ),
        };
        let memory_max_keys = match self.memory.max_keys {
            Some(n) if *n.get_ref() == 0 => {
                return Err(ConfigError::at(
                    src,
                    Some(n.span()),
                    "max_keys must be at least 1",
                ));
            }
            Some(n) => n.into_inner(),
            None => DEFAULT_MEMORY_KEYS,
        };
        Ok(Config {
            redis,
            deadline,
            key_prefix: prefix.into(),
            closed_retry_after,
            fleet_size,
            memory_max_keys,
            client_ip,
            limits: b.limits,
            routes,
            default_route,
        })
    }
}

fn parse_net(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| {
            format!("invalid proxy address {s:?}; expected a CIDR such as \"10.0.0.0/8\" or an IP")
        })
}

/// Validation shared by the TOML loader and the builder.
struct Validator<'s> {
    src: &'s str,
    limits: Vec<Arc<Limit>>,
    routes_seen: HashSet<(String, Option<Method>)>,
}

impl<'s> Validator<'s> {
    fn new(src: &'s str) -> Self {
        Self {
            src,
            limits: Vec::new(),
            routes_seen: HashSet::new(),
        }
    }

    fn err(&self, span: Option<Range<usize>>, msg: impl Into<String>) -> ConfigError {
        ConfigError::at(self.src, span, msg)
    }

    /// Names end up inside Redis keys, so they may not hold `:`, `{` or `}`.
    fn check_name(
        &self,
        what: &str,
        name: &str,
        span: Option<Range<usize>>,
    ) -> Result<(), ConfigError> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if ok {
            Ok(())
        } else {
            Err(self.err(
                span,
                format!("{what} {name:?} must be 1 to 64 characters of letters, digits, '-', '_' or '.'"),
            ))
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn add_limit(
        &mut self,
        name: &str,
        name_span: Option<Range<usize>>,
        key: KeySource,
        on_missing: OnMissing,
        capacity: u64,
        capacity_span: Option<Range<usize>>,
        refill: Rate,
    ) -> Result<(), ConfigError> {
        self.check_name("limit name", name, name_span.clone())?;
        if self.limits.iter().any(|l| &*l.name == name) {
            return Err(self.err(name_span, format!("limit {name:?} is defined twice")));
        }
        if capacity == 0 {
            return Err(self.err(
                capacity_span,
                format!("limit {name:?}: capacity must be at least 1"),
            ));
        }
        // Beyond 2^53 Lua's doubles stop counting whole tokens exactly.
        if capacity > (1 << 53) {
            return Err(self.err(
                capacity_span,
                format!("limit {name:?}: capacity must be at most 2^53"),
            ));
        }
        self.limits.push(Arc::new(Limit {
            name: name.into(),
            key,
            on_missing,
            capacity,
            refill,
        }));
        Ok(())
    }

    fn check_route(
        &mut self,
        path: &str,
        methods: Option<&[Method]>,
        span: Option<Range<usize>>,
    ) -> Result<(), ConfigError> {
        if !path.starts_with('/') {
            return Err(self.err(span, format!("route path {path:?} must start with '/'")));
        }
        let keys: Vec<Option<Method>> = match methods {
            None => vec![None],
            Some(ms) => ms.iter().cloned().map(Some).collect(),
        };
        for k in keys {
            let label = k.as_ref().map_or("*", Method::as_str).to_owned();
            if !self.routes_seen.insert((path.to_owned(), k)) {
                return Err(self.err(
                    span.clone(),
                    format!("route {label} {path} is listed twice"),
                ));
            }
        }
        Ok(())
    }

    fn policy<'n>(
        &self,
        names: impl Iterator<Item = (&'n str, Option<Range<usize>>)>,
        cost: u32,
        cost_span: Option<Range<usize>>,
        on_redis_error: FailurePolicy,
    ) -> Result<Arc<Policy>, ConfigError> {
        if cost == 0 {
            return Err(self.err(cost_span, "cost must be at least 1"));
        }
        let mut limits = Vec::new();
        for (name, span) in names {
            let Some(l) = self.limits.iter().find(|l| &*l.name == name) else {
                let known: Vec<&str> = self.limits.iter().map(|l| &*l.name).collect();
                return Err(self.err(
                    span,
                    format!("unknown limit {name:?} (defined: {})", known.join(", ")),
                ));
            };
            if u64::from(cost) > l.capacity {
                return Err(self.err(
                    cost_span.clone(),
                    format!(
                        "cost {cost} is more than limit {name:?} can ever hold (capacity {}); \
                         every request would be refused",
                        l.capacity
                    ),
                ));
            }
            if limits.iter().any(|x: &Arc<Limit>| Arc::ptr_eq(x, l)) {
                return Err(self.err(span, format!("limit {name:?} is listed twice")));
            }
            limits.push(Arc::clone(l));
        }
        Ok(Arc::new(Policy {
            limits,
            cost,
            on_redis_error,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[redis]
url = "redis://127.0.0.1:1"
deadline = "7ms"

[fleet]
size = 3

[limits.per-key]
key = "header:x-api-key"
on_missing = "ip"
capacity = 5
refill = "1/s"

[[routes]]
path = "/search"
methods = ["get"]
limits = ["per-key"]
cost = 2
on_redis_error = "local"
"#;

    #[test]
    fn parses_a_good_file() {
        let c = Config::from_toml_str(GOOD).unwrap();
        assert_eq!(c.deadline, Duration::from_millis(7));
        assert_eq!(c.fleet_size, 3);
        assert_eq!(c.routes[0].policy.cost, 2);
        assert_eq!(c.routes[0].methods.as_deref(), Some(&[Method::GET][..]));
        assert_eq!(c.limits[0].on_missing, OnMissing::Ip);
        assert!(c.describe().contains("route GET /search"));
    }

    fn err(src: &str) -> ConfigError {
        Config::from_toml_str(src).unwrap_err()
    }

    #[test]
    fn errors_name_line_and_column() {
        let e = err(&GOOD.replace("capacity = 5", "capacty = 5"));
        assert!(e.message().contains("unknown field `capacty`"), "{e}");
        assert_eq!((e.line(), e.column()), (Some(12), Some(1)), "{e}");

        let e = err(&GOOD.replace("limits = [\"per-key\"]", "limits = [\"per-kye\"]"));
        assert!(e.message().contains("unknown limit \"per-kye\""), "{e}");
        assert_eq!((e.line(), e.column()), (Some(18), Some(11)), "{e}");

        let e = err(&GOOD.replace("\"1/s\"", "\"10/fortnight\""));
        assert!(e.message().contains("fortnight"), "{e}");
        assert_eq!((e.line(), e.column()), (Some(13), Some(10)), "{e}");

        let e = err(&GOOD.replace("capacity = 5", "capacity = 0"));
        assert!(e.message().contains("capacity must be at least 1"), "{e}");
        assert_eq!((e.line(), e.column()), (Some(12), Some(12)), "{e}");

        let e = err(&GOOD.replace("cost = 2", "cost = 6"));
        assert!(e.message().contains("capacity 5"), "{e}");

        let e = err(&GOOD.replace("\"local\"", "\"sometimes\""));
        assert!(e.message().contains("unknown variant `sometimes`"), "{e}");
        assert_eq!(e.line(), Some(20), "{e}");
    }

    #[test]
    fn builder_validates_too() {
        let e = Config::builder()
            .route("/", RouteConfig::new(["nope"]))
            .build()
            .unwrap_err();
        assert!(e.message().contains("unknown limit \"nope\""), "{e}");
        let ok = Config::builder()
            .limit(
                "ip",
                LimitConfig::token_bucket(KeySource::ClientIp, 10, Rate::per_second(1.0)),
            )
            .default_route(RouteConfig::new(["ip"]))
            .build()
            .unwrap();
        assert!(ok.redis.is_none());
    }
}
