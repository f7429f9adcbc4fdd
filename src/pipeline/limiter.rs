//! The limiter: one configuration's route plans, keys and the chain that
//! answers its checks, over the [`Core`] every configuration of the layer
//! shares; and [`Limiter::handle`], the request path's spine (see the
//! module guide in `mod.rs`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use axum::extract::MatchedPath;
use http::Request;

use super::check::{Chain, Stores};
use super::key::{self, CostFn, Keys};
use super::plan::RoutePlan;
use super::settle::{self, settle};
use super::{Decided, Decision, Pending, trace};
use crate::answer::RefusalHook;
use crate::breaker::BreakerStats;
use crate::config::Config;
#[cfg(feature = "rls")]
use crate::config::DescriptorRule;
use crate::key::{CustomKeys, KeyExtractor, KeySecret};
use crate::plan::{PlanResolver, Plans};
use crate::record::{RecordStats, Recorder};
use crate::route::{Policy, RouteTable};
use crate::shed::{LoadSignal, Priority, Shedder, Ticket};
use crate::store::Store;

/// One configuration's limiter: its route plans, keys and the chain that
/// answers under its numbers, over the [`Core`] every configuration of the
/// layer shares. A reload (see `reload.rs`) swaps it whole; a request in
/// flight keeps the one it started with.
pub(crate) struct Limiter {
    core: Arc<Core>,
    routes: RouteTable<Arc<RoutePlan>>,
    keys: Keys,
    chain: Arc<Chain>,
    /// The callers' plans (kept for `Debug`; each route plan that needs
    /// them holds them too).
    plans: Arc<Plans>,
    /// The "no `MatchedPath`" error was logged (once per configuration).
    unrouted_logged: AtomicBool,
    on_refusal: Option<RefusalHook>,
    /// `[[descriptors]]`, each with its plan (`fleetlimit rls`).
    #[cfg(feature = "rls")]
    descriptors: Vec<(Arc<DescriptorRule>, Arc<RoutePlan>)>,
}

/// What lives as long as the layer, whatever configuration it runs: the
/// stores and every bucket in them, the fleet size, the shedder, the tasks'
/// stop signal, and what the builder added. Settings these are built from
/// cannot change by a reload.
pub(crate) struct Core {
    prefix: Arc<str>,
    /// API keys are hashed with it in store keys bound for Redis; `None`
    /// when the primary store decides at once (in-process), whose keys
    /// never leave the process.
    key_secret: Option<KeySecret>,
    /// The primary store and what answers beside it.
    stores: Arc<Stores>,
    /// Dropped with the last limiter: tells the layer's tasks to stop.
    stop: tokio::sync::watch::Sender<()>,
    /// Places for requests held by `on_exceed = "delay"` at once.
    delayed: Arc<tokio::sync::Semaphore>,
    /// `[escalation] max_delayed`: with `delayed`'s free places, how many
    /// requests are held now (not in flight for shedding).
    max_delayed: usize,
    /// Load shedding (`None`: off, nothing on the request path).
    shed: Option<Arc<Shedder>>,
    /// Global limits' quotas in this region (`None`: no `[regions]` or no
    /// global limit); kept across reloads, as the exchange that feeds it.
    pub(crate) regions: Option<Arc<crate::region::Runtime>>,
    /// The builder's plan resolver, cost functions and refusal hook, which
    /// every configuration uses.
    extras: Extras,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("store", self.core.store())
            .field("fleet_size", &self.core.fleet_size())
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
    /// The request path's spine: route plan → shedding → key → check →
    /// settle, then the application's refusal hook and the shedding
    /// ticket, each applied here once, whatever decided.
    #[inline]
    pub(crate) fn handle<B>(&self, req: &Request<B>) -> Decided {
        let matched = req
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str);
        if matched.is_none() && !self.unrouted_logged.load(Ordering::Relaxed) {
            self.check_unrouted(req.uri().path());
        }
        let plan = self.routes.policy_of(matched, req.method());
        self.handle_on(plan, matched, req, None)
    }

    /// [`handle`](Self::handle) once the route's plan is known: shedding,
    /// then key → check → settle; `cost`: a front door's own (see
    /// `key::keys`).
    #[inline(always)]
    fn handle_on<B>(
        &self,
        plan: Option<&Arc<RoutePlan>>,
        matched: Option<&str>,
        req: &Request<B>,
        cost: Option<u32>,
    ) -> Decided {
        let ticket = match &self.core.shed {
            None => None,
            Some(shedder) => {
                let priority = plan.map_or(Priority::Normal, |p| p.policy.priority);
                let (delayed, max) = (&self.core.delayed, self.core.max_delayed);
                match key::shed(shedder, req, priority, delayed, max) {
                    Ok(ticket) => Some(ticket),
                    Err(r) => {
                        let hook = self.on_refusal.as_ref();
                        return Decided::Now(Decision::early(r).shaped(hook));
                    }
                }
            }
        };
        let decided = match plan.filter(|p| !p.limits().is_empty()) {
            None if ticket.is_none() => return Decided::Unlimited,
            None => Decided::Now(Decision::unlimited()),
            Some(plan) => {
                // Written where it stays, not returned through the
                // thread-local's accessor: a decision is large, and each
                // return copied it.
                let mut decided = Decided::Unlimited;
                Pending::with(|p| decided = self.decide(plan, matched, req, cost, p));
                decided
            }
        };
        if ticket.is_none() && self.on_refusal.is_none() {
            return decided;
        }
        self.finish(decided, ticket)
    }

    /// Key → check → settle, for a route with limits; `p`: the thread's
    /// pending request, taken along when the decision waits.
    // Always: each is called once, and the decision (a large value) is
    // then built where it is returned instead of copied up the calls.
    #[inline(always)]
    fn decide<B>(
        &self,
        plan: &Arc<RoutePlan>,
        matched: Option<&str>,
        req: &Request<B>,
        cost: Option<u32>,
        p: &mut Pending,
    ) -> Decided {
        if let Err(r) = key::keys(plan, &self.keys, req, matched, cost, p) {
            return Decided::Now(Decision::early(r));
        }
        match trace::span(matched, plan, p) {
            None => self.check(plan, p),
            Some(span) => {
                let decided = span.in_scope(|| self.check(plan, p));
                trace::close(span, decided)
            }
        }
    }

    /// The check and its settling; a request over a `delay` limit then
    /// waits before the handler.
    #[inline(always)]
    fn check(&self, plan: &Arc<RoutePlan>, p: &mut Pending) -> Decided {
        let mut decided = self.settled(plan, p);
        if plan.delayed.is_some() {
            decided = settle::held(decided);
        }
        decided
    }

    /// At once when the numbers are known and something answers now, else
    /// in a future that owns the request.
    #[inline(always)]
    fn settled(&self, plan: &Arc<RoutePlan>, p: &mut Pending) -> Decided {
        let chain = &self.chain;
        if plan.plans.is_none() {
            if let Err(r) = key::rules(plan, chain.stores.regions(), p) {
                return Decided::Now(Decision::early(r));
            }
            if let Some(answer) = chain.now(plan, p) {
                return Decided::Now(settle(plan, chain, p, answer));
            }
        }
        let (plan, chain, mut p) = (Arc::clone(plan), Arc::clone(chain), p.take());
        Decided::Later(Box::pin(async move {
            if let Some(plans) = &plan.plans {
                key::look_up_plans(plans, &mut p).await;
                if let Err(r) = key::rules(&plan, chain.stores.regions(), &mut p) {
                    return Decision::early(r);
                }
                if let Some(answer) = chain.now(&plan, &mut p) {
                    return settle(&plan, &chain, &p, answer);
                }
            }
            let answer = chain.later(&plan, &mut p).await;
            settle(&plan, &chain, &p, answer)
        }))
    }

    /// The rules of Envoy's descriptors (`[[descriptors]]`), in the
    /// configuration's order, for `rls/` to match a descriptor against.
    #[cfg(feature = "rls")]
    pub(crate) fn descriptor_rules(&self) -> impl Iterator<Item = &DescriptorRule> {
        self.descriptors.iter().map(|(rule, _)| &**rule)
    }

    /// Envoy's front door (`rls/`): a descriptor that matched rule `i` of
    /// [`descriptor_rules`](Self::descriptor_rules), made into `req` (its
    /// entries' values as the request fields its limits read), decided by
    /// the same steps as a request through the layer, at `cost`.
    #[cfg(feature = "rls")]
    pub(crate) fn handle_descriptor<B>(
        &self,
        i: usize,
        req: &Request<B>,
        cost: Option<u32>,
    ) -> Decided {
        let plan = self.descriptors.get(i).map(|(_, plan)| plan);
        self.handle_on(plan, None, req, cost)
    }

    /// The refusal hook and the ticket onto a decision.
    fn finish(&self, decided: Decided, ticket: Option<Ticket>) -> Decided {
        let hook = self.on_refusal.clone();
        match decided {
            Decided::Now(d) => Decided::Now(d.shaped(hook.as_ref()).with_ticket(ticket)),
            // Resolved as the service is called (same poll).
            Decided::Later(f) => Decided::Later(Box::pin(async move {
                f.await.shaped(hook.as_ref()).with_ticket(ticket)
            })),
            Decided::Unlimited => Decided::Unlimited,
        }
    }

    /// A request without `MatchedPath` for a path a configured route names:
    /// the layer is outside the `Router` (the router sets `MatchedPath`
    /// after it), so no route entry can ever apply. Said once per layer.
    /// Paths no route names stay quiet: inside a `Router` they are its
    /// fallback (404s), which carry no `MatchedPath` either.
    #[cold]
    fn check_unrouted(&self, path: &str) {
        let Some(template) = self.routes.template_for(path) else {
            return;
        };
        if self.unrouted_logged.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::error!(
            target: "fleetlimit",
            path,
            route = template,
            reason = "no-matched-path",
            "the request carries no axum MatchedPath, so route {template:?} of the configuration cannot apply \
             and only [default] (if any) limits it: add the layer with `Router::layer` or `Router::route_layer`, \
             not around the Router (ServiceBuilder, `layer.layer(router)`); logged once"
        );
    }

    /// A new layer's limiter of `cfg` on `store`.
    pub(crate) fn new(cfg: &Config, store: Arc<dyn Store>, mut extras: Extras) -> Self {
        let regions = crate::region::Runtime::new(cfg.regions.as_ref(), &cfg.limits);
        let recorder = extras.recorder.take();
        let stores = Arc::new(Stores::new(cfg, store, regions.clone(), recorder));
        let core = Core {
            prefix: Arc::clone(&cfg.key_prefix),
            key_secret: (!stores.at_once()).then(|| cfg.key_secret.clone()),
            stores,
            stop: tokio::sync::watch::channel(()).0,
            delayed: Arc::new(tokio::sync::Semaphore::new(cfg.max_delayed)),
            max_delayed: cfg.max_delayed,
            shed: cfg
                .shedding
                .map(|s| Arc::new(Shedder::new(s, extras.load_signal.clone()))),
            regions,
            extras,
        };
        Self::on(Arc::new(core), cfg)
    }

    /// The limiter of `cfg` on `core` (a new layer's, or a reload's: the
    /// core's buckets and tasks go on under the new configuration). Each
    /// route's plan is compiled here.
    pub(crate) fn on(core: Arc<Core>, cfg: &Config) -> Self {
        let extras = &core.extras;
        let plans = Arc::new(Plans::new(
            cfg.plan_assignments.0.clone(),
            extras.resolver.clone(),
            cfg.limits
                .iter()
                .flat_map(|l| l.plans.keys().cloned())
                .collect(),
            cfg.plan_cache_ttl,
            cfg.plan_cache_keys,
        ));
        let on_refusal = extras.on_refusal.clone();
        let compile = |policy: &Arc<Policy>| {
            let hook = on_refusal.clone();
            Arc::new(RoutePlan::new(
                policy,
                cfg.header_style,
                hook,
                &plans,
                &core.delayed,
            ))
        };
        Self {
            #[cfg(feature = "rls")]
            descriptors: (cfg.descriptors.iter())
                .map(|d| (Arc::clone(d), compile(&d.policy)))
                .collect(),
            routes: RouteTable::new(&cfg.routes, cfg.default_route.as_ref(), compile),
            keys: Keys {
                client_ip: cfg.client_ip.clone(),
                custom: CustomKeys::new(extras.key_fns.clone()),
                secret: core.key_secret.clone(),
                www_authenticate: cfg.www_authenticate.clone(),
                cost_fns: extras.cost_fns.clone(),
            },
            chain: Arc::new(Chain::new(&core.stores, cfg)),
            plans,
            unrouted_logged: AtomicBool::new(false),
            on_refusal,
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

    /// `fleetlimit reset` of `keys`: forget their remembered refusals and
    /// leases, so their next requests go to Redis.
    pub(crate) fn forget_reset(&self, keys: &[&str]) {
        self.chain.refused.forget(keys);
        self.core.stores.leases.forget(keys);
    }

    /// Forget every remembered refusal and lease (a reset may have been
    /// announced while this instance was not listening).
    pub(crate) fn forget_all_cached(&self) {
        self.chain.refused.clear();
        self.core.stores.leases.clear();
    }
}

impl Core {
    /// What the decision recorder has done (`None`: nothing is recorded).
    pub(crate) fn record_stats(&self) -> Option<RecordStats> {
        self.stores.recorder().map(Recorder::stats)
    }

    /// Whether the decision recorder runs.
    pub(crate) fn records(&self) -> bool {
        self.stores.recorder().is_some()
    }

    /// Keeps the token leases and the units to write back of limits `keep`
    /// accepts (by name), dropping the others' (a reload changed their
    /// numbers or removed them).
    pub(crate) fn keep_leases(&self, keep: impl Fn(&str) -> bool) {
        // The prefix cannot change by a reload.
        self.stores.keep_limits(&self.prefix, keep);
    }

    /// Sets the decision recorder started after the layer was built (a
    /// reload turned `record` on).
    pub(crate) fn set_recorder(&self, r: Recorder) {
        self.stores.set_recorder(r);
    }

    /// The shedder, when shedding is on.
    pub(crate) fn shedder(&self) -> Option<&Arc<Shedder>> {
        self.shed.as_ref()
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        self.stores.primary()
    }

    pub(crate) fn breaker_stats(&self) -> Option<BreakerStats> {
        self.stores.breaker_stats()
    }

    pub(crate) fn node_breaker_stats(&self) -> Vec<(String, BreakerStats)> {
        self.stores.node_breaker_stats()
    }

    pub(crate) fn fleet_size(&self) -> u32 {
        self.stores.local().fleet_size()
    }

    /// A reload's configured N (without fleet discovery).
    pub(crate) fn set_fleet_size(&self, n: u32) {
        self.stores.local().set_fleet_size(n);
    }

    /// N as the heartbeat keeps it.
    pub(crate) fn fleet_handle(&self) -> &Arc<AtomicU32> {
        self.stores.local().fleet_handle()
    }

    /// Closes when the last limiter on this core is dropped (for the
    /// layer's tasks).
    pub(crate) fn stop_signal(&self) -> tokio::sync::watch::Receiver<()> {
        self.stop.subscribe()
    }
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("store", self.store())
            .field("fleet_size", &self.fleet_size())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use http::StatusCode;
    use tower::ServiceExt;

    use super::*;
    use crate::algorithm::LimitState;
    use crate::store::{Check, Outcome, StoreFuture};

    /// A store that refuses every request for 10 s, counting its checks.
    #[derive(Debug, Default)]
    struct Refusing(AtomicUsize);

    impl Store for Refusing {
        fn check(&self, check: &Check) -> StoreFuture {
            self.0.fetch_add(1, Ordering::Relaxed);
            let refused = LimitState {
                enough: false,
                remaining: 0.0,
                wait: 10.0,
                reset: 10.0,
                capacity: 5.0,
            };
            let limits = vec![refused; check.buckets.len()];
            Box::pin(async move {
                Ok(Outcome {
                    allowed: false,
                    limits,
                })
            })
        }
    }

    /// A cost no bucket can hold is 413 whatever the refused cache holds
    /// for the key (it used to answer the remembered 429 on routes without
    /// plans, and 413 on routes with plans).
    #[tokio::test]
    async fn too_costly_is_413_even_for_a_refused_key() {
        let cfg = Config::from_toml_str(
            r#"
            [limits.per-key]
            key = "header:x-api-key"
            capacity = 5
            refill = "1/s"

            [default]
            limits = ["per-key"]
            "#,
        )
        .unwrap();
        let mut extras = Extras::none();
        let cost: CostFn = Arc::new(|r| {
            let cost = r.headers().get("x-cost").and_then(|v| v.to_str().ok());
            cost.and_then(|c| c.parse().ok()).unwrap_or(1)
        });
        extras.cost_fns.insert("/".into(), cost);
        let store = Arc::new(Refusing::default());
        let limiter = Arc::new(Limiter::new(&cfg, store.clone(), extras));
        // The limiter called from inside a router, so the request carries
        // its `MatchedPath` (and the cost function applies): its status.
        let decide = move |req: Request<Body>| {
            let limiter = Arc::clone(&limiter);
            async move {
                let d = match limiter.handle(&req) {
                    Decided::Now(d) => d,
                    Decided::Later(f) => f.await,
                    Decided::Unlimited => panic!("a limited route"),
                };
                d.refused_status().unwrap_or(StatusCode::OK)
            }
        };
        let app = Router::new().route("/", get(decide));
        let status = |cost: u32| {
            let req = Request::get("/")
                .header("x-api-key", "k")
                .header("x-cost", cost)
                .body(Body::empty())
                .unwrap();
            let app = app.clone();
            async move { app.oneshot(req).await.unwrap().status() }
        };
        let asked = || store.0.load(Ordering::Relaxed);
        assert_eq!(status(1).await, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(asked(), 1, "refused by the store");
        assert_eq!(status(1).await, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(asked(), 1, "remembered");
        assert_eq!(status(6).await, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(asked(), 1);
    }
}
