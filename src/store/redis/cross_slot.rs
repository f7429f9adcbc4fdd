//! A check across hash slots on a Cluster, run group by group, and what a
//! check charged given back (a refund per slot group, a slot by id) when
//! its caller stopped waiting or a later group refused.

use std::sync::Arc;

use fred::clients::Pool;

use super::deadline::{Stamp, giving_back};
use super::reply::earliest;
use super::script::Inner;
use crate::algorithm::LimitState;
use crate::store::{Check, Outcome, StoreError};

impl Inner {
    /// A cluster cannot run one script over several slots, so the groups are
    /// decided in order; when a later group refuses or fails, or the caller
    /// stops waiting between groups, the earlier ones get their cost back.
    /// Between the charge and the refund another request may see those
    /// units spent: the price of limits that share no slot.
    pub(crate) async fn run_in_order(
        self: &Arc<Self>,
        pool: &Pool,
        check: &Check,
        groups: &[Vec<usize>],
        stamp: Stamp,
    ) -> Result<Outcome, StoreError> {
        let mut limits: Vec<Option<LimitState>> = vec![None; check.buckets.len()];
        // Dropped before it is kept (a refusal, a failure, a caller that
        // stopped waiting), it gives back what was charged so far.
        let mut charged = GiveBack {
            inner: Arc::clone(self),
            pool: pool.clone(),
            check: check.clone(),
            charged: Vec::new(),
            ends: Vec::new(),
        };
        let mut allowed = true;
        for g in groups {
            let (o, ends) = self
                .run_charged(pool, &subset(check, g, check.cost), stamp)
                .await?;
            for (k, &i) in g.iter().enumerate() {
                limits[i] = Some(o.limits[k]);
                if let Some(end) = ends.get(k).copied().flatten() {
                    // Sized only when a window was charged: no allocation
                    // for a route of token buckets.
                    charged.ends.resize(check.buckets.len(), None);
                    charged.ends[i] = Some(end);
                }
            }
            if !o.allowed {
                allowed = false;
                break;
            }
            charged.charged.extend(
                g.iter()
                    .copied()
                    .filter(|&i| limits[i].is_some_and(|l| l.enough)),
            );
        }
        if allowed {
            charged.charged.clear();
        }
        drop(charged);
        let limits = limits
            .into_iter()
            .zip(&check.buckets)
            .map(|(l, b)| {
                // Not reached: unknown, reported as untouched.
                l.unwrap_or(LimitState {
                    enough: true,
                    remaining: b.rule.capacity(),
                    wait: 0.0,
                    reset: 0.0,
                    capacity: b.rule.capacity(),
                })
            })
            .collect();
        Ok(Outcome { allowed, limits })
    }
}

/// The buckets `g` of `check`, at `cost`.
fn subset(check: &Check, g: &[usize], cost: f64) -> Check {
    Check {
        slot: check.slot.clone(),
        cost,
        buckets: g.iter().map(|&i| check.buckets[i].clone()).collect(),
    }
}

/// What the earlier groups of a cross-slot check charged, given back when
/// dropped: in a task of its own with its own deadline (the refusal is
/// decided, and a refund that ran past the check's deadline must not turn
/// it into a timeout the route's policy might answer with "admit"). A
/// failed refund leaves those units spent until they refill (an
/// over-count, the safe side). A concurrency slot goes back by id.
struct GiveBack {
    inner: Arc<Inner>,
    pool: Pool,
    check: Check,
    /// Indexes of the buckets charged.
    charged: Vec<usize>,
    /// Per bucket, the end of the window it charged (its node's clock);
    /// empty while no window was.
    ends: Vec<Option<i64>>,
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        if self.charged.is_empty() {
            return;
        }
        let (inner, pool) = (Arc::clone(&self.inner), self.pool.clone());
        let (check, charged) = (self.check.clone(), std::mem::take(&mut self.charged));
        let ends = std::mem::take(&mut self.ends);
        let task = async move { inner.give_back(&pool, &check, &charged, &ends).await };
        // On the caller's runtime when there is one; else on fred's own.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(task)),
            Err(_) => drop(self.inner.io.spawn(task)),
        }
    }
}

impl Inner {
    /// Gives back what `check` charged its buckets `charged` (indexes): a
    /// refund per slot group, a concurrency slot by id; each group while
    /// its node's clock is before the end of the earliest window it charged
    /// (`ends`, per bucket, see `reply::decode_charged`). A failed refund
    /// leaves those units spent until they refill (an over-count, the safe
    /// side).
    pub(crate) async fn give_back(
        self: &Arc<Self>,
        pool: &Pool,
        check: &Check,
        charged: &[usize],
        ends: &[Option<i64>],
    ) {
        if check.cost <= 0.0 {
            return;
        }
        let is_slot = |i: &usize| check.buckets[*i].rule.is_concurrency();
        if let Some(slot) = &check.slot {
            for &i in charged.iter().filter(|i| is_slot(i)) {
                self.release_bounded(pool, &check.buckets[i].key, slot)
                    .await;
            }
        }
        let back: Vec<usize> = charged.iter().copied().filter(|i| !is_slot(i)).collect();
        // One refund per slot (a cluster runs a script on one slot).
        let groups = if self.nodes.is_some() {
            super::cluster::slot_groups(&subset(check, &back, 0.0))
                .into_iter()
                .map(|g| g.into_iter().map(|k| back[k]).collect())
                .collect()
        } else {
            vec![back]
        };
        for g in groups.into_iter().filter(|g: &Vec<usize>| !g.is_empty()) {
            let refund = subset(check, &g, -check.cost);
            let (refund, units) = (&refund, check.cost);
            let attempt = |stamp| self.run_boxed(pool, refund, stamp);
            let done = giving_back(attempt, &self.health, earliest(ends, &g)).await;
            if let Err(e) = done {
                tracing::warn!(
                    target: "fleetlimit",
                    error = %e,
                    units,
                    keys = refund.buckets.len(),
                    "could not give back what a check charged after its caller stopped waiting \
                     (or before a refusal of another slot): it stays charged until it refills"
                );
            }
        }
    }
}
