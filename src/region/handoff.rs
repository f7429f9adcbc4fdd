//! A cycle's two writes: the hand-off that lowers this region's share of a
//! key and holds the excess, and the push that raises a receiver's share
//! by what it has not yet received (see `exchange.rs`).

use std::sync::atomic::Ordering;

use fred::clients::Pool;
use fred::types::Value;

use super::calls::{RESCALE, SCRIPT, eval, hash, ppm, quarter, step};
use super::share::{Quota, Runtime};
use crate::route::WHOLE;

/// Step 2's hand-off of `key`: this region's share lowered to `new`, if
/// it is still `read` (as stored) in `generation`, and `gifts` held.
pub(super) struct Gift<'a> {
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
        i64::from(quota.split_now()[r.this]).into(),
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
    if let Ok(Value::Integer(1)) = eval(rt, own, SCRIPT, keys, step("give", args)).await {
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
/// total; `None` while it does not.
pub(super) async fn push(
    rt: &Runtime,
    quota: &Quota,
    link: &Pool,
    prefix: &str,
    generation: &str,
    (key, y, total): (&str, usize, u64),
) -> Option<u32> {
    let r = &rt.regions;
    let from = &*r.names[r.this];
    let share_key = || vec![hash(prefix, &quota.name, "share")];
    let got_key = hash(prefix, &quota.name, &format!("got:{key}|{from}"));
    let burst = super::generation::burst(quota)?;
    let split = quota.split_now();
    for _ in 0..3 {
        let peek = step("peek", [key.into(), got_key.as_str().into()]);
        let v = eval(rt, link, SCRIPT, share_key(), peek).await.ok()?;
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
            got_read.parse().ok()?
        };
        if total <= got {
            return Some(0);
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
            .ok()?;
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
            return Some(after - before);
        }
    }
    None
}
