//! Step 2: who answers a request's check. In order:
//!
//! 1. a refusal remembered from Redis ([`refused`]), answered here;
//! 2. a primary store that decides at once (the in-process one, through
//!    [`Store::decide_now`]), without a future;
//! 3. otherwise, later: a hot key's lease ([`lease`]), else the primary
//!    store behind its circuit breaker (`crate::breaker`), and when it
//!    fails the route's failure policy ([`fallback`]: `open`, `closed`,
//!    or the `local` buckets, whose admissions are written back once the
//!    store answers again, [`writeback`]).
//!
//! Each gives one [`Answer`], which `settle` turns into the decision. The
//! stores and what answers for them are composed once: [`Stores`] for the
//! layer's life, [`Chain`] per configuration.

mod fallback;
mod held;
pub(super) mod lease;
mod refused;
mod slot;
pub(super) mod writeback;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use tokio::time::Instant;

pub(super) use self::refused::Refused;
use self::refused::RefusedCache;
use self::slot::{Asking, SlotIds};
use super::plan::RoutePlan;
use super::{DecidedBy, Pending};
use crate::algorithm::LimitState;
use crate::answer::Rejection;
use crate::breaker::{BreakerStats, Breakers};
use crate::config::Config;
use crate::record::Recorder;
use crate::region::Runtime;
use crate::store::{Check, Lease, Outcome, Store, StoreError};

/// Who answered a check (see the module guide).
pub(super) enum Answer {
    /// A store decided: the request's `outcome` is its answer to the
    /// request's `check` (the `local` policy's, when `Fallback`).
    Decided(DecidedBy),
    /// A refusal Redis answered earlier, of limit `at`.
    Remembered { at: usize, refused: Refused },
    /// A hot key's lease decided, with the bucket as the lease knows it.
    Leased { admitted: bool, state: LimitState },
    /// The store failed and the route's policy is `open`: served.
    Open,
    /// The store failed and the route's policy is `closed`: this refusal.
    Closed(Rejection),
}

/// The stores of a layer, whatever configuration it runs: the primary one
/// (Redis, a store of the user's, or in-process), its breakers, the hot
/// keys' leases, the `local` policy's buckets and what the request path
/// hands them. Settings these are built from cannot change by a reload.
pub(crate) struct Stores {
    primary: Arc<dyn Store>,
    /// The primary store decides every check at once (the in-process one):
    /// it cannot fail, so it has no breaker, no refused-key cache and no
    /// key digest.
    at_once: bool,
    /// In front of a store that can fail; one per cluster node.
    breaker: Option<Breakers>,
    /// Hot keys' token leases: their tokens are already taken from Redis,
    /// so a reload keeps those of limits it leaves unchanged.
    pub(super) leases: lease::Leases,
    /// The `local` policy's buckets and N.
    local: fallback::Local,
    /// Concurrency limits' slot ids, unique fleet-wide.
    slot_ids: SlotIds,
    /// Global limits' quotas in this region (`None`: no `[regions]` or no
    /// global limit).
    regions: Option<Arc<Runtime>>,
    /// Writes the decisions of limits with `record` to Redis (unset: no
    /// Redis, or no limit has recorded yet).
    recorder: OnceLock<Recorder>,
}

impl Stores {
    pub(super) fn new(
        cfg: &Config,
        primary: Arc<dyn Store>,
        regions: Option<Arc<Runtime>>,
        recorder: Option<Recorder>,
    ) -> Self {
        // A store answers every check at once or none: asked once, empty.
        let mut probe = Outcome {
            allowed: false,
            limits: Vec::new(),
        };
        let empty = Check {
            cost: 0.0,
            buckets: Vec::new(),
            slot: None,
        };
        let at_once = primary.decide_now(&empty, &mut probe);
        let kept = OnceLock::new();
        if let Some(r) = recorder {
            let _ = kept.set(r);
        }
        Self {
            primary,
            at_once,
            breaker: (!at_once).then(|| Breakers::new(cfg.breaker)),
            leases: lease::Leases::new(cfg.memory_max_keys),
            local: fallback::Local::new(cfg),
            slot_ids: SlotIds::new(),
            regions,
            recorder: kept,
        }
    }

    /// Whether the primary store decides at once (and cannot fail).
    pub(super) fn at_once(&self) -> bool {
        self.at_once
    }

    pub(super) fn primary(&self) -> &Arc<dyn Store> {
        &self.primary
    }

    pub(super) fn regions(&self) -> Option<&Runtime> {
        self.regions.as_deref()
    }

    #[inline]
    pub(super) fn recorder(&self) -> Option<&Recorder> {
        self.recorder.get()
    }

    pub(super) fn set_recorder(&self, r: Recorder) {
        let _ = self.recorder.set(r);
    }

    pub(super) fn local(&self) -> &fallback::Local {
        &self.local
    }

    /// The primary store, behind the circuit breaker.
    pub(super) async fn ask(&self, check: &Check) -> Result<Outcome, StoreError> {
        // Per cluster node: the nodes this check goes to.
        let guard = match &self.breaker {
            Some(b) => Some(b.enter(&self.primary.nodes(check))?),
            None => None,
        };
        let answer = self.primary.check(check).await;
        if let Some(g) = guard {
            // A script error on one key's data is an answer from a serving
            // Redis, not a failure of the store.
            g.record(answer.as_ref().err().filter(|e| e.is_availability()));
        }
        answer
    }

    /// A hot key's partial lease of up to `check.cost`, in whole `step`s,
    /// behind the circuit breaker as [`ask`](Self::ask).
    async fn lease(&self, check: &Check, step: f64) -> Result<Lease, StoreError> {
        let guard = match &self.breaker {
            Some(b) => Some(b.enter(&self.primary.nodes(check))?),
            None => None,
        };
        let answer = (self.primary.lease(check, step).await)
            .map(|(granted, state)| Lease { granted, state });
        if let Some(g) = guard {
            g.record(answer.as_ref().err().filter(|e| e.is_availability()));
        }
        answer
    }

    /// Gives `refund`'s units (a negative cost) back to the store that
    /// charged them: the primary one, behind the breaker (while it is open
    /// this fails at once instead of waiting out the deadline), or the
    /// `local` policy's buckets. The primary's answer, when it answered.
    pub(super) async fn give_back(
        &self,
        by: DecidedBy,
        refund: &Check,
    ) -> Result<Option<Outcome>, StoreError> {
        match by {
            DecidedBy::Fallback => self.local.refund(refund).await.map(|()| None),
            DecidedBy::Primary => self.ask(refund).await.map(Some),
        }
    }

    /// Gives a concurrency slot back to the store that took it.
    pub(super) fn release(&self, by: DecidedBy, key: &str, slot: &str) {
        match by {
            DecidedBy::Primary => self.primary.release(key, slot),
            DecidedBy::Fallback => self.local.release(key, slot),
        }
    }

    pub(super) fn breaker_stats(&self) -> Option<BreakerStats> {
        self.breaker.as_ref().map(Breakers::stats)
    }

    pub(super) fn node_breaker_stats(&self) -> Vec<(String, BreakerStats)> {
        self.breaker
            .as_ref()
            .map(Breakers::node_stats)
            .unwrap_or_default()
    }

    /// Keeps the leases and the units to write back of limits `keep`
    /// accepts (by name), under store keys starting `prefix`.
    pub(super) fn keep_limits(&self, prefix: &str, keep: impl Fn(&str) -> bool) {
        self.leases.retain_limits(prefix, &keep);
        self.local.write_back().retain_limits(prefix, &keep);
    }
}

impl writeback::Primary for Stores {
    /// What the `local` policy admitted, to be written back.
    fn write_back(&self) -> &writeback::WriteBack {
        self.local.write_back()
    }

    fn ask<'a>(
        &'a self,
        check: &'a Check,
    ) -> Pin<Box<dyn Future<Output = Result<Outcome, StoreError>> + Send + 'a>> {
        Box::pin(Stores::ask(self, check))
    }
}

/// What answers a check under one configuration: the layer's [`Stores`],
/// the refusals remembered under this configuration's numbers, and its
/// failure policies' settings.
pub(crate) struct Chain {
    pub(super) stores: Arc<Stores>,
    /// Keys Redis refused, answered here until their `Retry-After`. Per
    /// configuration: a reload starts it empty, so no refusal under old
    /// numbers outlives them.
    pub(super) refused: RefusedCache,
    /// `Retry-After` of the `closed` policy's 503, whole seconds.
    closed_retry_after: u64,
}

impl Chain {
    pub(super) fn new(stores: &Arc<Stores>, cfg: &Config) -> Self {
        let remembers = if stores.at_once {
            0
        } else {
            cfg.refused_cache_keys
        };
        Self {
            stores: Arc::clone(stores),
            refused: RefusedCache::new(remembers),
            closed_retry_after: cfg.closed_retry_after.as_secs_f64().ceil().max(1.0) as u64,
        }
    }

    /// What answers at once: a refusal remembered, or a store that never
    /// waits. `None`: ask [`later`](Self::later).
    #[inline(always)]
    pub(super) fn now(&self, plan: &RoutePlan, p: &mut Pending) -> Option<Answer> {
        if let Some(a) = self.remembered(p) {
            return Some(a);
        }
        if plan.slots {
            p.check.slot = self.stores.slot_ids.for_buckets(&p.check.buckets);
        }
        let s = &self.stores;
        let now = s.at_once && s.primary.decide_now(&p.check, &mut p.outcome);
        now.then_some(Answer::Decided(DecidedBy::Primary))
    }

    /// A refusal remembered from Redis under the same numbers, for a limit
    /// that is not soft (shadow mode, escalation).
    #[inline]
    fn remembered(&self, p: &Pending) -> Option<Answer> {
        if !self.refused.is_on() {
            return None;
        }
        let cost = f64::from(p.cost);
        let buckets = p.check.buckets.iter().enumerate();
        buckets
            .filter(|(_, b)| !b.shadow)
            .find_map(|(at, b)| Some((at, self.refused.get(&b.key, cost, &b.rule)?)))
            .map(|(at, refused)| Answer::Remembered { at, refused })
    }

    /// The store that answers later (Redis, or a store of the user's): the
    /// hot key's lease, else the store behind the breaker, else the failure
    /// policy.
    pub(super) async fn later(&self, plan: &RoutePlan, p: &mut Pending) -> Answer {
        // Before Redis is asked: a refusal it answers from before a reset
        // must not be remembered after it.
        p.resets_seen = self.refused.resets();
        p.asked_at = Some(Instant::now());
        if p.quota_unknown {
            let why = "this region's quota of a global limit is not known: its Redis has not been read for too long";
            return self.fall_back(plan, p, &StoreError::Unavailable(why.into()));
        }
        if let Some(a) = lease::take::leased(self, plan, p).await {
            return a;
        }
        // Cancelled, timed out or failed, the script may still have taken
        // a slot: it is given back rather than counted until max_hold.
        let asking = Asking::new(&self.stores.primary, &p.check);
        match self.stores.ask(&p.check).await {
            Ok(o) => {
                asking.answered();
                p.outcome = o;
                Answer::Decided(DecidedBy::Primary)
            }
            Err(e) => {
                // Not sent (breaker open, own queue full): nothing to give
                // back, and a release would only knock on a Redis cut off.
                if matches!(e, StoreError::CircuitOpen | StoreError::Overloaded) {
                    asking.answered();
                } else {
                    drop(asking);
                }
                self.fall_back(plan, p, &e)
            }
        }
    }

    /// The store failed with `e`: the route's failure policy answers.
    fn fall_back(&self, plan: &RoutePlan, p: &mut Pending, e: &StoreError) -> Answer {
        super::trace::degraded();
        let answer = fallback::answer(&self.stores.local, self.closed_retry_after, plan, p, e);
        if matches!(answer, Answer::Decided(_)) {
            // What it admitted goes to Redis once Redis answers.
            writeback::ensure(&self.stores);
        }
        answer
    }
}
