//! Agreement before trust: every instance publishes its global limit's
//! rule (algorithm, burst, refill, split, regions) as a fingerprint in its
//! region's `gen` hash (field `rule:<region>|<fingerprint>`, the Redis time
//! of its last publication), at each view read. Each cycle copies the
//! other regions' fingerprints into its own region's hash, so every
//! instance sees the fleet's rules in its own Redis. While they differ,
//! every region decides with the smaller rule: the least burst, the least
//! refill, and for each region the least split any fingerprint gives it
//! (a region some fingerprint does not list: none). The sum of those
//! splits is at most the least sum, so the shares still add up to at most
//! the limit. A fingerprint not published for [`AGE`] intervals is
//! dropped: a fleet that agrees again decides with its rule again.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::algorithm::Rule;
use crate::config::Regions;

/// Intervals a fingerprint lives unpublished.
pub(crate) const AGE: u32 = 4;
/// The least time between two warnings of one limit, per instance.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What the fleet's rules of one limit come to, when they differ.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Agreement {
    /// The smaller rule: the least burst and the least refill.
    pub(crate) rule: Rule,
    /// Each region's least split (in the configuration's order).
    pub(crate) split: Box<[u32]>,
    /// The regions whose rule differs from this instance's, named.
    pub(crate) differ: Box<[Box<str>]>,
}

/// A limit's rule as published: the algorithm, then its numbers.
pub(crate) fn fingerprint(rule: Rule, split: &[u32], regions: &Regions) -> String {
    let Rule::TokenBucket {
        capacity,
        refill_per_sec,
    } = rule
    else {
        // Refused by the configuration: global limits are token buckets.
        return format!("{rule:?}");
    };
    let split: Vec<String> = (regions.names.iter().zip(split))
        .map(|(n, s)| format!("{n}:{s}"))
        .collect();
    format!(
        "token_bucket capacity={capacity} refill={refill_per_sec}/s split={}",
        split.join(",")
    )
}

/// The field an instance publishes its fingerprint under.
pub(crate) fn field(regions: &Regions, fp: &str) -> String {
    format!("rule:{}|{fp}", regions.names[regions.this])
}

/// A fingerprint's numbers: capacity, refill, split by region name.
type Numbers<'a> = (f64, f64, Vec<(&'a str, u32)>);

fn parse(fp: &str) -> Option<Numbers<'_>> {
    let mut it = fp.split(' ');
    if it.next()? != "token_bucket" {
        return None;
    }
    let capacity = it.next()?.strip_prefix("capacity=")?.parse().ok()?;
    let refill = it.next()?.strip_prefix("refill=")?.strip_suffix("/s")?;
    let split = it.next()?.strip_prefix("split=")?.split(',').map(|p| {
        let (name, ppm) = p.split_once(':')?;
        Some((name, ppm.parse().ok()?))
    });
    let split: Option<Vec<(&str, u32)>> = split.collect();
    Some((capacity, refill.parse().ok()?, split?))
}

/// The fleet's rules of limit `name` (its rule, split and fingerprint
/// `own` as this instance has them), from the `rule:` fields of a `gen`
/// hash (`None`: every fingerprint is this instance's own).
pub(crate) fn agree<'a>(
    (name, rule, split, own): (&str, Rule, &[u32], &str),
    regions: &Regions,
    fields: impl Iterator<Item = &'a String>,
) -> Option<Agreement> {
    let mut capacity = f64::INFINITY;
    let mut refill = f64::INFINITY;
    let mut split: Vec<u32> = split.to_vec();
    let mut differ = BTreeSet::new();
    for f in fields {
        let Some((region, fp)) = f.strip_prefix("rule:").and_then(|f| f.split_once('|')) else {
            continue;
        };
        if fp == own {
            continue;
        }
        // Not a fingerprint fleetlimit writes: ignored (a fault the size
        // of its cause), said at debug level.
        let Some((c, r, s)) = parse(fp) else {
            tracing::debug!(target: "fleetlimit", limit = name, field = f, "not a rule's fingerprint: ignored");
            continue;
        };
        differ.insert(region);
        capacity = capacity.min(c);
        refill = refill.min(r);
        for (y, name) in regions.names.iter().enumerate() {
            let theirs = s.iter().find(|(n, _)| *n == &**name).map_or(0, |p| p.1);
            split[y] = split[y].min(theirs);
        }
    }
    if differ.is_empty() {
        return None;
    }
    let Rule::TokenBucket {
        capacity: c,
        refill_per_sec: r,
    } = rule
    else {
        return None;
    };
    Some(Agreement {
        rule: Rule::TokenBucket {
            capacity: capacity.min(c),
            refill_per_sec: refill.min(r),
        },
        split: split.into(),
        differ: differ.into_iter().map(Into::into).collect(),
    })
}

/// Says (a warning, at most once a minute per limit and instance, when it
/// last did in `warned`, and a gauge) whether the fleet's rules of limit
/// `name` differ.
pub(crate) fn report(
    (name, metrics, warned): (&str, &crate::metrics::QuotaMetrics, &AtomicU64),
    regions: &Regions,
    agreement: Option<&Agreement>,
) {
    let differ = agreement.map_or(0, |a| a.differ.len());
    metrics.rules_differ(differ);
    let Some(a) = agreement else {
        return;
    };
    let now = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX);
    let last = warned.load(Relaxed);
    let every = u64::try_from(WARN_EVERY.as_millis()).unwrap_or(u64::MAX);
    if last != 0 && now.saturating_sub(last) < every {
        return;
    }
    if warned
        .compare_exchange(last, now, Relaxed, Relaxed)
        .is_err()
    {
        return;
    }
    let Rule::TokenBucket {
        capacity,
        refill_per_sec,
    } = a.rule
    else {
        return;
    };
    tracing::warn!(
        target: "fleetlimit",
        limit = name,
        region = &*regions.names[regions.this],
        differ = %a.differ.join(","),
        capacity,
        refill_per_sec,
        "the regions' rules of this global limit differ: every region decides with the smaller one until they agree (docs/regions.md: changing a global limit)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_reads_back_and_garbage_is_none() {
        let fp = "token_bucket capacity=100 refill=100/s split=a:333333,b:333333,c:333333";
        let (c, r, s) = parse(fp).unwrap();
        assert_eq!((c, r), (100.0, 100.0));
        assert_eq!(s, vec![("a", 333_333), ("b", 333_333), ("c", 333_333)]);
        for bad in [
            "",
            "sliding capacity=1 refill=1/s split=a:1",
            "token_bucket capacity=x refill=1/s split=a:1",
            "token_bucket capacity=1 refill=1 split=a:1",
            "token_bucket capacity=1 refill=1/s split=a",
        ] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }
}
