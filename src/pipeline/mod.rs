//! The request path, top to bottom.
//!
//! 0. With `[shedding]` only, [`prepare`]'s `shed` (synchronous): a
//!    request whose route's priority the current pressure sheds is answered
//!    `503` before anything is charged (see `shed/`); an admitted one is
//!    counted in flight until its response is over.
//! 1. [`prepare`] (synchronous, in the service's `call`): the route's
//!    policy, each limit's key, the request's cost. A missing key, an
//!    unknown client address or a custom key its extractor rejects (or
//!    fails to compute) is answered here. A route of one limit that
//!    needs nothing beside its bucket, on the in-process store, is decided
//!    here too, in place ([`lone`]).
//! 2. [`decide`]: the callers' plans, then each limit's rule for the cost
//!    (`413` when it can never fit), then a refusal remembered from Redis,
//!    then the store — the in-process one at once, Redis through hot-key
//!    leases and behind the circuit breaker — and the decision from its
//!    answer.
//! 3. [`fallback`]: when Redis fails, the route's `on_redis_error`
//!    (`open`, `closed` or `local`) decides instead.
//! 4. `crate::answer`: every header and problem body a client sees.
//! 5. [`refund`]: the handle a handler gives unused units back with.
//!
//! Nothing here knows Redis or builds an HTTP response: the layer turns a
//! [`Decision`] into one.

mod challenge;
mod decide;
mod escalate;
mod failures;
mod fallback;
mod held;
mod lease;
mod lone;
mod prepare;
mod refund;
mod refused;
mod slot;
mod trace;
mod writeback;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, OnceLock};

use smallvec::SmallVec;

pub(crate) use self::challenge::Prompted;
pub use self::challenge::{Challenge, ChallengeRequired};
use self::fallback::Fallback;
use self::lease::Leases;
pub(crate) use self::prepare::CostFn;
pub(crate) use self::prepare::{Pending, Prepared};
pub use self::refund::Refund;
use self::refused::RefusedCache;
use crate::answer::{self as response, RateHeaders, RefusalHook, Rejection};
use crate::breaker::{BreakerStats, Breakers};
use crate::config::Config;
use crate::key::{ClientIpRules, CustomKeys, KeyExtractor, KeySecret};
use crate::plan::{PlanResolver, Plans};
use crate::record::{RecordStats, Recorder};
use crate::route::RouteTable;
use crate::shed::{LoadSignal, Shedder, Ticket};
use crate::store::{Bucket, Check, MemoryStore, Outcome, Store, StoreError};

/// One configuration's limiter: its routes, policies and the caches that
/// answer under its numbers, over the [`Core`] every configuration of the
/// layer shares. A reload (see `reload.rs`) swaps it whole; a request in
/// flight keeps the one it started with.
pub(crate) struct Limiter {
    core: Arc<Core>,
    routes: RouteTable,
    client_ip: ClientIpRules,
    /// What decides when the primary store fails (its buckets and fleet
    /// size are the core's).
    fallback: Fallback,
    plans: Plans,
    cost_fns: HashMap<String, CostFn>,
    /// The application's key extractors, for limits keyed `custom:<name>`.
    custom_keys: CustomKeys,
    /// Keys Redis refused, answered here until their `Retry-After`. Per
    /// configuration: a reload starts it empty, so no refusal under old
    /// numbers outlives them.
    refused: RefusedCache,
    /// The "no `MatchedPath`" error was logged (once per configuration).
    unrouted_logged: AtomicBool,
    /// `[headers] style`.
    header_style: response::HeaderStyle,
    /// A missing key's `401` challenge.
    www_authenticate: http::HeaderValue,
    on_refusal: Option<RefusalHook>,
}

/// What lives as long as the layer, whatever configuration it runs: the
/// stores and every bucket in them, the breaker, the fleet size, the
/// shedder, the tasks' stop signal, and what the builder added. Settings
/// these are built from cannot change by a reload.
pub(crate) struct Core {
    prefix: Arc<str>,
    /// API keys are hashed with it in store keys bound for Redis; `None`
    /// when the primary store is the in-process one, whose keys never leave
    /// the process (spared the HMAC on the request path).
    key_secret: Option<KeySecret>,
    /// The primary store: Redis, a store of the user's, or in-process.
    store: Arc<dyn Store>,
    /// The primary store again, when it is the in-process one (decided
    /// without a future).
    in_process: Option<Arc<MemoryStore>>,
    /// In front of a store that can fail (not the in-process one); one per
    /// cluster node.
    breaker: Option<Breakers>,
    /// The `local` policy's buckets and N.
    local: fallback::Local,
    /// Dropped with the last limiter: tells the layer's tasks to stop.
    stop: tokio::sync::watch::Sender<()>,
    /// Places for requests held by `on_exceed = "delay"` at once.
    delayed: Arc<tokio::sync::Semaphore>,
    /// `[escalation] max_delayed`: with `delayed`'s free places, how many
    /// requests are held now (not in flight for shedding).
    max_delayed: usize,
    /// Load shedding (`None`: off, nothing on the request path).
    shed: Option<Arc<Shedder>>,
    /// Concurrency limits' slot ids, unique fleet-wide.
    slot_ids: slot::SlotIds,
    /// Hot keys' token leases: their tokens are already taken from Redis,
    /// so a reload keeps those of limits it leaves unchanged.
    leases: Leases,
    /// Writes the decisions of limits with `record` to Redis (unset: no
    /// Redis, or no limit has recorded yet).
    recorder: OnceLock<Recorder>,
    /// The builder's plan resolver, cost functions and refusal hook, which
    /// every configuration uses.
    extras: Extras,
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

/// What the layer does with the request.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Call the service (see [`Admitted`]).
    Admit(Admitted),
    /// Answer this instead of calling the service.
    Reject(Rejection),
}

impl Decision {
    /// Admitted with these headers (none: nothing was counted) and nothing
    /// else to carry.
    pub(crate) fn admit(headers: Option<RateHeaders>) -> Self {
        Self::Admit(Admitted {
            headers,
            ..Admitted::default()
        })
    }

    /// An admitted request keeps its place in flight (see `shed/`) until
    /// its response is over; a refused one gives it back at once.
    pub(crate) fn with_ticket(mut self, ticket: Option<Ticket>) -> Self {
        self.keep_ticket(ticket);
        self
    }

    /// [`with_ticket`](Self::with_ticket) in place: a decision is too
    /// large to move for nothing.
    #[inline]
    pub(crate) fn keep_ticket(&mut self, ticket: Option<Ticket>) {
        if let (Self::Admit(a), Some(t)) = (self, ticket) {
            a.hold.push(t);
        }
    }
}

/// An admitted request: what goes with it to the handler, onto its
/// response, and beyond.
#[derive(Default)]
pub(crate) struct Admitted {
    /// Added to the service's response.
    pub(crate) headers: Option<RateHeaders>,
    /// Given to the handler (routes with `refund = true`).
    pub(crate) refund: Option<Refund>,
    /// Given to the handler besides the refund handle.
    pub(crate) extensions: http::Extensions,
    /// Kept until the response body has been sent or dropped.
    pub(crate) hold: Hold,
    /// Run with the handler's status, before the response goes out.
    pub(crate) after: Option<After>,
    /// Reshapes a [`ChallengeRequired`] the handler answers.
    pub(crate) on_refusal: Option<RefusalHook>,
}

impl fmt::Debug for Admitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admitted")
            .field("headers", &self.headers)
            .field("refund", &self.refund)
            .field("hold", &self.hold)
            .field("after", &self.after.is_some())
            .finish_non_exhaustive()
    }
}

/// What an admitted request holds until its response is over: guards whose
/// `Drop` gives back what the request took (a concurrency slot, a place in
/// this instance's count of requests in flight). Dropped when the response
/// body ends or is dropped, whichever comes first — so also when the client
/// goes away, the handler panics or the service fails.
#[derive(Default)]
pub(crate) struct Hold(SmallVec<[Box<dyn std::any::Any + Send + Sync>; 1]>);

impl Hold {
    /// Keep `guard` until the response is over.
    pub(crate) fn push(&mut self, guard: impl std::any::Any + Send + Sync) {
        self.0.push(Box::new(guard));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hold({})", self.0.len())
    }
}

/// Work that depends on the handler's answer (a limit that counts only
/// failures gives its unit back for a success): given the status and the
/// response's extensions, the work to finish before the response goes
/// out, if any.
pub(crate) type After = Box<
    dyn FnOnce(
            http::StatusCode,
            &http::Extensions,
        ) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>>
        + Send,
>;

/// A decision that waits on Redis or a plan resolver.
pub(crate) type DecisionFuture = Pin<Box<dyn Future<Output = Decision> + Send + 'static>>;

/// A decision: made at once (in-process store, remembered refusal,
/// missing key) without allocating, or a boxed future.
pub(crate) enum Decided {
    Now(Decision),
    Later(DecisionFuture),
}

/// A request's buckets: one limit per route is the common case, held
/// inline.
type Buckets = SmallVec<[Bucket; 1]>;

/// Which store decided a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DecidedBy {
    /// The primary store.
    Primary,
    /// The `local` failure policy's in-process buckets, the primary store
    /// having failed (logged as `degraded`).
    Fallback,
}

impl DecidedBy {
    fn degraded(self) -> bool {
        self == Self::Fallback
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
    /// Built by the builder, which refuses a custom key without its
    /// extractor (a reload checks the same).
    pub(crate) check_keys: bool,
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
            check_keys: false,
        }
    }
}

impl Limiter {
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
            core,
        }
    }

    /// Whether a configuration may key a limit `custom:<name>`: built by
    /// the builder, only with an extractor registered under `name`; built
    /// without it (`in_memory`, `with_store`), as at construction, always
    /// (such limits answer `503`).
    pub(crate) fn may_key_by(&self, name: &str) -> bool {
        let extras = &self.core.extras;
        !extras.check_keys || extras.key_fns.contains_key(name)
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

    /// Whether refusals are reshaped (a decision still to come must be
    /// passed to [`shape`](Self::shape)).
    pub(crate) fn shapes(&self) -> bool {
        self.on_refusal.is_some()
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
    async fn ask(&self, check: &Check) -> Result<Outcome, StoreError> {
        self.core.ask(check).await
    }
}

impl Core {
    /// The primary store, behind the circuit breaker.
    async fn ask(&self, check: &Check) -> Result<Outcome, StoreError> {
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
    async fn lease(&self, check: &Check, step: f64) -> Result<crate::store::Lease, StoreError> {
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
