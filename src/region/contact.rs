//! What a cycle records of the other regions, in its own region's `gen`
//! hash: the rules they published (`agreement.rs`), and when it last
//! reached each (`contact:<region>`, ms of Redis time), which `fleetlimit
//! inspect` and `explain` show. A region not reached for [`STALE`]
//! intervals is said to be so: a gauge of the seconds since, and a WARN at
//! most once a minute per limit and region.

use std::collections::HashMap;
use std::time::Duration;

use fred::clients::Pool;
use fred::types::Value;
use tokio::time::Instant;

use super::calls::{SCRIPT, eval, hash, step};
use super::share::{Quota, Runtime};

/// Intervals without an exchange after which a region is stale.
pub(crate) const STALE: u32 = 3;
/// The least time between two staleness warnings of one region.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Copies into this region's `gen` hash the rules the other regions
/// published in theirs (`read[y]`: region y's, as read; `None`:
/// unreachable), and when each was reached; says which are stale.
pub(super) async fn note(
    rt: &Runtime,
    q: &Quota,
    own: &Pool,
    prefix: &str,
    read: &[Option<HashMap<String, String>>],
) {
    let r = &rt.regions;
    // Only what their instances published lately: a region with none
    // left keeps none of its rules in the others' hashes.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let fresh = (r.interval * super::agreement::AGE).as_millis();
    let mut fields: Vec<Value> = (read.iter().enumerate())
        .filter(|(y, _)| *y != r.this)
        .filter_map(|(y, m)| Some((format!("rule:{}|", r.names[y]), m.as_ref()?)))
        .flat_map(|(theirs, m)| {
            let keys = m.iter().filter(move |(f, ms)| {
                let at = ms.parse::<u128>().unwrap_or(0);
                f.starts_with(&theirs) && now.saturating_sub(at) <= fresh
            });
            keys.map(|(f, _)| Value::from(f.as_str()))
                .collect::<Vec<_>>()
        })
        .collect();
    for (y, m) in read.iter().enumerate() {
        if y != r.this && m.is_some() {
            fields.push(format!("contact:{}", r.names[y]).into());
        }
    }
    stale(rt, q, read);
    if fields.is_empty() {
        return;
    }
    let key = hash(prefix, &q.name, "gen");
    if let Err(e) = eval(rt, own, SCRIPT, vec![key], step("note", fields)).await {
        tracing::debug!(target: "fleetlimit", limit = &*q.name, error = %e, "the other regions' rules not noted");
    }
}

/// The staleness gauge of every other region, and its warning.
fn stale(rt: &Runtime, q: &Quota, read: &[Option<HashMap<String, String>>]) {
    let r = &rt.regions;
    let now = Instant::now();
    let limit = r.interval * STALE;
    let mut seen = q.contacts.seen.lock().unwrap_or_else(|e| e.into_inner());
    for (y, (last, warned)) in seen.iter_mut().enumerate() {
        if y == r.this {
            continue;
        }
        if read.get(y).is_some_and(Option::is_some) {
            *last = Some(now);
        }
        let age = now - last.unwrap_or(q.contacts.since);
        q.metrics.stale(y, age.as_secs_f64());
        if age < limit || warned.is_some_and(|w| now - w < WARN_EVERY) {
            continue;
        }
        *warned = Some(now);
        tracing::warn!(
            target: "fleetlimit",
            limit = &*q.name,
            region = &*r.names[r.this],
            with = &*r.names[y],
            seconds = age.as_secs(),
            "no exchange with this region for over {STALE} intervals: the quotas of both stay as they were (quota given to it stays in flight)"
        );
    }
}
