//! Admin tasks behind the `fleetlimit` command: inspect and reset a
//! caller's buckets, and sweep for keys left without an expiry.
//!
//! Every key the limiter writes carries an expiry (the scripts set it in the
//! same call). A key under the prefix with no expiry (`PTTL` -1) can only
//! come from older code or a hand-made `SET`; the sweep finds such keys on
//! every primary (one `SCAN` per node on a cluster) and gives each the TTL
//! its limit would have given it, with `PEXPIRE … NX` so a key that got an
//! expiry meanwhile is left alone.
//!
//! Other applications may share the prefix: the sweep touches only keys
//! that are fleetlimit's by name (`<prefix>:<limit>:{<kind>:<value>}` or
//! `{<kind>#<digest>}` for a configured limit, or the fleet heartbeat) *and*
//! by the Redis type fleetlimit writes there (a string for every algorithm,
//! a sorted set for the heartbeat). Everything else is reported as skipped
//! and never written to.

use std::time::Duration;

use fred::clients::Pool;
use fred::interfaces::{
    ClientLike, ClusterInterface, KeysInterface, LuaInterface, PubsubInterface,
};
use fred::types::config::{Options, Server};
use fred::types::{ClusterHash, CustomCommand, Value};

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
    /// fleetlimit's keys without an expiry before the sweep.
    pub before: u64,
    /// Keys given an expiry.
    pub repaired: u64,
    /// Of those keys, how many still had no expiry after the sweep.
    pub after: u64,
    /// fleetlimit's keys that had no expiry.
    pub keys: Vec<String>,
    /// Keys under the prefix that the sweep left alone because they are not
    /// fleetlimit's (by name or by type), or belong to a limit the
    /// configuration does not define.
    pub skipped: Vec<Skipped>,
}

/// A key under the prefix that a sweep did not touch, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The Redis key.
    pub key: String,
    /// Why it was left alone.
    pub why: String,
}

/// How a sweep repairs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepOptions {
    /// Count only; change nothing.
    pub dry_run: bool,
    /// The TTL of keys whose limit the configuration does not define (with
    /// `include_unknown_limits`), and of the heartbeat when fleet discovery
    /// is off. Must be longer than zero.
    pub default_ttl: Duration,
    /// Also repair keys of fleetlimit's shape and type whose limit name the
    /// configuration does not define (a limit renamed or removed). Off: they
    /// are skipped, since the name alone does not prove they are ours.
    pub include_unknown_limits: bool,
}

impl Default for SweepOptions {
    fn default() -> Self {
        Self {
            dry_run: false,
            default_ttl: Duration::from_secs(3600),
            include_unknown_limits: false,
        }
    }
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
    check_target(config, value, limit).map_err(StoreError::Protocol)?;
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
pub async fn reset(
    pool: &Pool,
    config: &Config,
    value: &str,
    limit: Option<&str>,
) -> Result<u64, StoreError> {
    check_target(config, value, limit).map_err(StoreError::Protocol)?;
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

/// Checks what an admin command is asked about before Redis is: a key value
/// that is not empty (a request with an empty key is never counted) and, if
/// a limit is named, one the configuration defines. The error says what is
/// wrong, for the person typing the command.
pub fn check_target(config: &Config, value: &str, limit: Option<&str>) -> Result<(), String> {
    if value.is_empty() {
        return Err(
            "the key value is empty; give the caller's API key, account, IP \
             or ip|account (a request with an empty key is never counted)"
                .into(),
        );
    }
    if let Some(name) = limit {
        if !config.limits.iter().any(|l| *l.name == *name) {
            let known: Vec<&str> = config.limits.iter().map(|l| &*l.name).collect();
            return Err(format!(
                "unknown limit {name:?}; the configuration defines: {}",
                known.join(", ")
            ));
        }
    }
    Ok(())
}

/// The Redis key limit `limit` uses for the caller whose key value is
/// `value` (an API key, an account, an IP, `ip|account`), as requests build
/// it: API keys as their keyed digest. `None` when the configuration has
/// no such limit.
#[must_use]
pub fn redis_key(config: &Config, limit: &str, value: &str) -> Option<String> {
    keys_of(config, value, Some(limit)).next().map(|(_, k)| k)
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
                &config.key_secret,
            );
            (&**l, key)
        })
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
        .map(Rule::max_ttl)
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

/// Whose a key under the prefix is, by its name alone.
#[derive(Debug, PartialEq, Eq)]
enum Shape<'a> {
    /// The fleet heartbeat (a sorted set).
    Heartbeat,
    /// A bucket of a configured limit.
    Limit,
    /// A bucket's name, of a limit the configuration does not define.
    UnknownLimit(&'a str),
}

/// `<prefix>:<limit>:{<tag>}` as `KeyMaterial::redis_key` writes it (raw or
/// hashed tags, the raw header values of older versions included), or the
/// heartbeat; `None` for any other name.
fn shape<'a>(config: &'a Config, key: &'a str) -> Option<Shape<'a>> {
    if key == config.heartbeat_key() {
        return Some(Shape::Heartbeat);
    }
    let rest = key.strip_prefix(&*config.key_prefix)?.strip_prefix(':')?;
    let (name, tag) = rest.split_once(':')?;
    let name_ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !name_ok || !is_tag(tag) {
        return None;
    }
    Some(if config.limits.iter().any(|l| &*l.name == name) {
        Shape::Limit
    } else {
        Shape::UnknownLimit(name)
    })
}

/// `{<kind>:<1 to 64 printable ASCII bytes but braces>}` or
/// `{<kind>#<32 lowercase hex>}`, for one of the key kinds.
fn is_tag(tag: &str) -> bool {
    let Some(inner) = tag.strip_prefix('{').and_then(|t| t.strip_suffix('}')) else {
        return false;
    };
    let Some(split) = inner.find([':', '#']) else {
        return false;
    };
    let (kind, value) = (&inner[..split], &inner[split + 1..]);
    if !matches!(kind, "g" | "ip" | "h" | "a" | "ia") {
        return false;
    }
    if inner.as_bytes()[split] == b'#' {
        value.len() == 32
            && value
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    } else {
        (1..=64).contains(&value.len())
            && value
                .bytes()
                .all(|b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}')
    }
}

/// The Redis type fleetlimit writes under a key of this shape: every
/// algorithm keeps one string (lua/), the heartbeat is a sorted set.
fn expected_type(shape: &Shape<'_>) -> &'static str {
    match shape {
        Shape::Heartbeat => "zset",
        Shape::Limit | Shape::UnknownLimit(_) => "string",
    }
}

/// Gives a key an expiry only if it still has the type fleetlimit writes
/// there, in one atomic step (nothing can change the key in between).
const REPAIR: &str = "\
if redis.call('TYPE', KEYS[1]).ok ~= ARGV[1] then return -1 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2], 'NX')";

/// Finds fleetlimit's keys under the prefix without an expiry, gives each
/// its limit's TTL unless `dry_run`, and counts again. Keys that are not
/// fleetlimit's by name and type are left alone and reported as skipped.
pub async fn sweep(
    pool: &Pool,
    config: &Config,
    options: &SweepOptions,
) -> Result<SweepReport, StoreError> {
    if options.default_ttl.is_zero() {
        return Err(StoreError::Protocol(
            "the default TTL must be longer than zero".into(),
        ));
    }
    let mut report = SweepReport::default();
    let keys = scan_all(pool, &config.key_prefix).await?;
    report.scanned = keys.len() as u64;
    let mut repair = Vec::new();
    for key in &keys {
        let skip = |why: String| Skipped {
            key: key.clone(),
            why,
        };
        let Some(shape) = shape(config, key) else {
            report
                .skipped
                .push(skip("not a fleetlimit key name".into()));
            continue;
        };
        if let (Shape::UnknownLimit(name), false) = (&shape, options.include_unknown_limits) {
            report.skipped.push(skip(format!(
                "limit {name:?} is not in the configuration; --include-unknown-limits repairs it"
            )));
            continue;
        }
        let want = expected_type(&shape);
        let found: String = pool
            .custom(
                CustomCommand::new_static("TYPE", ClusterHash::FirstKey, false),
                vec![key.as_str()],
            )
            .await
            .map_err(map_err)?;
        if found == "none" {
            // Expired since the scan: nothing to repair.
            continue;
        }
        if found != want {
            report
                .skipped
                .push(skip(format!("a {found}, where fleetlimit writes a {want}")));
            continue;
        }
        let pttl: i64 = pool.pttl(key.as_str()).await.map_err(map_err)?;
        if pttl == -1 {
            report.keys.push(key.clone());
            repair.push(want);
        }
    }
    report.before = report.keys.len() as u64;
    if options.dry_run {
        report.after = report.before;
        return Ok(report);
    }
    for (key, want) in report.keys.iter().zip(repair) {
        let ttl = ttl_for(config, key, options.default_ttl);
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1);
        let set: i64 = pool
            .eval(
                REPAIR,
                vec![key.as_str()],
                vec![Value::from(want), Value::from(ms)],
            )
            .await
            .map_err(map_err)?;
        report.repaired += u64::from(set == 1);
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

    #[test]
    fn only_names_the_limiter_writes_are_its_own() {
        let config = Config::from_toml_str(
            r#"
[redis]
key_prefix = "rl"

[fleet]
discover = true

[limits.per-key]
key = "header:x-api-key"
capacity = 10
refill = "1/s"
"#,
        )
        .unwrap();
        let written = redis_key(&config, "per-key", "sk_live_X").unwrap();
        assert_eq!(shape(&config, &written), Some(Shape::Limit));
        for ours in [
            "rl:per-key:{h:older-raw-api-key}",
            "rl:per-key:{ip:2001:db8::}",
            "rl:per-key:{ia:1.2.3.4|acct}",
            "rl:per-key:{g:all}",
            "rl:per-key:{a#0123456789abcdef0123456789abcdef}",
        ] {
            assert_eq!(shape(&config, ours), Some(Shape::Limit), "{ours}");
        }
        assert_eq!(
            shape(&config, "rl:fleet:{instances}"),
            Some(Shape::Heartbeat)
        );
        assert_eq!(
            shape(&config, "rl:gone:{a:bob}"),
            Some(Shape::UnknownLimit("gone"))
        );
        for foreign in [
            "rl:users",
            "rl:session:42",
            "rl:per-key:index",
            "rl:per-key:{index}",
            "rl:per-key:{x:abc}",
            "rl:per-key:{a:}",
            "rl:per-key:{a#abc}",
            "rl:per-key:{a#0123456789ABCDEF0123456789ABCDEF}",
            "rl:per-key:{a:b}:more",
            "rl:per-key:x{a:b}",
            "rl:per key:{a:b}",
            "rlx:per-key:{a:b}",
            "rl::{a:b}",
        ] {
            assert_eq!(shape(&config, foreign), None, "{foreign}");
        }
    }

    #[test]
    fn admin_targets_are_checked_before_redis() {
        let config = Config::from_toml_str(
            r#"
[limits.b]
key = "ip"
capacity = 1
refill = "1/s"

[limits.a]
key = "ip"
capacity = 1
refill = "1/s"
"#,
        )
        .unwrap();
        assert!(check_target(&config, "1.2.3.4", Some("a")).is_ok());
        assert!(check_target(&config, "1.2.3.4", None).is_ok());
        let e = check_target(&config, "1.2.3.4", Some("nope")).unwrap_err();
        assert_eq!(e, "unknown limit \"nope\"; the configuration defines: a, b");
        assert!(check_target(&config, "", None).is_err());
    }
}
