//! A hot key's partial lease against Redis (`lua/token_bucket_lease.lua`):
//! one call takes what is free of a batch, possibly nothing, and says when
//! a whole batch fits again. Like a check, it carries its "not after"
//! bound (run later, it takes nothing), and an answer its caller stopped
//! waiting for is settled: what it took is given back, so a lease given up
//! on changes nothing.

use std::sync::Arc;

use fred::clients::Pool;
use fred::types::Value;

use super::deadline::{Stamp, within};
use super::reply::Answer;
use super::script::{Inner, Which};
use crate::algorithm::LeanArgs;
use crate::metrics::Precision;
use crate::store::{Check, Lease, Outcome, StoreError};

impl Inner {
    /// Leases up to `check.cost` of its only bucket (a token bucket whose
    /// request cost `step` gives `lean`), in whole steps, within `stamp`.
    pub(crate) async fn lease(
        self: &Arc<Self>,
        pool: &Pool,
        check: &Check,
        lean: LeanArgs,
        step: f64,
        stamp: Stamp,
    ) -> Result<Lease, StoreError> {
        let most = (check.cost / step).floor().max(1.0);
        let key = check.buckets.first().map_or("", |b| b.key.as_str());
        let (inc, burst) = lean.values();
        // EVALSHA sha 1 key not_after step×per burst×per most.
        let args = vec![
            Value::Null,
            Value::Integer(1),
            Value::from(key),
            Value::Null,
            inc,
            burst,
            Value::Integer(most as i64),
        ];
        let node;
        let (pool, clock) = match &self.nodes {
            Some(nodes) => {
                node = nodes.for_slot(fred::util::redis_keyslot(key.as_bytes()))?;
                (&node.pool, Arc::clone(&node.clock))
            }
            None => (pool, Arc::clone(&self.clock)),
        };
        self.metrics.sent(Which::Lease.metric(), 1);
        let mut sending = self.send(pool, clock, Which::Lease, args, 3, stamp);
        let waited = within(&mut sending, self.deadline(), stamp, &self.io, &self.stalls).await;
        self.health
            .saw(waited.as_ref().is_some_and(|a| a.reply.is_ok()));
        let Some(answer) = waited else {
            let (inner, pool, check) = (Arc::clone(self), pool.clone(), check.clone());
            self.settle(sending, move |answer| async move {
                let taken = match decode(answer, lean, step, most) {
                    Ok(l) => l.granted,
                    Err(StoreError::Late) => {
                        return inner.metrics.precision(Precision::LateDiscarded, 1);
                    }
                    Err(_) => return inner.metrics.precision(Precision::Unknown, 1),
                };
                if taken <= 0.0 {
                    return inner.metrics.precision(Precision::SettledUncharged, 1);
                }
                inner.metrics.precision(Precision::SettledCharged, 1);
                let taken = Check {
                    cost: taken,
                    slot: None,
                    ..check
                };
                inner.give_back(&pool, &taken, &[0], &[]).await;
            });
            return Err(StoreError::Timeout);
        };
        decode(answer, lean, step, most)
    }
}

/// The lease script's answer: requests taken (0 to `most`) and
/// 4 × (TAT − now) after, in quarter µs.
fn decode(answer: Answer, lean: LeanArgs, step: f64, most: f64) -> Result<Lease, StoreError> {
    let items = answer.items()?;
    match items.as_slice() {
        [Value::Integer(taken), Value::Integer(x)]
            if (0..=most as i64).contains(taken) && *x >= 0 =>
        {
            Ok(Lease {
                granted: *taken as f64 * step,
                state: lean.lease_answer(*taken, *x, most),
            })
        }
        other => Err(StoreError::Protocol(format!(
            "lease script: unexpected {other:?}"
        ))),
    }
}

/// A lease of a check that is not one token bucket: all or nothing.
pub(super) fn whole(o: Outcome, cost: f64) -> Result<Lease, StoreError> {
    let state = o
        .limits
        .first()
        .copied()
        .ok_or_else(|| StoreError::Protocol("a lease's answer has no bucket".to_owned()))?;
    let granted = if o.allowed { cost } else { 0.0 };
    Ok(Lease { granted, state })
}
