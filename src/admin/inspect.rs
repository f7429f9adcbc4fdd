//! Inspect and reset one caller's buckets.

use fred::clients::Pool;
use fred::interfaces::{ClientLike, KeysInterface, PubsubInterface};
use fred::types::{CustomCommand, Value};

use super::{keys_of, Admin};
use crate::config::Config;
use crate::store::redis::script::map_err;
use crate::store::StoreError;

/// One bucket as stored in Redis, as [`Admin::inspect`] reads it.
///
/// ```no_run
/// # async fn f(cfg: fleetlimit::Config) -> Result<(), fleetlimit::StoreError> {
/// use fleetlimit::admin::Admin;
///
/// let admin = Admin::connect(&cfg).await?;
/// for b in admin.inspect("sk_live_42", None).await? {
///     // e.g. `per-key rl:per-key:{h:…} 3.2 of 10 tokens, full in 68 s`
///     println!("{} {} {} (pttl {} ms)", b.limit, b.key, b.state, b.pttl);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BucketInfo {
    /// The limit.
    pub limit: String,
    /// The Redis key.
    pub key: String,
    /// The raw value (`None`: no such key, i.e. a full bucket).
    pub value: Option<String>,
    /// Milliseconds to expiry (-1: none, -2: no key).
    pub pttl: i64,
    /// The value read for humans.
    pub state: String,
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
        let time: Vec<String> = pool
            .custom(
                CustomCommand::new_static("TIME", None, false),
                Vec::<Value>::new(),
            )
            .await
            .map_err(map_err)?;
        let now_us = match time.as_slice() {
            [s, us] => s.parse::<f64>().unwrap_or(0.0) * 1e6 + us.parse::<f64>().unwrap_or(0.0),
            _ => {
                return Err(StoreError::Protocol(
                    "TIME did not answer two numbers".into(),
                ))
            }
        };
        for (l, key) in keys_of(config, value, limit) {
            let raw = if l.rule.is_concurrency() {
                read_slots(pool, &key).await?
            } else {
                pool.get(&key).await.map_err(map_err)?
            };
            let pttl: i64 = pool.pttl(&key).await.map_err(map_err)?;
            let state = l.rule.describe_stored(raw.as_deref(), now_us);
            out.push(BucketInfo {
                limit: l.name.to_string(),
                key,
                value: raw,
                pttl,
                state,
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
    /// reset listener in `RateLimitLayer::builder(..).build()`); returns how
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

/// A concurrency limit's set of slots as `id deadline_µs` pairs (`None`: no
/// key); a key of another type is read as a string, for people to see.
async fn read_slots(pool: &Pool, key: &str) -> Result<Option<String>, StoreError> {
    let zrange = CustomCommand::new_static("ZRANGE", fred::types::ClusterHash::FirstKey, false);
    let args = vec![Value::from(key), 0.into(), (-1).into(), "WITHSCORES".into()];
    match pool.custom::<Vec<String>, Value>(zrange, args).await {
        Ok(pairs) if pairs.is_empty() => Ok(None),
        Ok(pairs) => Ok(Some(pairs.join(" "))),
        Err(_) => pool.get(key).await.map_err(map_err),
    }
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
