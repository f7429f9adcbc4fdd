//! The limiter: one configuration's routes, policies and caches over the
//! [`Core`] every configuration of the layer shares, and [`Limiter::handle`],
//! the request path's spine (see the module guide in `mod.rs`).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, OnceLock};

use http::Request;

use super::fallback::{self, Fallback};
use super::lease::Leases;
use super::refused::RefusedCache;
use super::{lone, prepare, slot, trace, writeback, CostFn, Decided, Decision};
use crate::answer::{self as response, RefusalHook};
use crate::breaker::{BreakerStats, Breakers};
use crate::config::Config;
use crate::key::{ClientIpRules, CustomKeys, KeyExtractor, KeySecret};
use crate::plan::{PlanResolver, Plans};
use crate::record::{RecordStats, Recorder};
use crate::route::RouteTable;
use crate::shed::{LoadSignal, Shedder, Ticket};
use crate::store::{Check, MemoryStore, Outcome, Store, StoreError};

/// One configuration's limiter: its routes, policies and the caches that
/// answer under its numbers, over the [`Core`] every configuration of the
/// layer shares. A reload (see `reload.rs`) swaps it whole; a request in
/// flight keeps the one it started with.
pub(crate) struct Limiter {
    pub(super) core: Arc<Core>,
    pub(super) routes: RouteTable,
    pub(super) client_ip: ClientIpRules,
    /// What decides when the primary store fails (its buckets and fleet
    /// size are the core's).
    pub(super) fallback: Fallback,
    pub(super) plans: Plans,
    pub(super) cost_fns: HashMap<String, CostFn>,
    /// The application's key extractors, for limits keyed `custom:<name>`.
    pub(super) custom_keys: CustomKeys,
    /// Keys Redis refused, answered here until their `Retry-After`. Per
    /// configuration: a reload starts it empty, so no refusal under old
    /// numbers outlives them.
    pub(super) refused: RefusedCache,
    /// The "no `MatchedPath`" error was logged (once per configuration).
    pub(super) unrouted_logged: AtomicBool,
    /// `[headers] style`.
    pub(super) header_style: response::HeaderStyle,
    /// A missing key's `401` challenge.
    pub(super) www_authenticate: http::HeaderValue,
    pub(super) on_refusal: Option<RefusalHook>,
    /// The in-process store that decides lone routes in place (`lone.rs`):
    /// set when it is the primary store and no cost function can change a
    /// request's cost, worked out once per configuration.
    pub(super) lone: Option<Arc<MemoryStore>>,
}

/// What lives as long as the layer, whatever configuration it runs: the
/// stores and every bucket in them, the breaker, the fleet size, the
/// shedder, the tasks' stop signal, and what the builder added. Settings
/// these are built from cannot change by a reload.
pub(crate) struct Core {
    pub(super) prefix: Arc<str>,
    /// API keys are hashed with it in store keys bound for Redis; `None`
    /// when the primary store is the in-process one, whose keys never leave
    /// the process (spared the digest on the request path).
    pub(super) key_secret: Option<KeySecret>,
    /// The primary store: Redis, a store of the user's, or in-process.
    pub(super) store: Arc<dyn Store>,
    /// The primary store again, when it is the in-process one (decided
    /// without a future).
    pub(super) in_process: Option<Arc<MemoryStore>>,
    /// In front of a store that can fail (not the in-process one); one per
    /// cluster node.
    pub(super) breaker: Option<Breakers>,
    /// The `local` policy's buckets and N.
    pub(super) local: fallback::Local,
    /// Dropped with the last limiter: tells the layer's tasks to stop.
    pub(super) stop: tokio::sync::watch::Sender<()>,
    /// Places for requests held by `on_exceed = "delay"` at once.
    pub(super) delayed: Arc<tokio::sync::Semaphore>,
    /// `[escalation] max_delayed`: with `delayed`'s free places, how many
    /// requests are held now (not in flight for shedding).
    pub(super) max_delayed: usize,
    /// Load shedding (`None`: off, nothing on the request path).
    pub(super) shed: Option<Arc<Shedder>>,
    /// Concurrency limits' slot ids, unique fleet-wide.
    pub(super) slot_ids: slot::SlotIds,
    /// Hot keys' token leases: their tokens are already taken from Redis,
    /// so a reload keeps those of limits it leaves unchanged.
    pub(super) leases: Leases,
    /// Writes the decisions of limits with `record` to Redis (unset: no
    /// Redis, or no limit has recorded yet).
    pub(super) recorder: OnceLock<Recorder>,
    /// Global limits' quotas in this region (`None`: no `[regions]` or no
    /// global limit); kept across reloads, as the exchange that feeds it.
    pub(crate) regions: Option<Arc<crate::region::Runtime>>,
    /// The builder's plan resolver, cost functions and refusal hook, which
    /// every configuration uses.
    pub(super) extras: Extras,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.core.store)
            .field("fleet_size", &self.fleet_size())
            .field("plans", &self.plans)
            .finish_non_exhaustive()
    }
}

/// What the layer builder adds to the configuration.
pub(crate) struct Extras {
    pub(crate) resolver: Option<Arc<dyn PlanResolver>>,
    pub(crate) cost_fns: HashMap<String, CostFn>,
    /// Key extractors by name (`key_fn`).
    pub(crate) key_fns: HashMap<Arc<str>, Arc<dyn KeyExtractor>>,
    /// The application's load signal, for shedding.
    pub(crate) load_signal: Option<Arc<dyn LoadSignal>>,
    /// Reshapes every refusal (`on_refusal`).
    pub(crate) on_refusal: Option<RefusalHook>,
    /// The writer of decision records, started on the layer's Redis.
    pub(crate) recorder: Option<Recorder>,
}

impl Extras {
    pub(crate) fn none() -> Self {
        Self {
            resolver: None,
            cost_fns: HashMap::new(),
            key_fns: HashMap::new(),
            load_signal: None,
            on_refusal: None,
            recorder: None,
        }
    }
}

impl Limiter {
    /// The request path's spine: route → shedding → keys and cost →
    /// decision, then the application's refusal hook and the shedding
    /// ticket, each applied here once, whatever decided.
    pub(crate) fn handle<B>(self: &Arc<Self>, req: &Request<B>) -> Decided {
        let route = prepare::route(self, req);
        let ticket = match prepare::shed(self, req, &route) {
            None => None,
            Some(Ok(ticket)) => Some(ticket),
            Some(Err(shed)) => return Decided::Now(self.shape(shed)),
        };
        let decided = match route.policy.filter(|p| !p.limits.is_empty()) {
            None if ticket.is_none() => return Decided::Unlimited,
            None => Decided::Now(Decision::admit(None)),
            Some(policy) => match &self.lone {
                Some(memory) if policy.traits.lone => {
                    lone::decide(self, req, route.matched, policy, memory)
                }
                _ => match prepare::keys(self, req, route.matched, policy) {
                    ControlFlow::Break(d) => Decided::Now(d),
                    ControlFlow::Continue(p) => trace::traced(route.matched, p, |p| self.decide(p)),
                },
            },
        };
        if ticket.is_none() && self.on_refusal.is_none() {
            return decided;
        }
        self.finish(decided, ticket)
    }

    /// The refusal hook and the ticket onto a decision.
    fn finish(self: &Arc<Self>, decided: Decided, ticket: Option<Ticket>) -> Decided {
        match decided {
            Decided::Now(mut d) => {
                if self.on_refusal.is_some() {
                    d = self.shape(d);
                }
                d.keep_ticket(ticket);
                Decided::Now(d)
            }
            Decided::Later(f) if self.on_refusal.is_none() && ticket.is_none() => Decided::Later(f),
            Decided::Later(f) => {
                let this = Arc::clone(self);
                // Resolved as the service is called (same poll).
                Decided::Later(Box::pin(
                    async move { this.shape(f.await).with_ticket(ticket) },
                ))
            }
            Decided::Unlimited => Decided::Unlimited,
        }
    }

    /// `in_process`: the in-process store, when it is the primary store.
    pub(crate) fn new(
        cfg: &Config,
        store: Arc<dyn Store>,
        in_process: Option<Arc<MemoryStore>>,
        mut extras: Extras,
    ) -> Self {
        let can_fail = in_process.is_none();
        let recorder = OnceLock::new();
        if let Some(r) = extras.recorder.take() {
            let _ = recorder.set(r);
        }
        let core = Core {
            prefix: Arc::clone(&cfg.key_prefix),
            key_secret: can_fail.then(|| cfg.key_secret.clone()),
            store,
            in_process,
            breaker: can_fail.then(|| Breakers::new(cfg.breaker)),
            local: fallback::Local::new(cfg),
            stop: tokio::sync::watch::channel(()).0,
            delayed: Arc::new(tokio::sync::Semaphore::new(cfg.max_delayed)),
            max_delayed: cfg.max_delayed,
            shed: cfg
                .shedding
                .map(|s| Arc::new(Shedder::new(s, extras.load_signal.clone()))),
            slot_ids: slot::SlotIds::new(),
            leases: Leases::new(cfg.memory_max_keys),
            recorder,
            regions: crate::region::Runtime::new(cfg.regions.as_ref(), &cfg.limits),
            extras,
        };
        Self::on(Arc::new(core), cfg)
    }

    /// The limiter of `cfg` on `core` (a new layer's, or a reload's: the
    /// core's buckets and tasks go on under the new configuration).
    pub(crate) fn on(core: Arc<Core>, cfg: &Config) -> Self {
        let can_fail = core.in_process.is_none();
        let extras = &core.extras;
        Self {
            routes: RouteTable::new(&cfg.routes, cfg.default_route.clone()),
            client_ip: cfg.client_ip.clone(),
            fallback: Fallback::new(&core.local, cfg),
            refused: RefusedCache::new(if can_fail { cfg.refused_cache_keys } else { 0 }),
            plans: Plans::new(
                cfg.plan_assignments.0.clone(),
                extras.resolver.clone(),
                cfg.limits
                    .iter()
                    .flat_map(|l| l.plans.keys().cloned())
                    .collect(),
                cfg.plan_cache_ttl,
                cfg.plan_cache_keys,
            ),
            cost_fns: extras.cost_fns.clone(),
            custom_keys: CustomKeys::new(extras.key_fns.clone()),
            unrouted_logged: AtomicBool::new(false),
            header_style: cfg.header_style,
            www_authenticate: cfg.www_authenticate.clone(),
            on_refusal: extras.on_refusal.clone(),
            lone: (core.in_process.clone()).filter(|_| extras.cost_fns.is_empty()),
            core,
        }
    }

    /// Whether a configuration may key a limit `custom:<name>`: only with an
    /// extractor registered under `name`, as at construction.
    pub(crate) fn may_key_by(&self, name: &str) -> bool {
        self.core.extras.key_fns.contains_key(name)
    }

    /// What this limiter shares with the layer's other configurations.
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The application's refusal hook reshapes a refusal.
    #[inline]
    pub(crate) fn shape(&self, d: Decision) -> Decision {
        match (d, &self.on_refusal) {
            (Decision::Reject(r), Some(hook)) => Decision::Reject(r.shape(hook)),
            (d, _) => d,
        }
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.core.store
    }

    pub(crate) fn fleet_size(&self) -> u32 {
        self.core.local.fleet_size()
    }

    /// `fleetlimit reset` of `keys`: forget their remembered refusals and
    /// leases, so their next requests go to Redis.
    pub(crate) fn forget_reset(&self, keys: &[&str]) {
        self.refused.forget(keys);
        self.core.leases.forget(keys);
    }

    /// Forget every remembered refusal and lease (a reset may have been
    /// announced while this instance was not listening).
    pub(crate) fn forget_all_cached(&self) {
        self.refused.clear();
        self.core.leases.clear();
    }

    /// The primary store, behind the circuit breaker.
    pub(super) async fn ask(&self, check: &Check) -> Result<Outcome, StoreError> {
        self.core.ask(check).await
    }
}

impl Core {
    /// The primary store, behind the circuit breaker.
    pub(super) async fn ask(&self, check: &Check) -> Result<Outcome, StoreError> {
        // Per cluster node: the nodes this check goes to.
        let guard = match &self.breaker {
            Some(b) => Some(b.enter(&self.store.nodes(check))?),
            None => None,
        };
        let answer = self.store.check(check).await;
        if let Some(g) = guard {
            // A script error on one key's data is an answer from a serving
            // Redis, not a failure of the store.
            g.record(answer.as_ref().err().filter(|e| e.is_availability()));
        }
        answer
    }

    /// A hot key's partial lease of up to `check.cost`, in whole `step`s,
    /// behind the circuit breaker as [`ask`](Self::ask).
    pub(super) async fn lease(
        &self,
        check: &Check,
        step: f64,
    ) -> Result<crate::store::Lease, StoreError> {
        let guard = match &self.breaker {
            Some(b) => Some(b.enter(&self.store.nodes(check))?),
            None => None,
        };
        let answer = self.store.lease(check, step).await;
        if let Some(g) = guard {
            g.record(answer.as_ref().err().filter(|e| e.is_availability()));
        }
        answer
    }

    /// What the decision recorder has done (`None`: nothing is recorded).
    pub(crate) fn record_stats(&self) -> Option<RecordStats> {
        self.recorder.get().map(Recorder::stats)
    }

    /// Whether the decision recorder runs.
    pub(crate) fn records(&self) -> bool {
        self.recorder.get().is_some()
    }

    /// Keeps the token leases and the units to write back of limits `keep`
    /// accepts (by name), dropping the others' (a reload changed their
    /// numbers or removed them).
    pub(crate) fn keep_leases(&self, keep: impl Fn(&str) -> bool) {
        // The prefix cannot change by a reload.
        self.leases.retain_limits(&self.prefix, &keep);
        writeback::Primary::write_back(self).retain_limits(&self.prefix, &keep);
    }

    /// Sets the decision recorder started after the layer was built (a
    /// reload turned `record` on).
    pub(crate) fn set_recorder(&self, r: Recorder) {
        let _ = self.recorder.set(r);
    }

    /// The shedder, when shedding is on.
    pub(crate) fn shedder(&self) -> Option<&Arc<Shedder>> {
        self.shed.as_ref()
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub(crate) fn breaker_stats(&self) -> Option<BreakerStats> {
        self.breaker.as_ref().map(Breakers::stats)
    }

    pub(crate) fn node_breaker_stats(&self) -> Vec<(String, BreakerStats)> {
        self.breaker
            .as_ref()
            .map(Breakers::node_stats)
            .unwrap_or_default()
    }

    pub(crate) fn fleet_size(&self) -> u32 {
        self.local.fleet_size()
    }

    /// A reload's configured N (without fleet discovery).
    pub(crate) fn set_fleet_size(&self, n: u32) {
        self.local.set_fleet_size(n);
    }

    /// N as the heartbeat keeps it.
    pub(crate) fn fleet_handle(&self) -> &Arc<AtomicU32> {
        self.local.fleet_handle()
    }

    /// Closes when the last limiter on this core is dropped (for the
    /// layer's tasks).
    pub(crate) fn stop_signal(&self) -> tokio::sync::watch::Receiver<()> {
        self.stop.subscribe()
    }
}

impl writeback::Primary for Core {
    /// What the `local` policy admitted, to be written back.
    fn write_back(&self) -> &writeback::WriteBack {
        self.local.write_back()
    }

    fn ask<'a>(
        &'a self,
        check: &'a Check,
    ) -> Pin<Box<dyn Future<Output = Result<Outcome, StoreError>> + Send + 'a>> {
        Box::pin(Core::ask(self, check))
    }
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("store", &self.store)
            .field("fleet_size", &self.fleet_size())
            .finish_non_exhaustive()
    }
}
