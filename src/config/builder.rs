//! Building a [`Config`] in code, validated exactly as TOML is.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use ipnet::IpNet;

use super::validate::{exact_count, RouteSettings, RuleSpans, Validator};
use super::{
    Config, ConfigError, FailurePolicy, Hidden, OnMissing, Rate, RedisSettings, RouteEntry,
    DEFAULT_DEADLINE, DEFAULT_MEMORY_KEYS, DEFAULT_PLAN_CACHE_KEYS, DEFAULT_PLAN_CACHE_TTL,
    DEFAULT_REFUSED_CACHE_KEYS,
};
use crate::algorithm::Rule;
use crate::key::{ClientIpRules, ForwardedHeader, KeySecret, KeySource, SecretOrigin};

/// A limit for [`ConfigBuilder::limit`].
#[derive(Clone, Debug)]
#[must_use]
pub struct LimitConfig {
    key: KeySource,
    on_missing: OnMissing,
    rule: Rule,
    shadow: bool,
    plans: Vec<(String, Rule)>,
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

    fn new(key: KeySource, rule: Rule) -> Self {
        Self {
            key,
            on_missing: OnMissing::Reject,
            rule,
            shadow: false,
            plans: Vec::new(),
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

    /// Other numbers for callers on `plan`, with the same algorithm (the
    /// capacity of `numbers` and, for windows, its window).
    pub fn plan(mut self, plan: impl Into<String>, numbers: LimitConfig) -> Self {
        self.plans.push((plan.into(), numbers.rule));
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
    shadow: bool,
    refund: bool,
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
        }
    }

    fn settings(&self) -> RouteSettings {
        RouteSettings {
            cost: self.cost,
            cost_span: None,
            on_redis_error: self.on_redis_error,
            shadow: self.shadow,
            refund: self.refund,
        }
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
    plan_assignments: Hidden<HashMap<String, String>>,
    plan_cache_ttl: Option<Duration>,
    breaker: Option<crate::breaker::BreakerConfig>,
    heartbeat: Option<super::Heartbeat>,
    key_secret: Option<Hidden<Vec<u8>>>,
}

impl ConfigBuilder {
    /// Use Redis at `url`.
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.redis.get_or_insert_with(RedisSettings::default).url = url.into();
        self
    }

    /// Trust the CA certificate(s) in this PEM file, besides the system's
    /// roots, for a `rediss://` URL.
    pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.redis
            .get_or_insert_with(RedisSettings::default)
            .tls_ca_file = Some(path.into());
        self
    }

    /// Present this certificate chain and key (PEM files) to a `rediss://`
    /// server that asks for client certificates (`tls-auth-clients yes`).
    pub fn tls_client_cert(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        let r = self.redis.get_or_insert_with(RedisSettings::default);
        r.tls_client_cert = Some(cert.into());
        r.tls_client_key = Some(key.into());
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

    /// Puts the caller with this key (API key, account) on `plan`.
    pub fn assign_plan(mut self, key: impl Into<String>, plan: impl Into<String>) -> Self {
        self.plan_assignments.0.insert(key.into(), plan.into());
        self
    }

    /// How long a resolved plan is cached per key (default 5 s).
    pub fn plan_cache_ttl(mut self, ttl: Duration) -> Self {
        self.plan_cache_ttl = Some(ttl);
        self
    }

    /// The circuit breaker's settings.
    pub fn breaker(mut self, b: crate::breaker::BreakerConfig) -> Self {
        self.breaker = Some(b);
        self
    }

    /// The secret API keys (header key values) are hashed with in Redis key
    /// names (HMAC-SHA256), at least 16 bytes; `[keys] secret_env` in TOML.
    /// Every instance and the `fleetlimit` CLI must use the same one. Not
    /// set: a built-in secret derived from the key prefix, which keeps raw
    /// API keys out of Redis but is not secret.
    pub fn key_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.key_secret = Some(Hidden(secret.as_ref().to_vec()));
        self
    }

    /// Discover the fleet size by heartbeats in Redis.
    pub fn heartbeat(mut self, every: Duration, dead_after: Duration) -> Self {
        self.heartbeat = Some(super::Heartbeat { every, dead_after });
        self
    }

    /// Validates and builds.
    pub fn build(self) -> Result<Config, ConfigError> {
        let mut v = Validator::new("");
        if let Some(r) = &self.redis {
            super::validate::check_redis("", r, &super::validate::RedisSpans::default())?;
        }
        let prefix = self.key_prefix.unwrap_or_else(|| "rl".into());
        v.check_name("key prefix", &prefix, None)?;
        let key_secret = match self.key_secret.as_ref().map(|s| &s.0) {
            Some(s) => {
                super::check_secret_len(s.len()).map_err(ConfigError::new)?;
                KeySecret::new(s, SecretOrigin::Code)
            }
            None => KeySecret::default_for(&prefix),
        };
        for (name, l) in &self.limits {
            v.add_limit(
                name,
                None,
                l.key.clone(),
                l.on_missing,
                l.rule,
                &RuleSpans::default(),
                l.shadow,
            )?;
        }
        for (name, l) in &self.limits {
            for (plan, rule) in &l.plans {
                v.add_plan_rule(plan, None, name, None, &RuleSpans::default(), |base| {
                    if std::mem::discriminant(base) == std::mem::discriminant(rule) {
                        Ok(*rule)
                    } else {
                        Err(format!(
                            "plan {plan:?} of limit {name:?} must use the limit's algorithm"
                        ))
                    }
                })?;
            }
        }
        let mut plan_assignments = HashMap::new();
        for (key, plan) in self.plan_assignments.0 {
            if !v.plans.contains(&plan) {
                return Err(ConfigError::new(format!("unknown plan {plan:?}")));
            }
            plan_assignments.insert(key, Arc::<str>::from(plan));
        }
        let limits: Vec<Arc<crate::policy::Limit>> = std::mem::take(&mut v.limits)
            .into_iter()
            .map(Arc::new)
            .collect();
        let mut routes = Vec::new();
        for (path, r) in self.routes {
            v.check_route(&path, r.methods.as_deref(), None)?;
            let policy = v.policy(
                &limits,
                r.limits.iter().map(|n| (n.as_str(), None)),
                r.settings(),
            )?;
            routes.push(RouteEntry {
                path,
                methods: r.methods,
                policy,
            });
        }
        let default_route = match self.default_route {
            Some(r) => Some(v.policy(
                &limits,
                r.limits.iter().map(|n| (n.as_str(), None)),
                r.settings(),
            )?),
            None => None,
        };
        // The numeric rules the TOML loader applies (the same code).
        let fleet_size = v.at_least_one("fleet size", self.fleet_size.unwrap_or(1), None)?;
        if let Some(r) = &self.redis {
            v.at_least_one("pool_size", r.pool_size, None)?;
            v.not_too_long("connect_timeout", r.connect_timeout, None)?;
        }
        if let Some(d) = self.deadline {
            v.longer_than_zero("deadline", d, None)?;
            v.not_too_long("deadline", d, None)?;
        }
        if let Some(b) = &self.breaker {
            v.not_too_long("breaker cool_off", b.cool_off, None)?;
            v.not_too_long("breaker window", b.window, None)?;
        }
        if let Some(t) = self.plan_cache_ttl {
            v.not_too_long("plan cache ttl", t, None)?;
        }
        if let Some(n) = self.memory_max_keys {
            v.at_least_one("max_keys", n, None)?;
        }
        if let Some(h) = &self.heartbeat {
            v.longer_than_zero("heartbeat", h.every, None)?;
            v.not_too_long("heartbeat", h.every, None)?;
            v.not_too_long("heartbeat dead_after", h.dead_after, None)?;
            v.heartbeat(h.every, h.dead_after, None)?;
        }
        let deadline = self.deadline.unwrap_or(DEFAULT_DEADLINE);
        let mut breaker = self.breaker.unwrap_or_default();
        breaker.window = v.breaker_window(self.breaker.map(|b| b.window), deadline, None)?;
        Ok(Config {
            redis: self.redis,
            deadline,
            key_prefix: prefix.into(),
            key_secret,
            closed_retry_after: Duration::from_secs(1),
            fleet_size,
            memory_max_keys: self.memory_max_keys.unwrap_or(DEFAULT_MEMORY_KEYS),
            client_ip: self.client_ip,
            limits,
            routes,
            default_route,
            plan_assignments: Hidden(plan_assignments),
            plan_cache_ttl: self.plan_cache_ttl.unwrap_or(DEFAULT_PLAN_CACHE_TTL),
            plan_cache_keys: DEFAULT_PLAN_CACHE_KEYS,
            breaker,
            heartbeat: self.heartbeat,
            refused_cache_keys: DEFAULT_REFUSED_CACHE_KEYS,
        })
    }
}
