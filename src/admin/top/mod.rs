//! `top`: what the fleet is doing, one frame per refresh — the live
//! instances (the fleet heartbeat), per limit the sampled keys that are
//! exhausted or closest to it, and the refusals recorded per second.
//!
//! Every frame costs Redis a bounded amount of work: one `SCAN` page of at
//! most [`TopOptions::sample`] keys (continued where the last frame
//! stopped, so successive frames walk the whole keyspace), one `GET` per
//! key sampled or shown last time, one bounded read of the heartbeat, and
//! one `XRANGE … COUNT` per recording limit.

use std::fmt;
use std::pin::Pin;
use std::time::Duration;

use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::scan::{ScanResult, Scanner};
use fred::types::{ClusterHash, CustomCommand, Value};
use futures_core::Stream;

use super::Admin;
use super::time::redis_now_us;
use crate::algorithm::Stored;
use crate::config::Config;
use crate::key::StoreKey;
use crate::record::stream_key;
use crate::store::redis::reply::map_err;
use crate::store::{RedisStore, StoreError};

mod frame;

/// Most recorded decisions counted per limit and frame.
const MAX_RECORDS: usize = 10_000;
/// Most live instances listed (the others are counted).
const MAX_INSTANCES: usize = 20;

/// How `top` samples ([`Admin::top`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TopOptions {
    /// Keys scanned per frame at most (the `SCAN` page's `COUNT`).
    pub(crate) sample: usize,
    /// Keys shown per limit.
    pub(crate) rows: usize,
    /// Refusals per second are counted over this last stretch of the
    /// decision records.
    pub(crate) window: Duration,
}

impl Default for TopOptions {
    fn default() -> Self {
        Self {
            sample: 1000,
            rows: 5,
            window: Duration::from_secs(10),
        }
    }
}

type ScanStream = Pin<Box<dyn Stream<Item = Result<ScanResult, fred::error::Error>> + Send>>;

/// `top` between frames: where the scan stands, and the keys shown last
/// (read again at the next frame, so an exhausted key stays in view while
/// the scan moves on).
pub(crate) struct Top {
    store: RedisStore,
    config: Config,
    options: TopOptions,
    scan: Option<ScanStream>,
    /// The last page read: dropping it asks for the next one.
    page: Option<ScanResult>,
    shown: Vec<String>,
}

impl fmt::Debug for Top {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Top")
            .field("options", &self.options)
            .field("shown", &self.shown.len())
            .finish_non_exhaustive()
    }
}

/// One frame of `top`, printed by its `Display`; its `Serialize` is the
/// frame as `fleetlimit top --json` writes it (one JSON object a line),
/// every name escaped as [`printable`](crate::admin::printable) escapes it.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct TopFrame {
    #[serde(serialize_with = "super::shown::one")]
    prefix: String,
    now_ms: u64,
    fleet: Fleet,
    limits: Vec<LimitView>,
    scanned: usize,
    pass_done: bool,
    #[serde(rename = "window_ms", serialize_with = "super::shown::millis")]
    window: Duration,
}

#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Fleet {
    /// No discovery: the configured size.
    Configured(u32),
    Live {
        #[serde(serialize_with = "super::shown::one")]
        key: String,
        #[serde(rename = "dead_after_ms", serialize_with = "super::shown::millis")]
        dead_after: Duration,
        count: u64,
        /// Each live instance and ms since its last beat, the latest first.
        shown: Vec<Instance>,
    },
}

/// A live instance: its heartbeat member and ms since its last beat.
#[derive(Clone, Debug, serde::Serialize)]
struct Instance {
    #[serde(serialize_with = "super::shown::one")]
    id: String,
    ms_ago: u64,
}

/// A key in view: its log id, Redis key, what it leaves, the limit's
/// capacity, and on a limit with plans the most a plan would leave it.
#[derive(Clone, Debug, serde::Serialize)]
struct KeyView {
    #[serde(serialize_with = "super::shown::one")]
    id: String,
    #[serde(serialize_with = "super::shown::one")]
    key: String,
    remaining: f64,
    capacity: f64,
    on_plans: Option<f64>,
}

#[derive(Clone, Debug, serde::Serialize)]
struct LimitView {
    #[serde(serialize_with = "super::shown::one")]
    name: String,
    rule: String,
    sampled: usize,
    exhausted: usize,
    /// Keys in view whose state the limiter takes as absent.
    invalid: usize,
    /// Log id, Redis key, remaining, capacity: the least remaining first.
    /// On a limit with plans: under the base numbers, with the most any
    /// plan would leave (the key's plan is not known here).
    keys: Vec<KeyView>,
    /// Refused and all decisions recorded in the window (`None`: not
    /// recorded); `true` when the count stopped at its bound.
    recorded: Option<(u64, u64, bool)>,
    concurrency: bool,
}

impl Admin {
    /// A `top` of the fleet on this connection.
    #[must_use]
    pub(crate) fn top(&self, options: TopOptions) -> Top {
        Top {
            store: self.store.clone(),
            config: self.config.clone(),
            options,
            scan: None,
            page: None,
            shown: Vec::new(),
        }
    }
}

impl Top {
    /// Reads one frame.
    pub(crate) async fn frame(&mut self) -> Result<TopFrame, StoreError> {
        let pool = self.store.pool().clone();
        let now_us = redis_now_us(&pool).await?;
        let now_ms = (now_us / 1000.0) as u64;
        let fleet = self.fleet(now_ms).await?;
        let (sampled, scanned, pass_done) = self.sample().await?;
        // The keys shown last, read again, then the new ones.
        let mut keys = std::mem::take(&mut self.shown);
        for k in sampled {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let prefix = &self.config.key_prefix;
        let parsed: Vec<(usize, String, String)> = keys
            .into_iter()
            .filter_map(|k| {
                let sk = StoreKey::parse(prefix, &k)?;
                let at = self
                    .config
                    .limits
                    .iter()
                    .position(|l| *l.name == *sk.limit())?;
                let id = sk.log_id().of(&k).to_string();
                Some((at, id, k))
            })
            .collect();
        let values = read_values(&pool, parsed.iter().map(|(_, _, k)| k.as_str())).await?;
        let mut limits: Vec<LimitView> = self
            .config
            .limits
            .iter()
            .map(|l| LimitView {
                name: l.name.to_string(),
                rule: l.rule.describe(),
                sampled: 0,
                exhausted: 0,
                invalid: 0,
                keys: Vec::new(),
                recorded: None,
                concurrency: l.rule.is_concurrency(),
            })
            .collect();
        for ((at, id, key), (raw, pttl)) in parsed.into_iter().zip(values) {
            // No key any more: a full bucket, nothing to watch.
            if pttl == -2 {
                continue;
            }
            let limit = &self.config.limits[at];
            let rule = limit.rule;
            if rule.is_concurrency() {
                continue;
            }
            let view = &mut limits[at];
            // By the scripts' rules: a value they do not accept (or a key
            // of another type, which GET cannot read) is a full bucket.
            let left = match rule.read_stored(raw.as_deref(), pttl, now_us) {
                Stored::Valid { remaining, .. } if raw.is_some() => remaining,
                _ => {
                    view.sampled += 1;
                    view.invalid += 1;
                    continue;
                }
            };
            // A caller on a plan is counted under the plan's numbers: not
            // exhausted while any plan would leave it a request.
            let on_plans = (!limit.plans.is_empty()).then(|| {
                limit
                    .plans
                    .values()
                    .map(|r| {
                        r.read_stored(raw.as_deref(), pttl, now_us)
                            .remaining(r.capacity())
                    })
                    .fold(left, f64::max)
            });
            view.sampled += 1;
            if on_plans.unwrap_or(left) < 1.0 {
                view.exhausted += 1;
            }
            view.keys.push(KeyView {
                id,
                key,
                remaining: left,
                capacity: rule.capacity(),
                on_plans,
            });
        }
        for view in &mut limits {
            let most = |k: &KeyView| k.on_plans.unwrap_or(k.remaining);
            view.keys
                .sort_by(|a, b| most(a).total_cmp(&most(b)).then_with(|| a.id.cmp(&b.id)));
            view.keys.truncate(self.options.rows);
            self.shown.extend(view.keys.iter().map(|k| k.key.clone()));
        }
        for (view, l) in limits.iter_mut().zip(&self.config.limits) {
            if l.record.is_some() {
                let stream = stream_key(prefix, &l.name);
                let from = now_ms.saturating_sub(self.options.window.as_millis() as u64);
                view.recorded = Some(count_records(&pool, &stream, from).await?);
            }
        }
        Ok(TopFrame {
            prefix: prefix.to_string(),
            now_ms,
            fleet,
            limits,
            scanned,
            pass_done,
            window: self.options.window,
        })
    }

    /// The live instances, from the heartbeat's sorted set (scored by
    /// Redis time in ms).
    async fn fleet(&self, now_ms: u64) -> Result<Fleet, StoreError> {
        let Some(hb) = self.config.heartbeat else {
            return Ok(Fleet::Configured(self.config.fleet_size));
        };
        let key = self.config.heartbeat_key();
        let pool = self.store.pool();
        let since = now_ms.saturating_sub(hb.dead_after.as_millis() as u64);
        let zcount = CustomCommand::new_static("ZCOUNT", ClusterHash::FirstKey, false);
        let args: Vec<Value> = vec![key.as_str().into(), (since as i64).into(), "+inf".into()];
        let count: u64 = pool.custom(zcount, args).await.map_err(map_err)?;
        let range = CustomCommand::new_static("ZRANGE", ClusterHash::FirstKey, false);
        let args: Vec<Value> = vec![
            key.as_str().into(),
            "+inf".into(),
            (since as i64).into(),
            "BYSCORE".into(),
            "REV".into(),
            "LIMIT".into(),
            0.into(),
            (MAX_INSTANCES as i64).into(),
            "WITHSCORES".into(),
        ];
        let pairs: Vec<String> = pool.custom(range, args).await.map_err(map_err)?;
        let shown = pairs
            .chunks(2)
            .filter_map(|p| {
                let at: f64 = p.get(1)?.parse().ok()?;
                Some(Instance {
                    id: p[0].clone(),
                    ms_ago: now_ms.saturating_sub(at as u64),
                })
            })
            .collect();
        Ok(Fleet::Live {
            key,
            dead_after: hb.dead_after,
            count,
            shown,
        })
    }

    /// One `SCAN` page of at most `sample` keys under the prefix, where the
    /// last frame stopped; the keys, how many, and whether the pass over
    /// the keyspace ended (the next frame starts another).
    async fn sample(&mut self) -> Result<(Vec<String>, usize, bool), StoreError> {
        // Asks for the page after the one held (nothing if it was the last).
        drop(self.page.take());
        let count = u32::try_from(self.options.sample.max(1)).unwrap_or(u32::MAX);
        let stream = self.scan.get_or_insert_with(|| {
            let client = self.store.pool().next();
            let pattern = format!("{}:*", self.config.key_prefix);
            if client.is_clustered() {
                Box::pin(client.scan_cluster(pattern, Some(count), None))
            } else {
                Box::pin(client.scan(pattern, Some(count), None))
            }
        });
        match std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
            None => {
                self.scan = None;
                Ok((Vec::new(), 0, true))
            }
            Some(Err(e)) => {
                self.scan = None;
                Err(map_err(e))
            }
            Some(Ok(mut page)) => {
                let keys: Vec<String> = page
                    .take_results()
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|k| k.into_string())
                    .collect();
                // A cluster's stream goes on with the other primaries'
                // pages after one primary's last.
                let more = page.has_more();
                if more {
                    self.page = Some(page);
                }
                let done = !more && !self.store.pool().is_clustered();
                if done {
                    self.scan = None;
                }
                let n = keys.len();
                Ok((keys, n, done))
            }
        }
    }
}

/// Each key's value (`None`: no key, or not a string — a key of another
/// application, or another type) and its PTTL (-2: no key), in one
/// pipeline.
async fn read_values<'a>(
    pool: &fred::clients::Pool,
    keys: impl Iterator<Item = &'a str>,
) -> Result<Vec<(Option<Vec<u8>>, i64)>, StoreError> {
    let pipe = pool.next().pipeline();
    let mut n = 0;
    for k in keys {
        let () = pipe.get(k).await.map_err(map_err)?;
        let () = pipe.pttl(k).await.map_err(map_err)?;
        n += 1;
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    let answers = pipe.try_all::<Value>().await;
    let mut it = answers.into_iter();
    let mut out = Vec::with_capacity(n);
    while let (Some(value), Some(pttl)) = (it.next(), it.next()) {
        // Bytes: a token bucket's TAT is 8 of them, not text.
        let value = value
            .ok()
            .and_then(|v| v.convert::<Option<Vec<u8>>>().ok().flatten());
        let pttl = pttl.ok().and_then(|v| v.as_i64()).unwrap_or(-2);
        out.push((value, pttl));
    }
    Ok(out)
}

/// Refused and all decisions in `stream` since `from_ms` (at most
/// [`MAX_RECORDS`]; `true` when the count stopped there).
async fn count_records(
    pool: &fred::clients::Pool,
    stream: &str,
    from_ms: u64,
) -> Result<(u64, u64, bool), StoreError> {
    // Newest first: past the bound, what is counted is the window's latest
    // decisions, not its oldest.
    let xrange = CustomCommand::new_static("XREVRANGE", ClusterHash::FirstKey, false);
    let args: Vec<Value> = vec![
        stream.into(),
        "+".into(),
        format!("{from_ms}-0").into(),
        "COUNT".into(),
        (MAX_RECORDS as i64).into(),
    ];
    let entries = match pool.custom::<Value, Value>(xrange, args).await {
        Ok(Value::Array(a)) => a,
        Ok(_) => Vec::new(),
        // Not a stream: nothing recorded there that top can read.
        Err(e) if e.details().starts_with("WRONGTYPE") => Vec::new(),
        Err(e) => return Err(map_err(e)),
    };
    let total = entries.len() as u64;
    let refused = entries
        .into_iter()
        .filter_map(super::explain::entry_parts)
        .filter(|(_, fields)| fields.iter().any(|(k, v)| k == "allowed" && v == "0"))
        .count() as u64;
    Ok((refused, total, total as usize >= MAX_RECORDS))
}
