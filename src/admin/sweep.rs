//! The sweep: fleetlimit's keys left without an expiry, and only those.

use std::pin::Pin;
use std::time::Duration;

use fred::clients::Pool;
use fred::interfaces::{ClientLike, KeysInterface, LuaInterface};
use fred::types::{ClusterHash, CustomCommand, Key, Value};
use futures_core::Stream;

use super::Admin;
use crate::algorithm::Rule;
use crate::config::Config;
use crate::key::StoreKey;
use crate::record::stream_key;
use crate::route::RecordConfig;
use crate::store::StoreError;
use crate::store::redis::reply::map_err;

/// What a sweep found and did ([`Admin::sweep`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct SweepReport {
    /// Keys under the prefix.
    pub(crate) scanned: u64,
    /// fleetlimit's keys without an expiry before the sweep.
    pub(crate) before: u64,
    /// Keys given an expiry.
    pub(crate) repaired: u64,
    /// Of those keys, how many still had no expiry after the sweep.
    pub(crate) after: u64,
    /// fleetlimit's keys that had no expiry.
    #[serde(serialize_with = "super::shown::all")]
    pub(crate) keys: Vec<String>,
    /// Of those, the keys whose value the limiter takes as absent (not a
    /// state its scripts accept: it overwrites them at their next check);
    /// the sweep gives them an expiry all the same.
    #[serde(serialize_with = "super::shown::all")]
    pub(crate) invalid: Vec<String>,
    /// Keys under the prefix that the sweep left alone because they are not
    /// fleetlimit's (by name or by type), or belong to a limit the
    /// configuration does not define.
    pub(crate) skipped: Vec<Skipped>,
}

/// A key under the prefix that a sweep did not touch, and why (see
/// [`SweepReport`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Skipped {
    /// The Redis key.
    #[serde(serialize_with = "super::shown::one")]
    pub(crate) key: String,
    /// Why it was left alone.
    #[serde(serialize_with = "super::shown::one")]
    pub(crate) why: String,
}

/// How a sweep repairs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SweepOptions {
    /// Count only; change nothing.
    pub(crate) dry_run: bool,
    /// The TTL of keys whose limit the configuration does not define (with
    /// `include_unknown_limits`), and of the heartbeat when fleet discovery
    /// is off. At least a second (a shorter expiry deletes rather than
    /// repairs).
    pub(crate) default_ttl: Duration,
    /// Also repair keys of fleetlimit's shape and type whose limit name the
    /// configuration does not define (a limit renamed or removed). Off: they
    /// are skipped, since the name alone does not prove they are ours.
    pub(crate) include_unknown_limits: bool,
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

/// The TTL a key of this limit would get from the scripts, at most.
fn ttl_for(config: &Config, key: &str, default: Duration) -> Duration {
    // The heartbeat by its whole key: a limit may be named "fleet" too.
    if key == config.heartbeat_key() {
        return config.heartbeat.map_or(default, |h| 2 * h.dead_after);
    }
    if let Some(r) = record_of(config, key) {
        return r.max_age;
    }
    let key = StoreKey::parse(&config.key_prefix, key);
    let limit = key.and_then(|k| config.limits.iter().find(|l| *l.name == *k.limit()));
    let Some(l) = limit else {
        return default;
    };
    // The largest of the limit's plans, like the longest the script sets.
    std::iter::once(&l.rule)
        .chain(l.plans.values())
        .map(Rule::max_ttl)
        .max()
        .unwrap_or(default)
}

/// The rule of the configured limit whose bucket `key` is.
fn limit_rule(config: &Config, key: &str) -> Option<Rule> {
    let key = StoreKey::parse(&config.key_prefix, key)?;
    config
        .limits
        .iter()
        .find(|l| *l.name == *key.limit())
        .map(|l| l.rule)
}

/// Every key under the prefix, on every primary: fred's scan streams, each
/// page of `SCAN` bounded by the admin pool's command timeout.
async fn scan_all(pool: &Pool, prefix: &str) -> Result<Vec<String>, StoreError> {
    let client = pool.next();
    let pattern = format!("{prefix}:*");
    let mut stream: Pin<Box<dyn Stream<Item = Result<Key, fred::error::Error>> + Send>> =
        if client.is_clustered() {
            Box::pin(client.scan_cluster_buffered(pattern, Some(1000), None))
        } else {
            Box::pin(client.scan_buffered(pattern, Some(1000), None))
        };
    let mut keys = Vec::new();
    while let Some(key) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
        if let Some(k) = key.map_err(map_err)?.into_string() {
            keys.push(k);
        }
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// The record settings of the recording limit whose decision stream `key` is.
fn record_of(config: &Config, key: &str) -> Option<RecordConfig> {
    config.limits.iter().find_map(|l| {
        l.record
            .filter(|_| key == stream_key(&config.key_prefix, &l.name))
    })
}

/// Whose a key under the prefix is, by its name alone.
#[derive(Debug, PartialEq, Eq)]
enum Shape {
    /// The fleet heartbeat (a sorted set).
    Heartbeat,
    /// A recording limit's decision stream.
    Record,
    /// A bucket of a configured limit, and the Redis type its algorithm
    /// writes.
    Limit(&'static str),
    /// A bucket's name, of a limit the configuration does not define.
    UnknownLimit(String),
}

/// The heartbeat, or a bucket's key as [`StoreKey::parse`] reads it; `None`
/// for any other name.
fn shape(config: &Config, key: &str) -> Option<Shape> {
    if key == config.heartbeat_key() {
        return Some(Shape::Heartbeat);
    }
    if record_of(config, key).is_some() {
        return Some(Shape::Record);
    }
    let name = StoreKey::parse(&config.key_prefix, key)?.limit().to_owned();
    Some(match config.limits.iter().find(|l| *l.name == *name) {
        Some(l) if l.rule.is_concurrency() => Shape::Limit("zset"),
        Some(_) => Shape::Limit("string"),
        None => Shape::UnknownLimit(name),
    })
}

/// The Redis type fleetlimit writes under a key of this shape (`found`:
/// the key's type now): a concurrency limit and the heartbeat keep a
/// sorted set, every other algorithm one string (lua/). A limit no longer
/// configured may have been either.
fn expected_type(shape: &Shape, found: &str) -> &'static str {
    match shape {
        Shape::Heartbeat => "zset",
        Shape::Record => "stream",
        Shape::Limit(t) => t,
        Shape::UnknownLimit(_) if found == "zset" => "zset",
        Shape::UnknownLimit(_) => "string",
    }
}

/// Gives a key an expiry only if it still has the type fleetlimit writes
/// there, in one atomic step (nothing can change the key in between).
const REPAIR: &str = "\
if redis.call('TYPE', KEYS[1]).ok ~= ARGV[1] then return -1 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2], 'NX')";

impl Admin {
    /// Finds fleetlimit's keys under the prefix without an expiry, gives each
    /// its limit's TTL unless `dry_run`, and counts again. Keys that are not
    /// fleetlimit's by name and type are left alone and reported as skipped.
    pub(crate) async fn sweep(&self, options: &SweepOptions) -> Result<SweepReport, StoreError> {
        let (pool, config) = (self.store.pool(), &self.config);
        if options.default_ttl < Duration::from_secs(1) {
            // Shorter, the "repair" deletes the keys it gives an expiry.
            return Err(StoreError::Protocol(
                "the default TTL must be at least 1s".into(),
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
            if *key == config.shed_fleet_key() {
                // An operator's, honoured even without an expiry (see
                // `fleetlimit shed`): not the sweep's to end.
                report.skipped.push(skip(
                    "the fleet-wide shedding signal (set by an operator; `fleetlimit shed` gives it an expiry)"
                        .into(),
                ));
                continue;
            }
            let Some(shape) = shape(config, key) else {
                report
                    .skipped
                    .push(skip("not a fleetlimit key name".into()));
                continue;
            };
            if let (Shape::UnknownLimit(name), false) = (&shape, options.include_unknown_limits) {
                report.skipped.push(skip(format!(
                    "limit \"{}\" is not in the configuration; --include-unknown-limits repairs it",
                    super::printable(name)
                )));
                continue;
            }
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
            let want = expected_type(&shape, &found);
            if found != want {
                report.skipped.push(skip(format!(
                    "a {}, where fleetlimit writes a {want}",
                    super::printable(&found)
                )));
                continue;
            }
            let pttl: i64 = pool.pttl(key.as_str()).await.map_err(map_err)?;
            if pttl == -1 {
                if let (Shape::Limit("string"), Some(rule)) = (&shape, limit_rule(config, key)) {
                    let raw: Option<Vec<u8>> = pool.get(key.as_str()).await.map_err(map_err)?;
                    let now_us = super::time::redis_now_us(pool).await?;
                    if rule.read_stored(raw.as_deref(), -1, now_us)
                        == crate::algorithm::Stored::Invalid
                    {
                        report.invalid.push(key.clone());
                    }
                }
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
        // The limit named "fleet": a full refill (100 s) and two seconds.
        let limit = ttl_for(&config, "p:fleet:{h:abc}", default);
        assert_eq!(limit, Duration::from_secs(102));
        // Neither: the default.
        assert_eq!(ttl_for(&config, "p:other:{h:abc}", default), default);
    }

    #[test]
    fn the_sweep_knows_decision_streams() {
        let config = Config::from_toml_str(
            r#"
[limits.api]
key = "ip"
capacity = 5
refill = "1/s"

[limits.api.record]
max_age = "2h"

[limits.quiet]
key = "ip"
capacity = 5
refill = "1/s"
"#,
        )
        .unwrap();
        let default = Duration::from_secs(7);
        assert_eq!(shape(&config, "rl:record:{api}"), Some(Shape::Record));
        assert_eq!(expected_type(&Shape::Record, "stream"), "stream");
        assert_eq!(
            ttl_for(&config, "rl:record:{api}", default),
            Duration::from_secs(7200)
        );
        // A limit that does not record owns no stream.
        assert_eq!(shape(&config, "rl:record:{quiet}"), None);
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
        let written = Admin::redis_key(&config, "per-key", "sk_live_X").unwrap();
        assert_eq!(shape(&config, &written), Some(Shape::Limit("string")));
        for ours in [
            "rl:per-key:{h:older-raw-api-key}",
            "rl:per-key:{ip:2001:db8::}",
            "rl:per-key:{ia:1.2.3.4|acct}",
            "rl:per-key:{g:all}",
            "rl:per-key:{a#0123456789abcdef0123456789abcdef}",
        ] {
            assert_eq!(shape(&config, ours), Some(Shape::Limit("string")), "{ours}");
        }
        assert_eq!(
            shape(&config, "rl:fleet:{instances}"),
            Some(Shape::Heartbeat)
        );
        assert_eq!(
            shape(&config, "rl:gone:{a:bob}"),
            Some(Shape::UnknownLimit("gone".into()))
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
}
