//! The exchange's Redis calls, shared by the cycle (`exchange.rs`) and its
//! writes (`handoff.rs`): the scripts, the hashes' names, one `EVAL` under
//! a quarter interval's timeout, and `region.lua`'s arguments.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fred::clients::Pool;
use fred::interfaces::ClientLike;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Value};

use super::share::{Runtime, stored_share};
use crate::store::StoreError;
use crate::store::redis::reply::map_err;

pub(super) const SCRIPT: &str = include_str!("../../lua/region.lua");
pub(super) const RESCALE: &str = concat!(
    include_str!("../../lua/token_bucket.lua"),
    include_str!("../../lua/token_bucket_rescale.lua")
);

/// How long the exchange's hashes live without a cycle touching them.
const KEEP: Duration = Duration::from_secs(86_400);

/// A quarter of the exchange's interval: a cycle's step, and its calls' timeout.
pub(super) fn quarter(rt: &Runtime) -> Duration {
    (rt.regions.interval / 4).max(Duration::from_millis(1))
}

/// The name of one of a limit's exchange hashes (one hash tag per limit).
pub(super) fn hash(prefix: &str, limit: &str, part: &str) -> String {
    format!("{prefix}:regions:{{{limit}}}:{part}")
}

/// A call's options: one try, within a quarter interval.
pub(super) fn options(rt: &Runtime) -> Options {
    Options {
        timeout: Some(quarter(rt)),
        fail_fast: true,
        max_attempts: Some(1),
        ..Options::default()
    }
}

/// One call of `script`, on the slot of `keys[0]`.
pub(super) async fn eval(
    rt: &Runtime,
    pool: &Pool,
    script: &'static str,
    keys: Vec<String>,
    args: Vec<Value>,
) -> Result<Value, StoreError> {
    rt.stats.calls.fetch_add(1, Ordering::Relaxed);
    rt.metrics.call();
    let slot = ClusterHash::Custom(fred::util::redis_keyslot(keys[0].as_bytes()));
    let cmd = CustomCommand::new_static("EVAL", slot, false);
    let mut all: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
    all.push(script.into());
    all.push((keys.len() as i64).into());
    all.extend(keys.into_iter().map(Value::from));
    all.extend(args);
    pool.with_options(&options(rt))
        .custom(cmd, all)
        .await
        .map_err(map_err)
}

/// `region.lua`'s arguments: the expiry of what it writes, the step, then
/// `rest`.
pub(super) fn step(name: &'static str, rest: impl IntoIterator<Item = Value>) -> Vec<Value> {
    step_for(KEEP, name, rest)
}

pub(super) fn step_for(
    keep: Duration,
    name: &'static str,
    rest: impl IntoIterator<Item = Value>,
) -> Vec<Value> {
    let keep = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
    [keep.into(), name.into()].into_iter().chain(rest).collect()
}

/// A share as stored, or none at all when it is not one (a region never
/// decides on a share it cannot read as one).
pub(super) fn ppm(s: &str) -> u32 {
    stored_share(s).unwrap_or(0)
}

/// A `HGETALL` answer as a map.
pub(super) fn map(v: Value) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut it = v.into_array().into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        if let (Some(k), Some(v)) = (k.as_string(), v.as_string()) {
            out.insert(k, v);
        }
    }
    out
}

/// The leading number of `"<n>:<µs>"`.
pub(super) fn amount(v: &str) -> u64 {
    v.split(':')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

/// Every future's output, in order, all polled together (a region's
/// read waits for no other's).
pub(super) async fn join_all<F: std::future::Future>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.map(|f| Some(Box::pin(f))).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (f, o) in futs.iter_mut().zip(&mut out) {
            if let Some(fut) = f {
                if let std::task::Poll::Ready(v) = fut.as_mut().poll(cx) {
                    *o = Some(v);
                    *f = None;
                }
            }
        }
        if futs.iter().all(Option::is_none) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().flatten().collect()
}
