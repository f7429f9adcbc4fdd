//! No stranded quota: a region with no live instance runs no cycle, so it
//! would keep its shares for good. Every instance publishes its rule at
//! each view read (`agreement.rs`), every quarter interval, with the time
//! of its region's Redis: that is the region's heartbeat, read by every
//! cycle with the rest of the region's `gen` hash. A region none of whose
//! instances published for [`DEAD`] intervals has none alive (one with no
//! rule at all is not taken for dead: its Redis may have just restarted
//! empty, and its instances publish again within a quarter): its target
//! weight is 0 (not the floor a region asking nothing keeps), and the
//! first live region, in the configuration's order, that reaches it runs
//! its cycle on its behalf, on its Redis: the same compare-and-set steps
//! (lower its share, hold, release, push) as its own instances would run,
//! so a region wrongly taken for dead (clocks apart, a slow Redis) costs a
//! repeated step, never a doubled share.
//!
//! (Not `src/fleet.rs`'s heartbeat: that one is optional, and its key is
//! not on the limit's Cluster slot.)

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use fred::clients::Pool;

use crate::config::Regions;

use super::share::Runtime;

/// Intervals without a rule published after which a region has no live
/// instance (an instance publishes four times an interval).
pub(crate) const DEAD: u32 = 2;

/// Whether each region has a live instance, by its `gen` hash as read
/// (`rules[y]`; `None`: not read, taken as live); `x`, whose cycle this
/// is, by its instance running it or not.
pub(super) fn live(rt: &Runtime, x: usize, rules: &[Option<HashMap<String, String>>]) -> Vec<bool> {
    let r = &rt.regions;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let dead_after = (r.interval * DEAD).as_millis();
    (0..r.names.len())
        .map(|y| {
            if y == x {
                return x == r.this;
            }
            let Some(m) = rules.get(y).and_then(Option::as_ref) else {
                return true;
            };
            let theirs = format!("rule:{}|", r.names[y]);
            let newest = (m.iter())
                .filter(|(f, _)| f.starts_with(&theirs))
                .filter_map(|(_, ms)| ms.parse::<u128>().ok())
                .max();
            // None published at all: a Redis restarted (its instances
            // publish at their next read) or a region never started; only
            // a region whose rules went old is taken for dead.
            newest.is_none_or(|t| now.saturating_sub(t) <= dead_after)
        })
        .collect()
}

/// The regions this one runs the cycle of: those read and not live, when
/// this one is the first live region read.
pub(super) fn stranded<T>(r: &Regions, live: &[bool], seen: &[Option<T>]) -> Vec<usize> {
    let read = |y: usize| seen.get(y).is_some_and(Option::is_some);
    let first = (0..live.len()).find(|&y| live[y] && read(y));
    if first != Some(r.this) {
        return Vec::new();
    }
    (0..live.len()).filter(|&y| !live[y] && read(y)).collect()
}

/// Region `y`'s Redis, and a pool to every other region as seen from `y`
/// (this one's own Redis for this region).
pub(super) fn on_behalf(
    rt: &Runtime,
    own: &Pool,
    links: &[Option<Pool>],
    y: usize,
) -> Option<(Pool, Vec<Option<Pool>>)> {
    let link = links.get(y)?.clone()?;
    let others = (0..links.len())
        .map(|z| match z {
            _ if z == y => None,
            _ if z == rt.regions.this => Some(own.clone()),
            _ => links[z].clone(),
        })
        .collect();
    Some((link, others))
}
