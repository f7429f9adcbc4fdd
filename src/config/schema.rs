//! The TOML schema, as the file is written: every table denies unknown
//! fields, and each value keeps its place for errors. `lower/` turns it
//! into a [`ConfigBuilder`](super::ConfigBuilder).

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use crate::route::{FailurePolicy, OnMissing};
use crate::shed::Priority;

/// A capacity, a window's limit or slots in flight: a whole number, read
/// from any TOML number so that a float or a negative one is told the
/// bound in words (the upper bound, 2^53, is checked with the limit's
/// other numbers).
#[derive(Clone, Copy, Debug)]
pub(super) struct Amount(pub(super) u64);

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Amount;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(AMOUNT)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Amount, E> {
                Ok(Amount(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Amount, E> {
                u64::try_from(v)
                    .map(Amount)
                    .map_err(|_| E::custom(format!("{v} is not {AMOUNT}")))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Amount, E> {
                Err(E::custom(format!(
                    "{} is not {AMOUNT}",
                    super::error::short_number(v)
                )))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// What an [`Amount`] is, in words.
const AMOUNT: &str = "a whole number from 1 to 2^53 (9007199254740992)";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) redis: Option<RawRedis>,
    #[serde(default)]
    pub(super) fleet: RawFleet,
    #[serde(default)]
    pub(super) client_ip: RawClientIp,
    #[serde(default)]
    pub(super) memory: RawMemory,
    #[serde(default)]
    pub(super) breaker: RawBreaker,
    #[serde(default)]
    pub(super) keys: RawKeys,
    #[serde(default)]
    pub(super) limits: BTreeMap<Spanned<String>, Spanned<RawLimit>>,
    #[serde(default)]
    pub(super) plans: BTreeMap<Spanned<String>, BTreeMap<Spanned<String>, Spanned<RawPlanLimit>>>,
    #[serde(default)]
    pub(super) plan_assignments: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    pub(super) plan_cache: RawPlanCache,
    #[serde(default)]
    pub(super) routes: Vec<RawRoute>,
    pub(super) default: Option<RawDefault>,
    #[serde(default)]
    pub(super) escalation: RawEscalation,
    pub(super) shedding: Option<RawShedding>,
    #[serde(default)]
    pub(super) headers: RawHeaders,
    pub(super) regions: Option<Spanned<RawRegions>>,
}

/// `[regions]`: this instance's region and every region's exchange URL.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegions {
    pub(super) this: Option<Spanned<String>>,
    pub(super) this_env: Option<Spanned<String>>,
    pub(super) interval: Option<Spanned<String>>,
    /// `[regions.exchange]`: region → the Redis URL it is reached by.
    pub(super) exchange: Option<Spanned<Pairs<String>>>,
}

/// A table's entries in the order the file wrote them, each key and value
/// with its place (a `BTreeMap` would sort them; the toml parser refuses
/// a key written twice, at the second one).
pub(super) struct Pairs<V>(pub(super) Vec<(Spanned<String>, Spanned<V>)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Pairs<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Visitor<V> {
            type Value = Pairs<V>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a table")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Pairs<V>, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = m.next_entry()? {
                    out.push(entry);
                }
                Ok(Pairs(out))
            }
        }
        d.deserialize_map(Visitor(std::marker::PhantomData))
    }
}

/// A limit's `scope`.
#[derive(Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Scope {
    /// Decided by this region's Redis against the whole limit (as ever).
    #[default]
    Region,
    /// Decided in each region against its share (`[regions]`).
    Global,
}

/// `[headers]`: the rate-limit fields responses carry.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaders {
    pub(super) style: Option<crate::HeaderStyle>,
}

/// `[escalation]`: bounds of `on_exceed` per instance.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEscalation {
    pub(super) max_delayed: Option<Spanned<usize>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedis {
    pub(super) url: Option<Spanned<String>>,
    pub(super) tls_ca_file: Option<Spanned<String>>,
    pub(super) tls_client_cert: Option<Spanned<String>>,
    pub(super) tls_client_key: Option<Spanned<String>>,
    pub(super) pool_size: Option<Spanned<usize>>,
    pub(super) deadline: Option<Spanned<String>>,
    pub(super) connect_timeout: Option<Spanned<String>>,
    pub(super) key_prefix: Option<Spanned<String>>,
    pub(super) closed_retry_after: Option<Spanned<String>>,
    pub(super) refused_cache_keys: Option<Spanned<usize>>,
    pub(super) coalesce: Option<bool>,
    pub(super) batch_window: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFleet {
    pub(super) size: Option<Spanned<u32>>,
    #[serde(default)]
    pub(super) discover: bool,
    pub(super) heartbeat: Option<Spanned<String>>,
    pub(super) dead_after: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBreaker {
    pub(super) failures: Option<Spanned<u32>>,
    pub(super) window: Option<Spanned<String>>,
    pub(super) cool_off: Option<Spanned<String>>,
    pub(super) probes: Option<Spanned<u32>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKeys {
    /// The environment variable holding the secret API keys are hashed with.
    pub(super) secret_env: Option<Spanned<String>>,
    /// The challenge of a missing key's 401 (`WWW-Authenticate`).
    pub(super) www_authenticate: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClientIp {
    #[serde(default)]
    pub(super) trusted_proxies: Vec<Spanned<String>>,
    pub(super) forwarded_header: Option<Spanned<String>>,
    pub(super) ipv6_prefix: Option<Spanned<u8>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMemory {
    pub(super) max_keys: Option<Spanned<usize>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlanCache {
    pub(super) ttl: Option<Spanned<String>>,
    pub(super) max_keys: Option<Spanned<usize>>,
}

#[derive(Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(super) enum AlgorithmName {
    #[default]
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    Concurrency,
}

#[derive(Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Mode {
    #[default]
    Enforce,
    Shadow,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    pub(super) key: Spanned<String>,
    #[serde(default)]
    pub(super) on_missing: OnMissing,
    #[serde(default)]
    pub(super) algorithm: AlgorithmName,
    pub(super) capacity: Option<Spanned<Amount>>,
    pub(super) refill: Option<Spanned<String>>,
    pub(super) limit: Option<Spanned<Amount>>,
    pub(super) window: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) mode: Mode,
    pub(super) lease_batch: Option<Spanned<u32>>,
    pub(super) lease_above: Option<Spanned<u32>>,
    /// `"requests"` (the default) or `"failures"`.
    pub(super) count: Option<Spanned<Count>>,
    pub(super) failure_statuses: Option<Spanned<Vec<Spanned<i64>>>>,
    pub(super) on_exceed: Option<Spanned<Exceed>>,
    pub(super) delay: Option<Spanned<String>>,
    /// `algorithm = "concurrency"`: slots per key, and the longest a slot counts.
    pub(super) max_in_flight: Option<Spanned<Amount>>,
    pub(super) max_hold: Option<Spanned<String>>,
    /// `record = true`, or a `[limits.<name>.record]` table.
    pub(super) record: Option<Spanned<RawRecord>>,
    /// `"region"` (the default) or `"global"` (`[regions]`).
    pub(super) scope: Option<Spanned<Scope>>,
    /// A global limit's share per region, as weights (default: equal).
    pub(super) split: Option<Spanned<Pairs<f64>>>,
}

/// A limit's `record`: `true`/`false`, or a table of its bounds.
pub(super) enum RawRecord {
    On(bool),
    Table(RawRecordTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRecordTable {
    pub(super) max_len: Option<Spanned<u64>>,
    pub(super) max_age: Option<Spanned<String>>,
}

impl<'de> Deserialize<'de> for RawRecord {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawRecord;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`true`, `false` or a table with `max_len` and `max_age`")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<RawRecord, E> {
                Ok(RawRecord::On(b))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<RawRecord, A::Error> {
                // The table's own checks (unknown fields) apply.
                let d = serde::de::value::MapAccessDeserializer::new(m);
                RawRecordTable::deserialize(d).map(RawRecord::Table)
            }
        }
        d.deserialize_any(V)
    }
}

/// `count`: what a limit counts.
#[derive(Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Count {
    #[default]
    Requests,
    Failures,
}

/// `on_exceed`, as written (`delay` takes its duration from `delay`).
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Exceed {
    Refuse,
    Delay,
    Challenge,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlanLimit {
    pub(super) capacity: Option<Spanned<Amount>>,
    pub(super) refill: Option<Spanned<String>>,
    pub(super) limit: Option<Spanned<Amount>>,
    pub(super) window: Option<Spanned<String>>,
    pub(super) max_in_flight: Option<Spanned<Amount>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) path: Spanned<String>,
    pub(super) methods: Option<Vec<Spanned<String>>>,
    pub(super) limits: Vec<Spanned<String>>,
    pub(super) cost: Option<Spanned<u32>>,
    pub(super) on_redis_error: Option<FailurePolicy>,
    #[serde(default)]
    pub(super) mode: Mode,
    #[serde(default)]
    pub(super) refund: bool,
    pub(super) priority: Option<Priority>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefault {
    pub(super) limits: Vec<Spanned<String>>,
    pub(super) cost: Option<Spanned<u32>>,
    pub(super) on_redis_error: Option<FailurePolicy>,
    #[serde(default)]
    pub(super) mode: Mode,
    #[serde(default)]
    pub(super) refund: bool,
    pub(super) priority: Option<Priority>,
}

/// `[shedding]`: load shedding (absent: off).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShedding {
    pub(super) max_in_flight: Option<Spanned<u32>>,
    pub(super) queue_delay_target: Option<Spanned<String>>,
    pub(super) queue_delay_interval: Option<Spanned<String>>,
    pub(super) fleet_signal_refresh: Option<Spanned<String>>,
    pub(super) retry_after: Option<Spanned<String>>,
    pub(super) sheddable_at: Option<Spanned<f64>>,
    pub(super) critical_at: Option<Spanned<f64>>,
}
