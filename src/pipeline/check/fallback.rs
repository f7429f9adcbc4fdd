//! When the primary store fails: the route's `on_redis_error` decides.
//!
//! - `open`: served, unlimited (no rate-limit headers: nothing was counted);
//! - `closed`: `503` with `Retry-After` (`closed_retry_after`);
//! - `local`: in-process buckets sized limit ÷ fleet size, this instance's
//!   share; their answer goes on to the usual decision (headers, refusals,
//!   refunds to these buckets). A concurrency limit's share also holds the
//!   slots this instance took through Redis and still holds (`held.rs`).
//!
//! Never a 500. One WARN a second per route says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::super::plan::RoutePlan;
use super::super::{DecidedBy, Pending};
use super::Answer;
use super::writeback::WriteBack;
use crate::algorithm::LimitState;
use crate::answer as response;
use crate::config::Config;
use crate::route::FailurePolicy;
use crate::store::{Bucket, Check, MemoryStore, Store, StoreError};

/// The `local` policy's buckets and N: the layer's whatever configuration
/// it runs (a reload keeps the counts, as the primary store does).
pub(in crate::pipeline) struct Local {
    buckets: MemoryStore,
    /// N for the `local` policy: configured, or kept up to date by the
    /// heartbeat (and kept at its last value while Redis is down).
    fleet: Arc<AtomicU32>,
    /// What these buckets admitted, to be charged to the primary store once
    /// it answers again (see `writeback.rs`).
    write_back: WriteBack,
    /// Concurrency slots held through the primary store, per key.
    held: super::held::Held,
}

impl Local {
    pub(in crate::pipeline) fn new(cfg: &Config) -> Self {
        Self {
            buckets: MemoryStore::new(cfg.memory_max_keys),
            fleet: Arc::new(AtomicU32::new(cfg.fleet_size)),
            write_back: WriteBack::new(cfg.memory_max_keys),
            held: super::held::Held::default(),
        }
    }

    pub(in crate::pipeline) fn held(&self) -> &super::held::Held {
        &self.held
    }

    pub(in crate::pipeline) fn write_back(&self) -> &WriteBack {
        &self.write_back
    }

    pub(in crate::pipeline) fn fleet_size(&self) -> u32 {
        self.fleet.load(Ordering::Relaxed).max(1)
    }

    pub(in crate::pipeline) fn fleet_handle(&self) -> &Arc<AtomicU32> {
        &self.fleet
    }

    pub(in crate::pipeline) fn set_fleet_size(&self, n: u32) {
        self.fleet.store(n, Ordering::Relaxed);
    }
}

impl Local {
    /// `b`'s rule for this instance under `local`: its share of the fleet's
    /// (`Rule::share`), less, for a concurrency limit, the slots this
    /// instance holds through Redis (none left: every request is refused
    /// until those end).
    fn share_of(&self, b: &Bucket, n: u32) -> crate::store::Rule {
        match b.rule.share(n) {
            crate::store::Rule::Concurrency {
                max_in_flight,
                max_hold,
            } => crate::store::Rule::Concurrency {
                max_in_flight: (max_in_flight - f64::from(self.held.of(&b.key))).max(0.0),
                max_hold,
            },
            rule => rule,
        }
    }

    /// Gives a concurrency slot back to the `local` policy's buckets.
    pub(super) fn release(&self, key: &str, slot: &str) {
        self.buckets.release(key, slot);
    }

    /// Gives units back to the `local` policy's buckets (a negative cost),
    /// and takes them off what is to be written back.
    pub(super) async fn refund(&self, check: &Check) -> Result<(), StoreError> {
        for b in &check.buckets {
            self.write_back.refunded(&b.key, -check.cost);
        }
        self.buckets.check(check).await.map(|_| ())
    }
}

/// The primary store failed on the request's check with `e`: the route's
/// policy answers (`local`: the request's check and outcome become what its
/// buckets charged and answered).
pub(super) fn answer(
    local: &Local,
    closed_retry_after: u64,
    plan: &RoutePlan,
    p: &mut Pending,
    e: &StoreError,
) -> Answer {
    let policy = &plan.policy;
    let limit = &policy.limits[0].name;
    let key = p.shown_id(0).to_string();
    // One WARN a second per route (its policy is the route's); the
    // decisions in between at DEBUG, counted in the next WARN's
    // `suppressed`.
    let log = policy.degraded_log.event();
    macro_rules! degraded_event {
        ($msg:literal; $($fields:tt)*) => {
            match log {
                Some(suppressed) => tracing::warn!(target: "fleetlimit", $($fields)*, suppressed, $msg),
                None => tracing::debug!(target: "fleetlimit", $($fields)*, $msg),
            }
        };
    }
    match policy.on_redis_error {
        FailurePolicy::Open => {
            degraded_event!("served without limiting"; %limit, %key, reason = e.reason(), error = %e, degraded = true, policy = "open");
            Answer::Open
        }
        FailurePolicy::Closed => {
            degraded_event!("refused: limiter unavailable"; %limit, %key, reason = e.reason(), error = %e, degraded = true, policy = "closed");
            Answer::Closed(response::unavailable(limit, closed_retry_after))
        }
        FailurePolicy::Local => {
            // limit ÷ N: each instance's share, assuming the balancer
            // spreads a key's requests evenly. A request costing more
            // than a share is charged the whole share instead, so it can
            // pass when the local bucket is full rather than never.
            let local_check = &mut p.check;
            // The full rules, for the write-back of what is admitted.
            let full: smallvec::SmallVec<[crate::store::Rule; 2]> =
                local_check.buckets.iter().map(|b| b.rule).collect();
            let cost = local_check.cost;
            let n = local.fleet_size();
            for b in &mut local_check.buckets {
                b.rule = local.share_of(b, n);
            }
            let smallest = local_check
                .buckets
                .iter()
                // A concurrency limit takes one slot whatever the cost.
                .filter(|b| !b.rule.is_concurrency())
                .map(|b| b.rule.capacity())
                .fold(f64::INFINITY, f64::min);
            local_check.cost = local_check.cost.min(smallest);
            let outcome = local.buckets.check_now(local_check);
            if outcome.allowed {
                // Charged to Redis once it answers again, at the
                // request's cost, under each limit's full rule.
                let charged = local_check.buckets.iter().zip(&full).zip(&outcome.limits);
                for ((b, rule), s) in charged {
                    if s.enough {
                        let full = Bucket {
                            rule: *rule,
                            ..b.clone()
                        };
                        local.write_back.admitted(&full, cost);
                    }
                }
            }
            let (ls, buckets) = (&outcome.limits, &local_check.buckets);
            let left = requests_left(outcome.allowed, ls, buckets, local_check.cost);
            degraded_event!(
                "decided locally";
                %limit,
                %key,
                reason = e.reason(),
                error = %e,
                degraded = true,
                policy = "local",
                allowed = outcome.allowed,
                remaining = left
            );
            p.outcome = outcome;
            Answer::Decided(DecidedBy::Fallback)
        }
    }
}

/// Whole requests of `cost` left in the limit a decision over `buckets`
/// reports (for a log line: the headers choose from their items, the same
/// way).
fn requests_left(allowed: bool, ls: &[LimitState], buckets: &[Bucket], cost: f64) -> u64 {
    let left = |i: usize| {
        let rule = &buckets[i].rule;
        response::requests(
            ls[i].remaining + rule.slack(),
            response::per_request(rule, cost),
        )
    };
    let i = if allowed {
        let hard = (0..ls.len().min(buckets.len())).filter(|&i| !buckets[i].shadow);
        response::binds_first(hard.map(|i| (i, left(i), ls[i].reset)))
    } else {
        response::refusing(ls, |i| buckets.get(i).is_none_or(|b| b.shadow))
    };
    i.map_or(0, left)
}
