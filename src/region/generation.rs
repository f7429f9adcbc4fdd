//! A region's Redis restarted empty: its shares, its totals and its
//! buckets are gone. Its generation (an id written when the exchange's
//! state is first read, `gen` in `lua/region.lua`) changes, and an
//! instance or another region that knew the old one marks the new one a
//! restart. From then on a key this region has no share recorded for is
//! **unclaimed**: held by no one here (decided as 0), never the split.
//!
//! The cycle claims each key it meets unclaimed from what the other
//! regions' records prove this region holds: its split, plus every total
//! they gave it, minus every total they received from it (cumulative,
//! `given:` and `got:` there). Each other region is first fenced (it
//! records the new generation, so a push from an instance of the old one
//! that is still running is refused from then on), so its `got` from here
//! can no longer grow. What this region gave and was not received is
//! claimed back (it was held or pending in the lost state, and the fence
//! keeps it from landing); what the others gave and it had not counted
//! is in the claim, and its `got` starts at their totals, so their
//! pending pushes add nothing twice. The key's bucket starts empty: a
//! missing bucket reads as full, and nothing proves it held any tokens.

use std::collections::HashMap;

use fred::clients::Pool;
use fred::types::Value;

use super::Generation;
use super::calls::{SCRIPT, eval, hash, step};
use super::share::{Quota, Runtime};
use crate::algorithm::{LeanArgs, Rule};
use crate::route::WHOLE;

/// The token bucket's helpers, then the claim's emptying of a bucket.
const EMPTY: &str = concat!(
    include_str!("../../lua/token_bucket.lua"),
    include_str!("../../lua/token_bucket_empty.lua")
);

impl Generation {
    /// A `gen` hash as `HGETALL` read it.
    pub(super) fn read(m: &HashMap<String, String>) -> Self {
        Self {
            id: m.get("id").map_or("", String::as_str).into(),
            restart: m.contains_key("restart"),
            born: m.get("born").and_then(|b| b.parse().ok()).unwrap_or(0),
        }
    }
}

/// A fresh generation id, should this read be the first.
pub(super) fn candidate() -> String {
    crate::fleet::instance_id()
}

/// After a view's read: says so when this region's generation changed,
/// and whether it did.
pub(super) fn noticed(rt: &Runtime, quota: &Quota, old: &Generation, new: &Generation) -> bool {
    if old.id.is_empty() || old.id == new.id {
        return false;
    }
    quota.metrics.generation_changed();
    tracing::warn!(
        target: "fleetlimit",
        limit = &*quota.name,
        region = &*rt.regions.names[rt.regions.this],
        old = &*old.id,
        new = &*new.id,
        "this region's Redis lost the exchange's state (a new generation): each key is refused here until the other regions' records prove what this region holds"
    );
    true
}

/// Marks generation `id` of another region's Redis a restart (this
/// region knew an older one); whether it is one now.
pub(super) async fn mark(rt: &Runtime, link: &Pool, key: &str, id: &str) -> bool {
    let args = step("mark", [id.into()]);
    let marked = eval(rt, link, SCRIPT, vec![key.to_owned()], args).await;
    matches!(marked, Ok(Value::Integer(1)))
}

/// The limit's full burst in µs, as the checks send it: the larger of
/// its rule's and the fleet's smaller rule's, while the regions' rules
/// differ (a rescale or an emptying on a larger burst than the bucket's
/// loses tokens, never makes any).
pub(super) fn burst(quota: &Quota) -> Option<f64> {
    let of = |rule: Rule| {
        let Rule::TokenBucket {
            capacity,
            refill_per_sec,
        } = rule
        else {
            return None;
        };
        Some(LeanArgs::new(capacity, refill_per_sec, 1.0).args().1)
    };
    Some(of(quota.rule)?.max(of(quota.rule_now(quota.rule))?))
}

/// Claims `keys` (unclaimed here) in generation `id`; nothing when a
/// region cannot be fenced (its records are needed for every key).
pub(super) async fn claim(
    rt: &Runtime,
    quota: &Quota,
    own: &Pool,
    links: &[Option<Pool>],
    prefix: &str,
    id: &str,
    keys: &[&str],
) {
    let r = &rt.regions;
    let x = r.this;
    let Some(burst) = burst(quota) else {
        return;
    };
    if keys.is_empty() {
        return;
    }
    let name = &*quota.name;
    let h = |part: &str| hash(prefix, name, part);
    let fences = links.iter().map(|link| async {
        let mut args: Vec<Value> = vec![
            (*r.names[x]).into(),
            id.into(),
            h("given:").into(),
            h("got:").into(),
        ];
        args.extend(keys.iter().map(|&k| Value::from(k)));
        let v = eval(
            rt,
            link.as_ref()?,
            SCRIPT,
            vec![h("seen")],
            step("fence", args),
        )
        .await;
        let rows: Vec<(u64, u64)> = v
            .ok()?
            .into_array()
            .into_iter()
            .map(|row| {
                let mut it = row.into_array().into_iter().map(|v| {
                    v.as_string()
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(0)
                });
                (it.next().unwrap_or(0), it.next().unwrap_or(0))
            })
            .collect();
        (rows.len() == keys.len()).then_some(rows)
    });
    let fenced = super::calls::join_all(fences).await;
    if fenced
        .iter()
        .enumerate()
        .any(|(y, f)| y != x && f.is_none())
    {
        tracing::debug!(target: "fleetlimit", limit = name, "unclaimed keys wait: a region's records could not be read");
        return;
    }
    let mut claimed = 0u64;
    for (i, &key) in keys.iter().enumerate() {
        let mut held = i128::from(quota.split_now()[x]);
        let mut args: Vec<Value> = Vec::new();
        for (y, rows) in fenced.iter().enumerate() {
            let Some(rows) = rows.as_ref().filter(|_| y != x) else {
                continue;
            };
            let (given, got) = rows[i];
            held += i128::from(given) - i128::from(got);
            args.extend([
                Value::from(&*r.names[y]),
                given.to_string().into(),
                got.to_string().into(),
            ]);
        }
        let share = u32::try_from(held.clamp(0, i128::from(WHOLE))).unwrap_or(0);
        // The bucket first: until the claim, the key is refused here.
        let empty = vec![burst.to_string().into()];
        if eval(rt, own, EMPTY, vec![key.to_owned()], empty)
            .await
            .is_err()
        {
            continue;
        }
        let mut all: Vec<Value> = vec![
            key.into(),
            i64::from(share).into(),
            id.into(),
            h("got:").into(),
            h("given:").into(),
        ];
        all.extend(args);
        let keys = vec![h("share"), h("gen")];
        if let Ok(Value::Integer(1)) = eval(rt, own, SCRIPT, keys, step("claim", all)).await {
            claimed += 1;
        }
    }
    if claimed > 0 {
        quota.metrics.claimed(claimed);
        tracing::info!(
            target: "fleetlimit",
            limit = name,
            region = &*r.names[x],
            keys = claimed,
            "keys claimed after this region's Redis restarted: each from its split and the other regions' totals given and received"
        );
    }
}

/// The keys a restarted region meets unclaimed: asked for, or recorded
/// away from the split by another region.
pub(super) fn shared_keys<'a>(
    keys: &mut std::collections::BTreeSet<&'a str>,
    others: impl Iterator<Item = &'a HashMap<String, String>>,
    most: usize,
) {
    for shares in others {
        keys.extend(shares.keys().take(most).map(String::as_str));
    }
}
