//! A cycle's two writes: the hand-off that lowers this region's share of a
//! key and holds the excess, and the push that raises a receiver's share
//! by what it has not yet received (see `exchange.rs`).

use std::sync::atomic::Ordering;

use fred::clients::Pool;
use fred::types::Value;

use super::calls::{RESCALE, SCRIPT, eval, hash, ppm, quarter, step};
use super::share::{Quota, Runtime};
use crate::algorithm::LeanArgs;
use crate::route::WHOLE;

/// Step 2's hand-off: lowers this region's share of `key` to `new` (if it
/// is still `read`, as stored) and holds the gifts.
#[allow(clippy::too_many_arguments)]
pub(super) async fn give(
    rt: &Runtime,
    quota: &Quota,
    own: &Pool,
    prefix: &str,
    key: &str,
    read: &str,
    new: u32,
    gifts: &[(usize, u32)],
) {
    let r = &rt.regions;
    // Held past every view of the old share: views are trusted for three
    // quarters of an interval from their read.
    let hold = rt.trusted_for() + quarter(rt) / 2;
    let hold_us = i64::try_from(hold.as_micros()).unwrap_or(i64::MAX);
    let mut args: Vec<Value> = vec![
        key.into(),
        read.into(),
        i64::from(new).into(),
        i64::from(quota.default).into(),
        hold_us.into(),
    ];
    for &(y, amount) in gifts {
        args.push((*r.names[y]).into());
        args.push(i64::from(amount).into());
    }
    let keys = vec![
        hash(prefix, &quota.name, "share"),
        hash(prefix, &quota.name, "held"),
    ];
    if let Ok(Value::Integer(1)) = eval(rt, own, SCRIPT, keys, step("give", args)).await {
        let moved: u32 = gifts.iter().map(|g| g.1).sum();
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
/// Returns whether `y` has received the whole total.
pub(super) async fn push(
    rt: &Runtime,
    quota: &Quota,
    link: &Pool,
    prefix: &str,
    key: &str,
    y: usize,
    total: u64,
) -> bool {
    let r = &rt.regions;
    let from = &*r.names[r.this];
    let share_key = || vec![hash(prefix, &quota.name, "share")];
    let got_key = hash(prefix, &quota.name, &format!("got:{key}|{from}"));
    let crate::algorithm::Rule::TokenBucket {
        capacity,
        refill_per_sec,
    } = quota.rule
    else {
        return false;
    };
    let (_, burst) = LeanArgs::new(capacity, refill_per_sec, 1.0).args();
    for _ in 0..3 {
        let peek = step("peek", [key.into(), got_key.as_str().into()]);
        let Ok(v) = eval(rt, link, SCRIPT, share_key(), peek).await else {
            return false;
        };
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
            let Ok(got) = got_read.parse() else {
                return false;
            };
            got
        };
        if total <= got {
            return true;
        }
        let before = if share_read.is_empty() {
            quota.split[y]
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
        if eval(rt, link, RESCALE, vec![key.to_owned()], args)
            .await
            .is_err()
        {
            return false;
        }
        let args = [
            key.into(),
            got_key.as_str().into(),
            i64::try_from(total).unwrap_or(i64::MAX).into(),
            share_read.into(),
            got_read.into(),
            i64::from(after).into(),
            i64::from(quota.split[y]).into(),
        ];
        if let Ok(Value::Integer(1)) =
            eval(rt, link, SCRIPT, share_key(), step("apply", args)).await
        {
            return true;
        }
    }
    false
}
