//! `explain`: one caller's contract, its bucket now, and its recorded
//! decisions over a time range, in words a support engineer can paste.

use std::time::Duration;

use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::{ClusterHash, CustomCommand, Value};

mod report;
mod words;

use self::report::{Explanation, RecordedDecision, RegionShare};
use self::words::{contract, num, state};
use super::time::parse_time;
use super::{Admin, keys_of, printable};
use crate::algorithm::{INVALID_STATE, Rule, Stored};
use crate::key::StoreKey;
use crate::record::stream_key;
use crate::store::StoreError;
use crate::store::redis::reply::map_err;

/// Entries read per `XRANGE` call.
const PAGE: usize = 1000;
/// Entries read at most: the longest stream a limit may keep.
const MAX_SCANNED: usize = 1_000_000;

/// The time range `explain` reads, on Redis's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimeRange {
    /// The last this long, until now.
    Since(Duration),
    /// Between two times, in milliseconds since the Unix epoch.
    Between {
        /// From (inclusive).
        from_ms: u64,
        /// To (inclusive).
        to_ms: u64,
    },
}

impl TimeRange {
    /// `--from T --to T`, each an RFC 3339 time such as
    /// `2026-12-01T04:31:00Z` or `2026-12-01T05:31:00.250+01:00`.
    pub(crate) fn between(from: &str, to: &str) -> Result<Self, String> {
        let from_ms = parse_time(from).map_err(|e| format!("--from {from:?}: {e}"))?;
        let to_ms = parse_time(to).map_err(|e| format!("--to {to:?}: {e}"))?;
        if from_ms > to_ms {
            return Err(format!("--from {from:?} is after --to {to:?}"));
        }
        Ok(Self::Between { from_ms, to_ms })
    }
}

impl Admin {
    /// Checks `explain`'s limit before Redis is asked (an unknown limit is
    /// a usage error).
    pub(crate) fn check_explain(
        config: &crate::Config,
        value: &str,
        limit: &str,
    ) -> Result<(), String> {
        Admin::check_target(config, value, Some(limit))
    }

    /// `limit`'s contract for the caller whose key value is `value` (the
    /// raw API key, account or IP, digested as the layer does), its bucket
    /// now and its recorded decisions in `range`.
    pub(crate) async fn explain(
        &self,
        value: &str,
        limit: &str,
        range: TimeRange,
    ) -> Result<Explanation, StoreError> {
        let (pool, config) = (self.store.pool(), &self.config);
        Admin::check_explain(config, value, limit).map_err(StoreError::Protocol)?;
        let Some((l, key)) = keys_of(config, value, Some(limit)).next() else {
            return Err(StoreError::Protocol(format!("no limit named {limit:?}")));
        };
        let key_id = StoreKey::parse(&config.key_prefix, &key)
            .map(|k| k.log_id().of(&key).to_string())
            .unwrap_or_default();
        let now_us = super::time::redis_now_us(pool).await?;
        let now_ms = (now_us / 1000.0) as u64;
        let (from_ms, to_ms) = match range {
            TimeRange::Since(d) => (now_ms.saturating_sub(d.as_millis() as u64), now_ms),
            TimeRange::Between { from_ms, to_ms } => (from_ms, to_ms),
        };
        let stream = stream_key(&config.key_prefix, &l.name);
        let decisions = read_decisions(pool, &stream, &key_id, from_ms, to_ms).await?;
        let plan = decisions
            .iter()
            .rev()
            .find_map(|d| d.plan.clone())
            .or_else(|| config.plan_assignments.0.get(value).map(|p| p.to_string()));
        let policy = l.rule_for(plan.as_deref());
        // A global limit's bucket here is this region's share of it.
        let share = match (
            super::quota::share(pool, config, l, &key).await?,
            &config.regions,
        ) {
            (Some(mut held), Some(r)) => {
                held.flights = super::quota::flights(pool, config, l, &key, now_ms).await?;
                Some((r, held))
            }
            _ => None,
        };
        let rule = share
            .as_ref()
            .map_or(policy, |(_, held)| policy.quota(held.ppm));
        let (raw, pttl): (Option<Vec<u8>>, i64) = if rule.is_concurrency() {
            (None, -2)
        } else {
            let pttl: i64 = pool.pttl(&key).await.map_err(map_err)?;
            // A key of another type: GET fails where the scripts' MGET
            // reads nothing; either way the limiter sees no state.
            match pool.get::<Option<Vec<u8>>, _>(&key).await {
                Ok(raw) => (raw, pttl),
                Err(e) if e.details().starts_with("WRONGTYPE") => (None, pttl),
                Err(e) => return Err(map_err(e)),
            }
        };
        let (global, state_text) = match share {
            Some((r, held)) => {
                let regions = r.names.iter().map(|n| n.to_string()).collect();
                let g = region_share(regions, held, &rule, &raw, pttl, now_us);
                (Some(g.0), g.1)
            }
            None => (None, state(&rule, raw.as_deref(), pttl, now_us)),
        };
        Ok(Explanation {
            limit: l.name.to_string(),
            key_id,
            contract: contract(&policy),
            state: state_text,
            scope: if global.is_some() { "global" } else { "region" },
            global,
            plan,
            recording: l.record.is_some(),
            from_ms,
            to_ms,
            decisions,
        })
    }
}

/// A global key's share in this region and its bucket under that share
/// (`rule`: the limit's rule for the share), with the bucket in words.
fn region_share(
    regions: Vec<String>,
    held: super::quota::Held,
    rule: &Rule,
    raw: &Option<Vec<u8>>,
    pttl: i64,
    now_us: f64,
) -> (RegionShare, String) {
    let (capacity, refill_per_sec) = match *rule {
        Rule::TokenBucket {
            capacity,
            refill_per_sec,
        } => (capacity, refill_per_sec),
        // Refused by the configuration: global limits are token buckets.
        _ => (rule.capacity(), 0.0),
    };
    let read = rule.read_stored(raw.as_deref(), pttl, now_us);
    let tokens = read.remaining(capacity).clamp(0.0, capacity);
    let full_in = if refill_per_sec > 0.0 {
        (capacity - tokens) / refill_per_sec
    } else {
        0.0
    };
    let full_in_ms = (full_in * 1000.0).ceil().max(0.0) as u64;
    // A token within a millionth of whole counts whole (float steps).
    let remaining = (tokens + 1e-6).floor() as u64;
    let bucket = match read {
        Stored::Valid { .. } if full_in_ms == 0 => "full".to_owned(),
        Stored::Valid { .. } => format!("full in {} s", num(full_in_ms as f64 / 1000.0)),
        Stored::Absent if pttl == -2 => "no key: a full bucket".into(),
        Stored::Absent => format!("a key of another type: {INVALID_STATE}"),
        Stored::Invalid => format!(
            "{INVALID_STATE}: {}",
            printable(&rule.shown(raw.as_deref().unwrap_or_default()))
        ),
    };
    let text = format!(
        "{tokens:.2} of {} tokens ({bucket}): region {} can admit {remaining} more request(s) \
         of this caller now",
        num(capacity),
        printable(&held.region),
    );
    let share = RegionShare {
        region: held.region,
        regions,
        ppm: held.ppm,
        percent: held.percent,
        source: held.source,
        stored: held.stored,
        flights: held.flights,
        capacity,
        refill_per_sec,
        remaining,
        full_in_ms,
    };
    (share, text)
}

/// The caller's entries of `stream` between the two times, page by page.
async fn read_decisions(
    pool: &fred::clients::Pool,
    stream: &str,
    key_id: &str,
    from_ms: u64,
    to_ms: u64,
) -> Result<Vec<RecordedDecision>, StoreError> {
    let mut out = Vec::new();
    let mut start = format!("{from_ms}-0");
    let end = format!("{to_ms}-18446744073709551615");
    let mut scanned = 0;
    while scanned < MAX_SCANNED {
        let xrange = CustomCommand::new_static("XRANGE", ClusterHash::FirstKey, false);
        let args: Vec<Value> = vec![
            stream.into(),
            start.as_str().into(),
            end.as_str().into(),
            "COUNT".into(),
            (PAGE as i64).into(),
        ];
        let page: Value = pool.custom(xrange, args).await.map_err(map_err)?;
        let entries = match page {
            Value::Array(a) => a,
            Value::Null => Vec::new(),
            other => {
                return Err(StoreError::Protocol(format!(
                    "{stream} is not a stream: {other:?}"
                )));
            }
        };
        let n = entries.len();
        let mut last_id = None;
        for entry in entries {
            let Some((id, fields)) = entry_parts(entry) else {
                continue;
            };
            if let Some(d) = decision(&id, &fields, key_id) {
                out.push(d);
            }
            last_id = Some(id);
        }
        scanned += n;
        match last_id {
            // `(` : exclusive, after the last entry read.
            Some(id) if n == PAGE => start = format!("({id}"),
            _ => break,
        }
    }
    Ok(out)
}

/// An `XRANGE` entry: its id and its field/value pairs.
pub(super) fn entry_parts(entry: Value) -> Option<(String, Vec<(String, String)>)> {
    let Value::Array(mut parts) = entry else {
        return None;
    };
    if parts.len() != 2 {
        return None;
    }
    let fields = parts.pop()?;
    let id = parts.pop()?.as_string()?;
    let Value::Array(fields) = fields else {
        return None;
    };
    let mut pairs = Vec::with_capacity(fields.len() / 2);
    let mut it = fields.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        pairs.push((k.as_string()?, v.as_string().unwrap_or_default()));
    }
    Some((id, pairs))
}

/// The entry as a decision, if it is `key_id`'s.
fn decision(id: &str, fields: &[(String, String)], key_id: &str) -> Option<RecordedDecision> {
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if get("key")? != key_id {
        return None;
    }
    let at_ms = id.split('-').next()?.parse().ok()?;
    let non_empty = |v: Option<&str>| v.filter(|v| !v.is_empty()).map(str::to_owned);
    Some(RecordedDecision {
        at_ms,
        allowed: get("allowed")? == "1",
        remaining: get("remaining").and_then(|r| r.parse().ok()),
        enough: match get("enough") {
            Some("1") => Some(true),
            Some("0") => Some(false),
            _ => None,
        },
        degraded: get("degraded") == Some("1"),
        via: get("via").unwrap_or("").to_owned(),
        plan: non_empty(get("plan")),
        instance: get("instance").unwrap_or("").to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::quota::read_share;
    use super::*;

    #[test]
    fn a_share_is_read_as_the_limiter_reads_it() {
        assert_eq!(read_share(None, 333_333), (333_333, "split"));
        assert_eq!(read_share(Some("900000"), 1), (900_000, "stored"));
        assert_eq!(read_share(Some("0"), 1), (0, "stored"));
        // Above the whole: the whole.
        assert_eq!(read_share(Some("2000000"), 1), (0, "unreadable"));
        for garbage in ["lots", "", "-5", "0.5", "99999999999", " 7"] {
            assert_eq!(
                read_share(Some(garbage), 1),
                (0, "unreadable"),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn the_contract_says_burst_and_rate() {
        let c = contract(&Rule::TokenBucket {
            capacity: 50.0,
            refill_per_sec: 10.0,
        });
        assert!(c.contains("a burst of up to 50"), "{c}");
        assert!(c.contains("10 per second (600 per minute)"), "{c}");
        assert!(c.contains("full again after 5 s"), "{c}");
        assert!(c.contains("at most 100 requests"), "{c}");
    }
}
