//! Admin tasks behind the `fleetlimit` command: inspect and reset a
//! caller's buckets, and sweep for keys left without an expiry.
//!
//! Every key the limiter writes carries an expiry (the scripts set it in the
//! same call). A key under the prefix with no expiry (`PTTL` -1) can only
//! come from older code or a hand-made `SET`; the sweep finds such keys on
//! every primary (one `SCAN` per node on a cluster) and gives each the TTL
//! its limit would have given it, with `PEXPIRE … NX` so a key that got an
//! expiry meanwhile is left alone.

use std::time::Duration;

use fred::clients::Pool;
use fred::interfaces::{ClientLike, ClusterInterface, KeysInterface};
use fred::types::config::{Options, Server};
use fred::types::{CustomCommand, ExpireOptions, Value};

use crate::algorithm::Rule;
use crate::config::Config;
use crate::key::redis_key_for;
use crate::policy::Limit;
use crate::store::redis::map_err;
use crate::store::{RedisStore, StoreError};

/// One bucket as stored in Redis.
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

/// What a sweep found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Keys under the prefix.
    pub scanned: u64,
    /// Keys without an expiry before the sweep.
    pub before: u64,
    /// Keys given an expiry.
    pub repaired: u64,
    /// Keys without an expiry after the sweep.
    pub after: u64,
    /// The keys that had none.
    pub keys: Vec<String>,
}

/// Connects to the configuration's Redis (standalone, Sentinel or Cluster).
pub async fn connect(config: &Config) -> Result<RedisStore, StoreError> {
    let r = config.redis.as_ref().ok_or_else(|| {
        StoreError::Unavailable(
            "the configuration has no [redis] section and no --redis URL".into(),
        )
    })?;
    // A refused password is reported as such, not as a timeout.
    let (store, started) = RedisStore::open(r, 1, Duration::from_secs(2)).await?;
    started?;
    Ok(store)
}

/// The buckets of the caller whose key value is `value`, for every limit
/// (or the one named).
pub async fn inspect(
    pool: &Pool,
    config: &Config,
    value: &str,
    limit: Option<&str>,
) -> Result<Vec<BucketInfo>, StoreError> {
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
        let raw: Option<String> = pool.get(&key).await.map_err(map_err)?;
        let pttl: i64 = pool.pttl(&key).await.map_err(map_err)?;
        let state = describe(&l.rule, raw.as_deref(), now_us);
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

/// Deletes the caller's buckets (a full bucket again); returns how many
/// keys existed.
pub async fn reset(
    pool: &Pool,
    config: &Config,
    value: &str,
    limit: Option<&str>,
) -> Result<u64, StoreError> {
    let mut n = 0;
    for (_, key) in keys_of(config, value, limit) {
        let deleted: i64 = pool.del(&key).await.map_err(map_err)?;
        n += deleted.max(0) as u64;
    }
    Ok(n)
}

/// Each limit (or the one named) with the key it uses for the caller whose
/// key value is `value`, built as the request path builds it.
fn keys_of<'a>(
    config: &'a Config,
    value: &'a str,
    limit: Option<&'a str>,
) -> impl Iterator<Item = (&'a Limit, String)> + 'a {
    config
        .limits
        .iter()
        .filter(move |l| limit.is_none_or(|n| *l.name == *n))
        .map(move |l| {
            let key = redis_key_for(
                &l.key,
                value,
                &config.client_ip,
                &config.key_prefix,
                &l.name,
            );
            (&**l, key)
        })
}

fn describe(rule: &Rule, raw: Option<&str>, now_us: f64) -> String {
    let Some(raw) = raw else {
        return "no key: a full bucket".into();
    };
    match rule {
        Rule::TokenBucket {
            capacity,
            refill_per_sec,
        } => match raw.trim().parse::<f64>() {
            Ok(tat) => {
                let per = 1e6 / refill_per_sec;
                let tokens = (now_us + capacity * per - tat.max(now_us)) / per;
                format!("{tokens:.2} of {capacity} tokens")
            }
            Err(_) => format!("unreadable token bucket: {raw:?}"),
        },
        Rule::FixedWindow { limit, .. } => format!("{raw} of {limit} used in this window"),
        Rule::SlidingWindow { limit, .. } => {
            let v: Vec<&str> = raw.split_whitespace().collect();
            match v.as_slice() {
                [idx, curr, prev] => {
                    format!("window {idx}: {curr} now, {prev} in the previous one, of {limit}")
                }
                _ => format!("unreadable sliding window: {raw:?}"),
            }
        }
    }
}

/// The TTL a key of this limit would get from the scripts, at most.
fn ttl_for(config: &Config, key: &str, default: Duration) -> Duration {
    // The heartbeat by its whole key: a limit may be named "fleet" too.
    if key == config.heartbeat_key() {
        return config.heartbeat.map_or(default, |h| 2 * h.dead_after);
    }
    let rest = key
        .strip_prefix(&*config.key_prefix)
        .and_then(|r| r.strip_prefix(':'));
    let name = rest.and_then(|r| r.split(':').next()).unwrap_or("");
    let Some(l) = config.limits.iter().find(|l| &*l.name == name) else {
        return default;
    };
    // The largest of the limit's plans, like the longest the script sets.
    std::iter::once(&l.rule)
        .chain(l.plans.values())
        .map(|r| match *r {
            Rule::TokenBucket {
                capacity,
                refill_per_sec,
            } => {
                Duration::from_secs_f64((capacity / refill_per_sec).min(1e9))
                    + Duration::from_secs(1)
            }
            Rule::FixedWindow { window, .. } => window,
            Rule::SlidingWindow { window, .. } => 2 * window,
        })
        .max()
        .unwrap_or(default)
}

/// Every key under the prefix, on every primary.
async fn scan_all(pool: &Pool, prefix: &str) -> Result<Vec<String>, StoreError> {
    let client = pool.next();
    let nodes: Vec<Option<Server>> = if client.is_clustered() {
        client
            .cached_cluster_state()
            .map(|s| s.unique_primary_nodes().into_iter().map(Some).collect())
            .unwrap_or_default()
    } else {
        vec![None]
    };
    let pattern = format!("{prefix}:*");
    let mut keys = Vec::new();
    for node in nodes {
        let opts = Options {
            cluster_node: node,
            timeout: Some(Duration::from_secs(5)),
            ..Options::default()
        };
        let mut cursor = "0".to_owned();
        // SCAN ends when the cursor comes back to 0; the bound is a guard.
        for _ in 0..1_000_000 {
            let cmd = CustomCommand::new_static("SCAN", None, false);
            let args: Vec<Value> = vec![
                cursor.as_str().into(),
                "MATCH".into(),
                pattern.as_str().into(),
                "COUNT".into(),
                1000.into(),
            ];
            let reply: Value = client
                .with_options(&opts)
                .custom(cmd, args)
                .await
                .map_err(map_err)?;
            let Value::Array(mut parts) = reply else {
                return Err(StoreError::Protocol("SCAN did not answer an array".into()));
            };
            let batch = parts.pop();
            cursor = parts
                .pop()
                .and_then(|c| c.as_string())
                .ok_or_else(|| StoreError::Protocol("SCAN without a cursor".into()))?;
            if let Some(Value::Array(batch)) = batch {
                keys.extend(batch.into_iter().filter_map(|k| k.as_string()));
            }
            if cursor == "0" {
                break;
            }
        }
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// Finds keys under the prefix without an expiry, gives each its limit's
/// TTL (or `default_ttl` for keys of no known limit) unless `dry_run`, and
/// counts again.
pub async fn sweep(
    pool: &Pool,
    config: &Config,
    dry_run: bool,
    default_ttl: Duration,
) -> Result<SweepReport, StoreError> {
    let mut report = SweepReport::default();
    let keys = scan_all(pool, &config.key_prefix).await?;
    report.scanned = keys.len() as u64;
    for key in &keys {
        let pttl: i64 = pool.pttl(key.as_str()).await.map_err(map_err)?;
        if pttl == -1 {
            report.keys.push(key.clone());
        }
    }
    report.before = report.keys.len() as u64;
    if dry_run {
        report.after = report.before;
        return Ok(report);
    }
    for key in &report.keys {
        let ttl = ttl_for(config, key, default_ttl);
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1);
        let set: i64 = pool
            .pexpire(key.as_str(), ms, Some(ExpireOptions::NX))
            .await
            .map_err(map_err)?;
        report.repaired += set.max(0) as u64;
    }
    for key in &report.keys {
        let pttl: i64 = pool.pttl(key.as_str()).await.map_err(map_err)?;
        report.after += u64::from(pttl == -1);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_tells_the_heartbeat_from_a_limit_named_fleet() {
        let config = Config::from_toml_str(
            r#"
[redis]
url = "redis://127.0.0.1:1"
key_prefix = "p"

[fleet]
discover = true
heartbeat = "1s"
dead_after = "5s"

[limits.fleet]
key = "header:x-api-key"
capacity = 100
refill = "1/s"

[default]
limits = ["fleet"]
"#,
        )
        .unwrap();
        let default = Duration::from_secs(7);
        // The heartbeat: twice its dead_after.
        let heartbeat = ttl_for(&config, "p:fleet:{instances}", default);
        assert_eq!(heartbeat, Duration::from_secs(10));
        // The limit named "fleet": a full refill (100 s) and a second.
        let limit = ttl_for(&config, "p:fleet:{h:abc}", default);
        assert_eq!(limit, Duration::from_secs(101));
        // Neither: the default.
        assert_eq!(ttl_for(&config, "p:other:{h:abc}", default), default);
    }
}
