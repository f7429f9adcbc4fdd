//! The file's smaller tables, each the model code builds too:
//! `[redis]`, `[fleet]`, `[breaker]`, `[memory]`, `[keys]`,
//! `[plan_cache]`, `[escalation]` and `[headers]`. A setting left out is
//! `None` here and gets its default where `build` compiles it.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};

use super::Hidden;
use super::de::{self, DurationSeed};
use super::redis_url::redact_url;

/// `[redis]`: the Redis store (when `url` is set; a `[redis]` table without
/// one is Redis at the default URL) and the settings of checks on it.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Redis {
    pub(super) url: Option<String>,
    pub(super) tls_ca_file: Option<PathBuf>,
    pub(super) tls_client_cert: Option<PathBuf>,
    pub(super) tls_client_key: Option<PathBuf>,
    pub(super) pool_size: Option<usize>,
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) deadline: Option<Duration>,
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) connect_timeout: Option<Duration>,
    pub(super) key_prefix: Option<String>,
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) closed_retry_after: Option<Duration>,
    pub(super) refused_cache_keys: Option<usize>,
    pub(super) coalesce: Option<bool>,
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) batch_window: Option<Duration>,
}

/// A `[redis]` table, there: Redis, at the default URL unless it says.
pub(super) fn redis<'de, D: Deserializer<'de>>(d: D) -> Result<Redis, D::Error> {
    let mut r = Redis::deserialize(d)?;
    let url = r.url.take();
    r.url = Some(url.unwrap_or_else(|| super::RedisSettings::default().url));
    Ok(r)
}

// By hand: the URL may carry a password, and `{:?}` ends up in logs.
impl fmt::Debug for Redis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redis")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_client_cert", &self.tls_client_cert)
            .field("tls_client_key", &self.tls_client_key)
            .field("pool_size", &self.pool_size)
            .field("deadline", &self.deadline)
            .field("connect_timeout", &self.connect_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("closed_retry_after", &self.closed_retry_after)
            .field("refused_cache_keys", &self.refused_cache_keys)
            .field("coalesce", &self.coalesce)
            .field("batch_window", &self.batch_window)
            .finish()
    }
}

/// `[fleet]`: its size, or its discovery by heartbeats.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Fleet {
    pub(super) size: Option<u32>,
    #[serde(default)]
    pub(super) discover: bool,
    /// How often each instance heartbeats (1 s when unset).
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) heartbeat: Option<Duration>,
    /// Silent this long, an instance is dead (3 heartbeats when unset).
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) dead_after: Option<Duration>,
}

/// `[memory]`: the in-process store.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Memory {
    pub(super) max_keys: Option<usize>,
}

/// `[keys]`: the secret API keys are hashed with, and the 401's challenge.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Keys {
    /// The environment variable holding the secret.
    pub(super) secret_env: Option<String>,
    /// The challenge of a missing key's 401 (`WWW-Authenticate`).
    pub(super) www_authenticate: Option<String>,
    /// The secret itself, given in code (it wins over `secret_env`).
    #[serde(skip)]
    pub(super) secret: Option<Hidden<Vec<u8>>>,
}

/// `[plan_cache]`: how long and for how many keys a plan is cached.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PlanCache {
    #[serde(default, deserialize_with = "de::some_duration")]
    pub(super) ttl: Option<Duration>,
    pub(super) max_keys: Option<usize>,
}

/// `[escalation]`: bounds of `on_exceed` per instance.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Escalation {
    pub(super) max_delayed: Option<usize>,
}

/// `[headers]`: the rate-limit fields responses carry.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Headers {
    pub(super) style: Option<crate::headers::HeaderStyle>,
}

/// `[breaker]`: a [`BreakerConfig`], and whether its window was given
/// (unset, it follows the deadline).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Breaker {
    pub(super) settings: BreakerConfig,
    pub(super) window_given: bool,
}

impl<'de> Deserialize<'de> for Breaker {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(field_identifier, rename_all = "snake_case")]
        enum Field {
            Failures,
            Window,
            CoolOff,
            Probes,
        }
        const FIELDS: &[&str] = &["failures", "window", "cool_off", "probes"];
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Breaker;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("struct BreakerConfig")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Breaker, A::Error> {
                let (mut s, mut window_given) = (BreakerConfig::default(), false);
                while let Some(field) = m.next_key()? {
                    match field {
                        Field::Failures => s.failures = m.next_value()?,
                        Field::Window => {
                            s.window = m.next_value_seed(DurationSeed)?;
                            window_given = true;
                        }
                        Field::CoolOff => s.cool_off = m.next_value_seed(DurationSeed)?,
                        Field::Probes => s.probes = m.next_value()?,
                    }
                }
                Ok(Breaker {
                    settings: s,
                    window_given,
                })
            }
        }
        d.deserialize_struct("BreakerConfig", FIELDS, V)
    }
}

/// Breaker settings: when the circuit breaker in front of Redis opens, and
/// for how long (`[breaker]` in TOML; the `ConfigBuilder::breaker_*`
/// setters in code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BreakerConfig {
    /// Failed checks, with no success in between, that open it: definite
    /// errors in a row open it at once; timeouts also need `window`.
    pub(crate) failures: u32,
    /// How long checks must keep failing, with no success, before it opens
    /// (well above the deadline: one late moment is not an outage).
    pub(crate) window: Duration,
    /// How long it stays open before probing.
    pub(crate) cool_off: Duration,
    /// Probe calls allowed at once while half-open.
    pub(crate) probes: u32,
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
