//! Building a [`Config`](super::Config) in code, and the model a TOML file
//! deserialises into: [`ConfigBuilder`]'s fields are the file's tables,
//! and its methods set them. [`build`](ConfigBuilder::build) compiles it,
//! checking everything (`validate/`), into the runtime's `Config`.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};

use super::Hidden;
use super::de;
use super::descriptors::DescriptorConfig;
use super::limit::LimitConfig;
use super::numbers::Numbers;
use super::regions::RegionsConfig;
use super::route::{self, RouteConfig};
use super::sections::{self, Breaker, Escalation, Fleet, Headers, Keys, Memory, PlanCache, Redis};
use crate::key::{ClientIpRules, ForwardedHeader};
use crate::shed::SheddingConfig;

/// Builds a [`Config`](super::Config) in code; [`build`](Self::build)
/// validates it as the TOML loader does (the loader goes through it).
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::Config;
/// use fleetlimit::configuration::{FailurePolicy, KeySource, LimitConfig, Rate, RouteConfig};
///
/// let cfg = Config::builder()
///     .deadline(Duration::from_millis(5))
///     .limit("per-key", LimitConfig::token_bucket(KeySource::header("x-api-key"), 5, Rate::per_second(1)))
///     .route("/search", RouteConfig::new(["per-key"]).on_redis_error(FailurePolicy::Local))
///     .build()?;
/// assert_eq!(cfg.deadline(), Duration::from_millis(5));
/// # Ok::<(), fleetlimit::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[must_use]
pub struct ConfigBuilder {
    #[serde(default, deserialize_with = "sections::redis")]
    pub(super) redis: Redis,
    #[serde(default)]
    pub(super) fleet: Fleet,
    #[serde(default)]
    pub(super) client_ip: ClientIpRules,
    #[serde(default)]
    pub(super) memory: Memory,
    #[serde(default)]
    pub(super) breaker: Breaker,
    #[serde(default)]
    pub(super) keys: Keys,
    /// In the order added (a file's: sorted by name).
    #[serde(default, deserialize_with = "de::sorted")]
    pub(super) limits: Vec<(String, LimitConfig)>,
    /// `[plans.<plan>.<limit>]`, from a file (code gives a limit its plans).
    #[serde(default)]
    pub(super) plans: BTreeMap<String, BTreeMap<String, Numbers>>,
    /// Key (callers' API keys among them) and plan.
    #[serde(default, deserialize_with = "plan_assignments")]
    pub(super) plan_assignments: Hidden<Vec<(String, String)>>,
    #[serde(default)]
    pub(super) plan_cache: PlanCache,
    #[serde(default)]
    pub(super) routes: Vec<RouteConfig>,
    /// The policy of routes not listed.
    #[serde(default, rename = "default", deserialize_with = "route::default_route")]
    pub(super) default_route: Option<RouteConfig>,
    /// `[[descriptors]]`: Envoy's rate limit service's rules (docs/rls.md).
    #[serde(default)]
    pub(super) descriptors: Vec<DescriptorConfig>,
    #[serde(default)]
    pub(super) escalation: Escalation,
    /// Load shedding (`None`: off).
    pub(super) shedding: Option<SheddingConfig>,
    #[serde(default)]
    pub(super) headers: Headers,
    /// `[regions]` (`None`: one region).
    pub(super) regions: Option<RegionsConfig>,
    /// The file's text, where `build` finds the places of its errors.
    /// Hidden: it may hold callers' API keys (`[plan_assignments]`).
    #[serde(skip)]
    pub(super) src: Hidden<String>,
}

fn plan_assignments<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Hidden<Vec<(String, String)>>, D::Error> {
    de::sorted(d).map(Hidden)
}

impl ConfigBuilder {
    /// The Redis store's settings: setting one means Redis (at the default
    /// URL until one is given).
    fn redis(&mut self) -> &mut Redis {
        let r = &mut self.redis;
        r.url
            .get_or_insert_with(|| super::RedisSettings::default().url);
        r
    }

    /// Use Redis at `url`.
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.redis.url = Some(url.into());
        self
    }

    /// Trust the CA certificate(s) in this PEM file, besides the system's
    /// roots, for a `rediss://` URL.
    pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.redis().tls_ca_file = Some(path.into());
        self
    }

    /// Present this certificate chain and key (PEM files) to a `rediss://`
    /// server that asks for client certificates (`tls-auth-clients yes`).
    pub fn tls_client_cert(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        let r = self.redis();
        r.tls_client_cert = Some(cert.into());
        r.tls_client_key = Some(key.into());
        self
    }

    /// Connections in the fred pool (default 4).
    pub fn pool_size(mut self, n: usize) -> Self {
        self.redis().pool_size = Some(n);
        self
    }

    /// How long connecting to Redis may take (default 2 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.redis().connect_timeout = Some(d);
        self
    }

    /// Whether checks in flight together share one script call (default
    /// true; on a Cluster, one call per primary).
    pub fn coalesce(mut self, on: bool) -> Self {
        self.redis().coalesce = Some(on);
        self
    }

    /// How long a coalesced check waits for company before its call goes
    /// out (default: it does not wait; above 0, at most 10 ms, and only
    /// with `coalesce`): fewer, larger script calls, so less of Redis per
    /// decision, for up to `window` more latency per request.
    pub fn batch_window(mut self, window: Duration) -> Self {
        self.redis().batch_window = Some(window);
        self
    }

    /// The per-check deadline (default 5 ms).
    pub fn deadline(mut self, d: Duration) -> Self {
        self.redis.deadline = Some(d);
        self
    }

    /// The Redis key prefix (default `rl`).
    pub fn key_prefix(mut self, p: impl Into<String>) -> Self {
        self.redis.key_prefix = Some(p.into());
        self
    }

    /// The `Retry-After` of a `closed` route's 503 (default 1 s).
    pub fn closed_retry_after(mut self, d: Duration) -> Self {
        self.redis.closed_retry_after = Some(d);
        self
    }

    /// Most keys the refused-key cache holds (default 10 000; 0: off).
    pub fn refused_cache_keys(mut self, n: usize) -> Self {
        self.redis.refused_cache_keys = Some(n);
        self
    }

    /// N for the `local` fallback.
    pub fn fleet_size(mut self, n: u32) -> Self {
        self.fleet.size = Some(n);
        self
    }

    /// Most keys the in-process store holds.
    pub fn memory_max_keys(mut self, n: usize) -> Self {
        self.memory.max_keys = Some(n);
        self
    }

    /// Proxies whose forwarded headers are believed (`[client_ip]
    /// trusted_proxies` in TOML): `X-Forwarded-For`, unless
    /// [`forwarded_rfc7239`](Self::forwarded_rfc7239).
    ///
    /// ```
    /// use fleetlimit::Config;
    ///
    /// let cfg = Config::builder()
    ///     .trusted_proxies(["10.0.0.0/8".parse()?])
    ///     .forwarded_rfc7239()
    ///     .build()?;
    /// # let _ = cfg;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn trusted_proxies(mut self, nets: impl IntoIterator<Item = IpNet>) -> Self {
        self.client_ip.trusted = nets.into_iter().collect();
        self
    }

    /// Trusted proxies write the client chain into RFC 7239's `Forwarded:
    /// for=client, for=proxy1`, not `X-Forwarded-For: client, proxy1`
    /// (`[client_ip] header = "forwarded"` in TOML).
    pub fn forwarded_rfc7239(mut self) -> Self {
        self.client_ip.header = ForwardedHeader::Forwarded;
        self
    }

    /// The prefix length IPv6 clients are grouped by (0 to 128, default 64).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.client_ip.ipv6_prefix = bits;
        self
    }

    /// Adds a named limit.
    pub fn limit(mut self, name: impl Into<String>, limit: LimitConfig) -> Self {
        self.limits.push((name.into(), limit));
        self
    }

    /// Adds a route (an axum route template such as `/users/{id}`).
    pub fn route(mut self, path: impl Into<String>, route: RouteConfig) -> Self {
        self.routes.push(RouteConfig {
            path: path.into(),
            ..route
        });
        self
    }

    /// The policy of routes not listed.
    pub fn default_route(mut self, route: RouteConfig) -> Self {
        self.default_route = Some(route);
        self
    }

    /// Puts the caller with this key (API key, account) on `plan`.
    pub fn assign_plan(mut self, key: impl Into<String>, plan: impl Into<String>) -> Self {
        self.plan_assignments.0.push((key.into(), plan.into()));
        self
    }

    /// How long a resolved plan is cached per key (default 5 s).
    pub fn plan_cache_ttl(mut self, ttl: Duration) -> Self {
        self.plan_cache.ttl = Some(ttl);
        self
    }

    /// Most keys whose resolved plan is cached (default 10 000).
    pub fn plan_cache_keys(mut self, n: usize) -> Self {
        self.plan_cache.max_keys = Some(n);
        self
    }

    /// Failed checks, with no success in between, that open the circuit
    /// breaker (default 3; `[breaker] failures` in TOML): definite errors
    /// in a row open it at once; timeouts also need the
    /// [window](Self::breaker_window).
    pub fn breaker_failures(mut self, n: u32) -> Self {
        self.breaker.settings.failures = n;
        self
    }

    /// How long checks must keep failing, with no success, before the
    /// breaker opens (`[breaker] window` in TOML; well above the deadline:
    /// one late moment is not an outage). Unset, it follows the deadline.
    pub fn breaker_window(mut self, window: Duration) -> Self {
        self.breaker.settings.window = window;
        self.breaker.window_given = true;
        self
    }

    /// How long the breaker stays open before probing (default 500 ms;
    /// `[breaker] cool_off` in TOML).
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetlimit::Config;
    ///
    /// let cfg = Config::builder().breaker_cool_off(Duration::from_secs(1)).build()?;
    /// # let _ = cfg;
    /// # Ok::<(), fleetlimit::ConfigError>(())
    /// ```
    pub fn breaker_cool_off(mut self, cool_off: Duration) -> Self {
        self.breaker.settings.cool_off = cool_off;
        self
    }

    /// Probe calls allowed at once while the breaker is half-open (default
    /// 1; `[breaker] probes` in TOML).
    pub fn breaker_probes(mut self, n: u32) -> Self {
        self.breaker.settings.probes = n;
        self
    }

    /// The secret API keys (header key values) are hashed with in Redis key
    /// names (a keyed SipHash-2-4 digest), at least 16 bytes; `[keys] secret_env` in TOML.
    /// Every instance and the `fleetlimit` CLI must use the same one. Not
    /// set: a built-in secret derived from the key prefix, which keeps raw
    /// API keys out of Redis but is not secret.
    pub fn key_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.keys.secret = Some(Hidden(secret.as_ref().to_vec()));
        self.keys.secret_env = None;
        self
    }

    /// The key secret from environment variable `name`, read by
    /// [`build`](Self::build) (`[keys] secret_env` in TOML).
    pub fn key_secret_env(mut self, name: impl Into<String>) -> Self {
        self.keys.secret_env = Some(name.into());
        self.keys.secret = None;
        self
    }

    /// Discover the fleet size by heartbeats in Redis.
    pub fn heartbeat(mut self, every: Duration, dead_after: Duration) -> Self {
        self.fleet.discover = true;
        self.fleet.heartbeat = Some(every);
        self.fleet.dead_after = Some(dead_after);
        self
    }

    /// Most requests held by [`OnExceed::Delay`](crate::configuration::OnExceed::Delay) at
    /// once on this instance (default 100; `[escalation] max_delayed` in
    /// TOML): beyond it, a request that would be delayed is challenged instead.
    pub fn max_delayed(mut self, n: usize) -> Self {
        self.escalation.max_delayed = Some(n);
        self
    }

    /// Which rate-limit fields responses carry (default
    /// [`HeaderStyle::Legacy`](crate::headers::HeaderStyle::Legacy): `X-RateLimit-*`
    /// only; `[headers] style` in TOML).
    pub fn header_style(mut self, style: crate::headers::HeaderStyle) -> Self {
        self.headers.style = Some(style);
        self
    }

    /// The `WWW-Authenticate` challenge of the `401` a request without its
    /// key gets (RFC 9110 requires one): an auth-scheme, optionally with
    /// parameters, e.g. `Bearer realm="api"`. Default `ApiKey`;
    /// `[keys] www_authenticate` in TOML. Checked by [`build`](Self::build).
    pub fn www_authenticate(mut self, challenge: impl Into<String>) -> Self {
        self.keys.www_authenticate = Some(challenge.into());
        self
    }

    /// Shed load when the backend is saturated: refuse requests by their
    /// route's [`Priority`](crate::shed::Priority) with `503`, before any limit is
    /// charged (`[shedding]` in TOML; see [`SheddingConfig`]).
    pub fn shedding(mut self, shedding: SheddingConfig) -> Self {
        self.shedding = Some(shedding);
        self
    }

    /// Regions, for [global](LimitConfig::global) limits (`[regions]` in
    /// TOML; needs Redis, each region's own): this instance is in region
    /// `this` (`this = "eu"`), which must be one of the
    /// [`region`](Self::region)s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetlimit::Config;
    /// use fleetlimit::configuration::{KeySource, LimitConfig, Rate, RouteConfig};
    ///
    /// let per_key = LimitConfig::token_bucket(KeySource::header("x-api-key"), 100, Rate::per_second(10))
    ///     .global_split([("eu", 0.6), ("us", 0.4)]);
    /// let cfg = Config::builder()
    ///     .redis_url("redis://10.0.0.1:6379")
    ///     .this_region("eu")
    ///     .region("eu", "redis://10.0.0.1:6379")
    ///     .region("us", "redis://10.1.0.1:6379")
    ///     .region_interval(Duration::from_secs(5))
    ///     .limit("per-key", per_key)
    ///     .default_route(RouteConfig::new(["per-key"]))
    ///     .build();
    /// # #[cfg(feature = "redis")]
    /// assert!(cfg.is_ok(), "{cfg:?}");
    /// ```
    pub fn this_region(mut self, this: impl Into<String>) -> Self {
        self.regions_mut().this(this.into());
        self
    }

    /// This instance's region is the value of environment variable `var`,
    /// read by [`build`](Self::build) (`this_env = "FLEETLIMIT_REGION"` in
    /// TOML): one file for every region, each deployment setting the
    /// variable. Unset or empty, the build fails.
    ///
    /// ```
    /// use fleetlimit::Config;
    ///
    /// let err = Config::builder()
    ///     .redis_url("redis://10.0.0.1:6379")
    ///     .this_region_env("FLEETLIMIT_REGION_UNSET_IN_THIS_EXAMPLE")
    ///     .region("eu", "redis://10.0.0.1:6379")
    ///     .region("us", "redis://10.1.0.1:6379")
    ///     .build();
    /// # #[cfg(feature = "redis")]
    /// assert!(err.unwrap_err().message().contains("is not set"));
    /// ```
    pub fn this_region_env(mut self, var: impl Into<String>) -> Self {
        self.regions_mut().this_env(var.into());
        self
    }

    /// Adds region `name` (1 to 64 letters, digits, `-`, `_` or `.`), and
    /// the Redis URL this region's exchange reaches it by (a line of
    /// `[regions.exchange]` in TOML). Every region, this one included.
    pub fn region(mut self, name: impl Into<String>, exchange_url: impl Into<String>) -> Self {
        self.regions_mut().add(name.into(), exchange_url.into());
        self
    }

    /// How often quotas move between regions (default 2 s; 100 ms to 60 s;
    /// `[regions] interval` in TOML).
    pub fn region_interval(mut self, interval: Duration) -> Self {
        self.regions_mut().set_interval(interval);
        self
    }

    fn regions_mut(&mut self) -> &mut RegionsConfig {
        self.regions.get_or_insert_with(RegionsConfig::empty)
    }
}
