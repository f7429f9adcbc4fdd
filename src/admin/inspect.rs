//! Inspect and reset one caller's buckets.

use fred::clients::Pool;
use fred::interfaces::{ClientLike, KeysInterface, PubsubInterface};
use fred::types::{CustomCommand, Value};

use super::{Admin, keys_of};
use crate::algorithm::{INVALID_STATE, Rule, Stored};
use crate::config::Config;
use crate::store::StoreError;
use crate::store::redis::reply::map_err;

/// One bucket as stored in Redis, as [`Admin::inspect`] reads it.
///
/// Its key and raw value come from Redis, where anyone who can write under
/// the prefix chooses them: escape them before printing them to a
/// terminal (its `state` is already escaped).
///
/// ```no_run
/// # async fn f(cfg: fleetlimit::Config) -> Result<(), fleetlimit::StoreError> {
/// use fleetlimit::admin::Admin;
///
/// let admin = Admin::connect(&cfg).await?;
/// for b in admin.inspect("sk_live_42", None).await? {
///     // e.g. `per-key "rl:per-key:{h:…}" 3.20 of 10 tokens, full in 68 s`
///     println!("{} {:?} {} (pttl {} ms)", b.limit(), b.key(), b.state(), b.pttl());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BucketInfo {
    #[serde(serialize_with = "super::shown::one")]
    pub(crate) limit: String,
    #[serde(serialize_with = "super::shown::one")]
    pub(crate) key: String,
    #[serde(serialize_with = "super::shown::opt")]
    pub(crate) value: Option<String>,
    pub(crate) pttl: i64,
    pub(crate) state: String,
    pub(crate) invalid: bool,
    pub(crate) remaining: f64,
    /// A global limit's: this region's share of the key (the bucket above
    /// is read under it, as the layer decides), and its quota in flight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) global: Option<super::quota::Held>,
}

impl BucketInfo {
    /// The limit.
    #[must_use]
    pub fn limit(&self) -> &str {
        &self.limit
    }

    /// The Redis key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The stored value as text (`None`: no such key, i.e. a full bucket):
    /// a token bucket's TAT in µs of Redis's clock, which Redis holds as an
    /// 8-byte double (or as text, written by earlier code).
    #[must_use]
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// Milliseconds to expiry (-1: none, -2: no key).
    #[must_use]
    pub fn pttl(&self) -> i64 {
        self.pttl
    }

    /// The value read for humans, by the limiter's own rules (a value it
    /// does not accept says "invalid state (taken as absent by the
    /// limiter)"); Redis's text in it is already escaped.
    #[must_use]
    pub fn state(&self) -> &str {
        &self.state
    }

    /// Whether the limiter takes the key as absent although it exists: a
    /// value or a type that is not a state fleetlimit writes.
    #[must_use]
    pub fn invalid(&self) -> bool {
        self.invalid
    }

    /// What the key leaves, as the limiter decides (tokens, requests or
    /// slots; the capacity for a missing or invalid key).
    #[must_use]
    pub fn remaining(&self) -> f64 {
        self.remaining
    }
}

impl Admin {
    /// The buckets of the caller whose key value is `value`, for every limit
    /// (or the one named).
    pub async fn inspect(
        &self,
        value: &str,
        limit: Option<&str>,
    ) -> Result<Vec<BucketInfo>, StoreError> {
        let (pool, config) = (self.store.pool(), &self.config);
        Admin::check_target(config, value, limit).map_err(StoreError::Protocol)?;
        let mut out = Vec::new();
        // Token buckets are stored as a time (GCRA): read them on Redis's clock.
        let now_us = super::time::redis_now_us(pool).await?;
        for (l, key) in keys_of(config, value, limit) {
            // A global limit's bucket here is this region's share of it.
            let mut global = super::quota::share(pool, config, l, &key).await?;
            let rule = global.as_ref().map_or(l.rule, |g| l.rule.quota(g.ppm));
            // One key's type or value never fails the others' report.
            let b = read_bucket(pool, &rule, &key, now_us)
                .await
                .unwrap_or_else(|e| {
                    let state = format!("could not be read: {}", super::printable(&e.to_string()));
                    (None, -2, state, false, rule.capacity())
                });
            let (raw, pttl, state, invalid, remaining) = b;
            // The flights after the bucket: they may wait on other regions.
            if let Some(g) = global.as_mut() {
                let now_ms = (now_us / 1000.0) as u64;
                g.flights = super::quota::flights(pool, config, l, &key, now_ms).await?;
            }
            out.push(BucketInfo {
                limit: l.name.to_string(),
                key,
                value: raw,
                pttl,
                state,
                invalid,
                remaining,
                global,
            });
        }
        if out.is_empty() {
            return Err(StoreError::Protocol(format!("no limit named {limit:?}")));
        }
        Ok(out)
    }

    /// Deletes the caller's buckets (a full bucket again) and announces the
    /// reset to every layer instance listening on the prefix's reset channel,
    /// which forgets its remembered refusals and leases of those keys (see the
    /// reset listener in `RateLimitLayer::new(..)`); returns how
    /// many keys existed. An error after the keys were deleted says so.
    pub async fn reset(&self, value: &str, limit: Option<&str>) -> Result<u64, StoreError> {
        let (pool, config) = (self.store.pool(), &self.config);
        Admin::check_target(config, value, limit).map_err(StoreError::Protocol)?;
        let mut n = 0;
        let mut keys = Vec::new();
        for (_, key) in keys_of(config, value, limit) {
            let deleted: i64 = pool.del(&key).await.map_err(map_err)?;
            n += deleted.max(0) as u64;
            keys.push(key);
        }
        announce_reset(pool, config, &keys).await.map_err(|e| {
            StoreError::Unavailable(format!(
                "{n} key(s) deleted, but the reset could not be announced to the instances \
                 (they forget their remembered refusals at each Retry-After): {e}"
            ))
        })?;
        Ok(n)
    }
}

/// One bucket: its raw value, PTTL, state in words, whether the limiter
/// takes it as absent, and what it leaves.
type Read = (Option<String>, i64, String, bool, f64);

/// Reads `key` by its type: a string for every algorithm but concurrency,
/// whose slots are a sorted set (`id deadline_µs` pairs); a key of another
/// type is named as such.
async fn read_bucket(pool: &Pool, rule: &Rule, key: &str, now_us: f64) -> Result<Read, StoreError> {
    let found: String = pool
        .custom(
            CustomCommand::new_static("TYPE", fred::types::ClusterHash::FirstKey, false),
            vec![key],
        )
        .await
        .map_err(map_err)?;
    let want = if rule.is_concurrency() {
        "zset"
    } else {
        "string"
    };
    let capacity = rule.capacity();
    if found == "none" {
        return Ok((None, -2, "no key: a full bucket".into(), false, capacity));
    }
    let pttl: i64 = pool.pttl(key).await.map_err(map_err)?;
    if found != want {
        let state = format!(
            "a {}, where fleetlimit writes a {want}: {INVALID_STATE}",
            super::printable(&found)
        );
        return Ok((None, pttl, state, true, capacity));
    }
    let (raw, stored) = if rule.is_concurrency() {
        let zrange = CustomCommand::new_static("ZRANGE", fred::types::ClusterHash::FirstKey, false);
        let args = vec![Value::from(key), 0.into(), (-1).into(), "WITHSCORES".into()];
        let pairs: Vec<String> = pool.custom(zrange, args).await.map_err(map_err)?;
        let scores: Vec<String> = pairs.iter().skip(1).step_by(2).cloned().collect();
        let stored = rule.read_slots((!pairs.is_empty()).then_some(&scores[..]), now_us);
        ((!pairs.is_empty()).then(|| pairs.join(" ")), stored)
    } else {
        let raw: Option<Vec<u8>> = pool.get(key).await.map_err(map_err)?;
        let stored = rule.read_stored(raw.as_deref(), pttl, now_us);
        (raw.map(|r| rule.shown(&r)), stored)
    };
    let remaining = stored.remaining(capacity);
    Ok(match stored {
        Stored::Absent => (raw, pttl, "no key: a full bucket".into(), false, remaining),
        Stored::Valid { text, .. } => (raw, pttl, text, false, remaining),
        Stored::Invalid => {
            let shown = super::printable(raw.as_deref().unwrap_or_default());
            let state = format!("{INVALID_STATE}: {shown}");
            (raw, pttl, state, true, remaining)
        }
    })
}

/// Publishes `keys` on the prefix's reset channel (plain `PUBLISH`: a
/// cluster forwards it to every node).
async fn announce_reset(pool: &Pool, config: &Config, keys: &[String]) -> Result<(), StoreError> {
    let channel = crate::reset::channel(&config.key_prefix);
    for message in crate::reset::messages(keys) {
        let _listeners: i64 = pool
            .next()
            .publish(channel.as_str(), message)
            .await
            .map_err(map_err)?;
    }
    Ok(())
}
