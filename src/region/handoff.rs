//! A cycle's two writes: the hand-off that lowers this region's share of a
//! key and holds the excess, and the push that raises a receiver's share
//! by what it has not yet received (see `exchange.rs`).

use std::sync::atomic::Ordering;

use fred::clients::Pool;
use fred::types::Value;

use std::collections::HashMap;

use super::calls::{RESCALE, SCRIPT, amount, eval, hash, map, ppm, quarter, step};
use super::share::{Quota, Runtime};
use crate::route::WHOLE;

/// Step 2's hand-off of `key`: this region's share lowered to `new`, if
/// it is still `read` (as stored) in `generation`, and `gifts` held.
pub(super) struct Gift<'a> {
    /// The region whose share it is (this one, or one with no live
    /// instance, on its behalf).
    pub(super) x: usize,
    pub(super) key: &'a str,
    pub(super) read: &'a str,
    pub(super) generation: &'a str,
    pub(super) new: u32,
    pub(super) gifts: &'a [(usize, u32)],
}

/// Makes the hand-off `g`.
pub(super) async fn give(rt: &Runtime, quota: &Quota, own: &Pool, prefix: &str, g: Gift<'_>) {
    let r = &rt.regions;
    // Held past every view of the old share: views are trusted for three
    // quarters of an interval from their read.
    let hold = rt.trusted_for() + quarter(rt) / 2;
    let hold_us = i64::try_from(hold.as_micros()).unwrap_or(i64::MAX);
    let mut args: Vec<Value> = vec![
        g.key.into(),
        g.read.into(),
        i64::from(g.new).into(),
        i64::from(quota.split_now()[g.x]).into(),
        g.generation.into(),
        hold_us.into(),
    ];
    for &(y, amount) in g.gifts {
        args.push((*r.names[y]).into());
        args.push(i64::from(amount).into());
    }
    let keys = vec![
        hash(prefix, &quota.name, "share"),
        hash(prefix, &quota.name, "held"),
        hash(prefix, &quota.name, "gen"),
    ];
    let given = eval(rt, own, SCRIPT, keys, step("give", args)).await;
    if matches!(given, Ok(Value::Integer(1))) && g.x == r.this {
        let moved: u32 = g.gifts.iter().map(|g| g.1).sum();
        rt.stats
            .moved
            .fetch_add(u64::from(moved), Ordering::Relaxed);
        rt.stats.rebalanced.fetch_add(1, Ordering::Relaxed);
        quota.metrics.gave(u64::from(moved));
    }
}

/// Step 3's push: region `y` receives what it has not of `total`. Its
/// share and what it received are read just before (other regions push
/// to it too), its bucket rescaled from that share, then both are set if
/// still as read; else it is tried again, a few times, then left to the
/// next cycle (the bucket rescaled for nothing: tokens lost, never made).
/// `y` refuses it while the key is unclaimed there (its Redis restarted),
/// and once it has seen a newer generation of this region than
/// `generation` (this one's Redis restarted since this cycle read it).
/// Returns what `y` added (0: it had it already) once it holds the whole
/// total; else the total `y` was last read holding (0: not read).
pub(super) async fn push(
    rt: &Runtime,
    quota: &Quota,
    link: &Pool,
    (from, prefix): (&str, &str),
    generation: &str,
    (key, y, total): (&str, usize, u64),
) -> Result<u32, u64> {
    let share_key = || vec![hash(prefix, &quota.name, "share")];
    let got_key = hash(prefix, &quota.name, &format!("got:{key}|{from}"));
    let burst = super::generation::burst(quota).ok_or(0u64)?;
    let mut seen = 0;
    let split = quota.split_now();
    for _ in 0..3 {
        let peek = step("peek", [key.into(), got_key.as_str().into()]);
        let v = eval(rt, link, SCRIPT, share_key(), peek)
            .await
            .map_err(|_| seen)?;
        let mut it = v
            .into_array()
            .into_iter()
            .map(|v| v.as_string().unwrap_or_default());
        let (share_read, got_read) = (it.next().unwrap_or_default(), it.next().unwrap_or_default());
        // What is not a total is not taken for none: pushing over it could
        // count the same quota twice.
        let got: u64 = if got_read.is_empty() {
            0
        } else {
            got_read.parse().map_err(|_| seen)?
        };
        seen = got;
        if total <= got {
            return Ok(0);
        }
        let before = if share_read.is_empty() {
            split[y]
        } else {
            ppm(&share_read)
        };
        let add = u32::try_from(total - got).unwrap_or(WHOLE);
        let after = before.saturating_add(add).min(WHOLE);
        // The bucket first: until the share rises, its readers see fewer
        // tokens than it holds, never more.
        let args: Vec<Value> = vec![
            burst.to_string().into(),
            i64::from(before.max(1)).into(),
            i64::from(after).into(),
        ];
        eval(rt, link, RESCALE, vec![key.to_owned()], args)
            .await
            .map_err(|_| seen)?;
        let args = [
            key.into(),
            got_key.as_str().into(),
            i64::try_from(total).unwrap_or(i64::MAX).into(),
            share_read.into(),
            got_read.into(),
            i64::from(after).into(),
            i64::from(split[y]).into(),
            from.into(),
            generation.into(),
        ];
        let keys = vec![
            hash(prefix, &quota.name, "share"),
            hash(prefix, &quota.name, "gen"),
            hash(prefix, &quota.name, "seen"),
        ];
        if let Ok(Value::Integer(1)) = eval(rt, link, SCRIPT, keys, step("apply", args)).await {
            return Ok(after - before);
        }
    }
    Err(seen)
}

/// What a cycle's release and pushes left.
pub(super) struct Handed {
    /// Held, and released but not received (in millionths).
    pub(super) in_flight: u64,
    /// Still held after the release: `<key>|<to>` → `<ppm>:<µs>`.
    pub(super) held: HashMap<String, String>,
    /// The pending fields (`<key>|<to>`) not acknowledged.
    pub(super) unacked: Vec<String>,
    /// What landed in this cycle: (key, region) → millionths.
    pub(super) landed: Vec<((String, usize), u32)>,
}

/// Releases what was held long enough, pushes every total not yet
/// acknowledged (`None`: the release failed).
pub(super) async fn hand_over(
    rt: &Runtime,
    quota: &Quota,
    (x, own, links): (usize, &Pool, &[Option<Pool>]),
    prefix: &str,
    generation: &str,
) -> Option<Handed> {
    let r = &rt.regions;
    let from = &*r.names[x];
    let h = |part: &str| hash(prefix, &quota.name, part);
    let release = step("release", [Value::from(h("given:"))]);
    let keys = vec![h("held"), h("pending")];
    let pending = eval(rt, own, SCRIPT, keys.clone(), release).await.ok()?;
    // What is still held after the release.
    let read = eval(rt, own, SCRIPT, keys, step("read", [0.into()])).await;
    let held = read.ok().and_then(|v| v.into_array().into_iter().next());
    let held = held.map(map).unwrap_or_default();
    let mut out = Handed {
        in_flight: held.values().map(|v| amount(v)).sum(),
        held,
        unacked: Vec::new(),
        landed: Vec::new(),
    };
    for (field, v) in map(pending) {
        let Some((key, to)) = field.rsplit_once('|') else {
            continue;
        };
        let total = amount(&v);
        let y = r.names.iter().position(|n| **n == *to);
        let link = y.and_then(|y| Some((y, links[y].as_ref()?)));
        let received = match link {
            Some((y, link)) => push(rt, quota, link, (from, prefix), generation, (key, y, total))
                .await
                .map(|n| (y, n)),
            None => Err(0),
        };
        match received {
            Ok((y, n)) => {
                if n > 0 {
                    out.landed.push(((key.to_owned(), y), n));
                }
                let args = step("ack", [field.into(), total.to_string().into()]);
                let _ = eval(rt, own, SCRIPT, vec![h("pending")], args).await;
            }
            // What the receiver was not seen to hold (all of the total
            // when it could not be read).
            Err(got) => {
                out.in_flight += total.saturating_sub(got);
                out.unacked.push(field);
            }
        }
    }
    Some(out)
}
