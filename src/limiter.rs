//! The request path, top to bottom: route → key → store → decision.
//!
//! [`Limiter::plan`] does the synchronous part (find the route's policy,
//! extract each limit's key, build the store keys once);
//! [`Limiter::decide`] resolves plans, asks the store and, when the store
//! fails, applies the route's failure policy. Neither knows Redis or builds
//! responses beyond a [`Rejection`]: the layer turns a [`Decision`] into one.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::MatchedPath;
use http::{Request, StatusCode};
use smallvec::SmallVec;

use crate::algorithm::Rule;
use crate::breaker::{BreakerStats, Breakers};
use crate::config::{Config, FailurePolicy, OnMissing};
use crate::headers::{json_str, RateHeaders, Rejection};
use crate::key::{ClientIpRules, Extracted, KeyMaterial, KeySecret, LogId};
use crate::lease::{LeaseUse, Leases};
use crate::outcome::{reported, retry_after_secs, LimitState, Outcome};
use crate::plan::{PlanResolver, Plans};
use crate::refused::{Refused, RefusedCache};
use crate::route::{Policy, RouteTable};
use crate::store::{Bucket, Check, MemoryStore, Store, StoreError};
use crate::RequestRef;

/// Computes a request's cost (see [`RateLimitLayerBuilder::cost_fn`](crate::layer::RateLimitLayerBuilder::cost_fn)).
pub type CostFn = Arc<dyn Fn(&RequestRef<'_>) -> u32 + Send + Sync>;

pub(crate) struct Limiter {
    routes: RouteTable,
    client_ip: ClientIpRules,
    prefix: Arc<str>,
    /// API keys are hashed with it in store keys bound for Redis; `None`
    /// when the primary store is the in-process one, whose keys never leave
    /// the process (spared the HMAC on the request path).
    key_secret: Option<KeySecret>,
    store: Arc<dyn Store>,
    fallback: MemoryStore,
    closed_retry_after: u64,
    plans: Plans,
    cost_fns: HashMap<String, CostFn>,
    /// In front of a store that can fail (not the in-process one); one per
    /// cluster node.
    breaker: Option<Breakers>,
    /// N for the `local` fallback: configured, or kept up to date by the
    /// heartbeat (and kept at its last value while Redis is down).
    fleet: Arc<AtomicU32>,
    /// Keys Redis refused, answered here until their `Retry-After`.
    refused: RefusedCache,
    /// Hot keys' token leases.
    leases: Leases,
    /// The primary store again, when it is the in-process one (decided
    /// without a future).
    local: Option<Arc<MemoryStore>>,
    /// The "no `MatchedPath`" error was logged (once per layer).
    unrouted_logged: AtomicBool,
    /// Dropped with the limiter: tells its reset listener to stop.
    stop: tokio::sync::watch::Sender<()>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.store)
            .field("fleet_size", &self.fleet_size())
            .field("plans", &self.plans)
            .finish_non_exhaustive()
    }
}

/// What the synchronous half found.
pub(crate) enum Plan {
    /// No limit applies to this route.
    Unlimited,
    /// Answered without the store (missing key, unknown client IP).
    Now(Decision),
    /// Ask the store.
    Ask(Pending),
}

pub(crate) struct Pending {
    policy: Arc<Policy>,
    cost: u32,
    keys: SmallVec<[PendingKey; 1]>,
    /// Each key's log id, kept after the keys move into the buckets.
    log_ids: SmallVec<[LogId; 1]>,
    /// The refused cache's resets when Redis was asked (see `reset.rs`).
    resets_seen: u64,
}

/// A request's buckets: one limit per route is the common case, held
/// inline.
type Buckets = SmallVec<[Bucket; 1]>;

struct PendingKey {
    key: String,
    /// The key value plans are looked up by, for limits that have plans.
    plan_key: Option<String>,
    /// The caller's plan, once looked up.
    plan: Option<Arc<str>>,
}

/// The store check of a request, each limit on the caller's plan (the
/// key strings move into it); or the answer when the cost can never fit.
// The refusal is rare and built once; boxing it would cost every caller.
#[allow(clippy::result_large_err)]
fn check_for(p: &mut Pending) -> Result<Check, Decision> {
    Ok(Check {
        cost: f64::from(p.cost),
        buckets: buckets_for(p)?.into_vec(),
    })
}

/// [`check_for`]'s buckets, without a vector for a single limit.
#[allow(clippy::result_large_err)]
fn buckets_for(p: &mut Pending) -> Result<Buckets, Decision> {
    let mut buckets = Buckets::with_capacity(p.keys.len());
    for (limit, k) in p.policy.limits.iter().zip(p.keys.drain(..)) {
        let rule = limit.rule_for(k.plan.as_deref());
        let shadow = limit.shadow || p.policy.shadow;
        if f64::from(p.cost) > rule.capacity() && !shadow {
            return Err(too_costly(limit, p.cost, rule.capacity()));
        }
        buckets.push(Bucket {
            key: k.key,
            rule,
            shadow,
        });
    }
    Ok(buckets)
}

/// What the layer does with the request.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Call the service; add these headers to its response, and give the
    /// handler this refund handle.
    Admit(Option<RateHeaders>, Option<Refund>),
    /// Answer this instead of calling the service.
    Reject(Rejection),
}

/// A decision that waits on Redis or a plan resolver.
pub(crate) type DecisionFuture = Pin<Box<dyn Future<Output = Decision> + Send + 'static>>;

/// A decision: made at once (in-process store, remembered refusal,
/// missing key) without allocating, or a boxed future.
pub(crate) enum Decided {
    Now(Decision),
    Later(DecisionFuture),
}

pub(crate) struct Extras {
    pub(crate) resolver: Option<Arc<dyn PlanResolver>>,
    pub(crate) cost_fns: HashMap<String, CostFn>,
}

impl Extras {
    pub(crate) fn none() -> Self {
        Self {
            resolver: None,
            cost_fns: HashMap::new(),
        }
    }
}

impl Limiter {
    /// `local`: the in-process store, when it is the primary store.
    pub(crate) fn new(
        cfg: &Config,
        store: Arc<dyn Store>,
        local: Option<Arc<MemoryStore>>,
        extras: Extras,
    ) -> Self {
        let store_is_local = local.is_some();
        Self {
            routes: RouteTable::new(&cfg.routes, cfg.default_route.clone()),
            client_ip: cfg.client_ip.clone(),
            prefix: Arc::clone(&cfg.key_prefix),
            key_secret: (!store_is_local).then(|| cfg.key_secret.clone()),
            store,
            fallback: MemoryStore::new(cfg.memory_max_keys),
            fleet: Arc::new(AtomicU32::new(cfg.fleet_size)),
            breaker: (!store_is_local).then(|| Breakers::new(cfg.breaker)),
            refused: RefusedCache::new(if store_is_local {
                0
            } else {
                cfg.refused_cache_keys
            }),
            leases: Leases::new(cfg.memory_max_keys),
            local,
            stop: tokio::sync::watch::channel(()).0,
            closed_retry_after: cfg.closed_retry_after.as_secs_f64().ceil().max(1.0) as u64,
            plans: Plans::new(
                cfg.plan_assignments.0.clone(),
                extras.resolver,
                cfg.plan_cache_ttl,
                cfg.plan_cache_keys,
            ),
            cost_fns: extras.cost_fns,
            unrouted_logged: AtomicBool::new(false),
        }
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
        self.fleet.load(Ordering::Relaxed).max(1)
    }

    pub(crate) fn fleet_handle(&self) -> &Arc<AtomicU32> {
        &self.fleet
    }

    /// Closes when the limiter is dropped (for its reset listener).
    pub(crate) fn stop_signal(&self) -> tokio::sync::watch::Receiver<()> {
        self.stop.subscribe()
    }

    /// `fleetlimit reset` of `keys`: forget their remembered refusals and
    /// leases, so their next requests go to Redis.
    pub(crate) fn forget_reset(&self, keys: &[&str]) {
        self.refused.forget(keys);
        self.leases.forget(keys);
    }

    /// Forget every remembered refusal and lease (a reset may have been
    /// announced while this instance was not listening).
    pub(crate) fn forget_all_cached(&self) {
        self.refused.clear();
        self.leases.clear();
    }

    /// Route → policy → keys.
    pub(crate) fn plan<B>(&self, req: &Request<B>) -> Plan {
        let matched = req
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str);
        if matched.is_none() && !self.unrouted_logged.load(Ordering::Relaxed) {
            self.check_unrouted(req.uri().path());
        }
        let Some(policy) = self.routes.lookup(matched, req.method()) else {
            return Plan::Unlimited;
        };
        let (headers, ext) = (req.headers(), req.extensions());
        // The client IP is resolved once, and only if some limit needs it.
        let mut ip: Option<Option<IpAddr>> = None;
        let mut client_ip = || *ip.get_or_insert_with(|| self.client_ip.client_ip(headers, ext));

        let mut keys = SmallVec::with_capacity(policy.limits.len());
        let mut log_ids = SmallVec::with_capacity(policy.limits.len());
        for limit in &policy.limits {
            let peer = if limit.key.needs_ip() {
                client_ip()
            } else {
                None
            };
            let material = match limit.key.extract(headers, ext, peer) {
                Extracted::Found(m) => m,
                Extracted::Missing => match limit.on_missing {
                    OnMissing::Ip => match client_ip() {
                        Some(ip) => KeyMaterial::ip(ip),
                        None => return Plan::Now(no_client_ip(limit)),
                    },
                    OnMissing::Reject => return Plan::Now(missing_key(limit)),
                },
                Extracted::NoClientIp => return Plan::Now(no_client_ip(limit)),
            };
            let plans = !limit.plans.is_empty();
            let k = material.store_key(&self.prefix, &limit.name, self.key_secret.as_ref(), plans);
            log_ids.push(k.log_id());
            keys.push(PendingKey {
                key: k.key,
                plan_key: k.plan_key,
                plan: None,
            });
        }
        let cost_fn = if self.cost_fns.is_empty() {
            None
        } else {
            matched.and_then(|m| self.cost_fns.get(m))
        };
        let cost = match cost_fn {
            // At least one unit, as a fixed cost must be: a computed 0 would
            // be free and never refused (`?pages=0`).
            Some(f) => f(&RequestRef::new(req)).max(1),
            None => policy.cost,
        };
        Plan::Ask(Pending {
            policy: Arc::clone(policy),
            cost,
            keys,
            log_ids,
            resets_seen: 0,
        })
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

    /// Plans → store → decision, with the failure policy when the store
    /// fails. On a `refund = true` route every admitted request carries a
    /// [`Refund`], a no-op one when nothing can be given back (admitted by
    /// the `open` policy, from a lease, in shadow mode), so a handler can
    /// take `Extension<Refund>` without a 500 on those paths.
    pub(crate) fn decide(self: &Arc<Self>, p: Pending) -> Decided {
        if !p.policy.refund {
            return self.decide_in_store(p);
        }
        match self.decide_in_store(p) {
            Decided::Now(d) => Decided::Now(with_refund(d)),
            Decided::Later(f) => Decided::Later(Box::pin(async move { with_refund(f.await) })),
        }
    }

    fn decide_in_store(self: &Arc<Self>, mut p: Pending) -> Decided {
        let has_plans = p.policy.limits.iter().any(|l| !l.plans.is_empty());
        // Without plans every rule is known now: a remembered refusal is
        // answered without boxing a future or touching Redis.
        if !has_plans {
            let rules = p.policy.limits.iter().map(|l| l.rule);
            if let Some(d) = self.refused_here(&p, p.keys.iter().map(|k| k.key.as_str()).zip(rules))
            {
                return Decided::Now(d);
            }
            // The in-process store never waits: decide here, no future.
            if let Some(memory) = &self.local {
                return Decided::Now(self.decide_locally(memory, &mut p));
            }
        }
        let this = Arc::clone(self);
        Decided::Later(Box::pin(async move {
            for k in &mut p.keys {
                if let Some(pk) = &k.plan_key {
                    k.plan = this.plans.plan_of(pk).await;
                }
            }
            let check = match check_for(&mut p) {
                Ok(check) => check,
                Err(d) => return d,
            };
            if has_plans {
                // After plan resolution: a refusal under other numbers (the
                // caller changed plan) no longer counts.
                let items = check.buckets.iter().map(|b| (b.key.as_str(), b.rule));
                if let Some(d) = this.refused_here(&p, items) {
                    return d;
                }
            }
            // Before Redis is asked: a refusal it answers from before a
            // reset must not be remembered after it.
            p.resets_seen = this.refused.resets();
            if let Some(d) = this.leased(&p, &check).await {
                return d;
            }
            match this.ask(&check).await {
                Ok(outcome) => this.from_outcome(&p, check, &outcome, false),
                Err(e) => this.degraded(&p, check, &e),
            }
        }))
    }

    /// The in-process store as the primary store, for routes without plans:
    /// the same steps as `decide`, synchronously.
    fn decide_locally(self: &Arc<Self>, memory: &MemoryStore, p: &mut Pending) -> Decision {
        let buckets = match buckets_for(p) {
            Ok(buckets) => buckets,
            Err(d) => return d,
        };
        let cost = f64::from(p.cost);
        if let [bucket] = buckets.as_slice() {
            // No check or outcome vectors for a single limit.
            let (allowed, state) = memory.check_one(bucket, cost);
            return self.decision_from(p, cost, buckets, allowed, &[state], false);
        }
        let check = Check {
            cost,
            buckets: buckets.into_vec(),
        };
        let outcome = memory.check_now(&check);
        self.from_outcome(p, check, &outcome, false)
    }

    /// The store, behind the circuit breaker.
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

    /// Hot-key leases (see `lease.rs`): a request of a hot key is admitted
    /// from this instance's lease, or takes a new lease for the next ones.
    /// `None`: decide as usual.
    async fn leased(self: &Arc<Self>, p: &Pending, check: &Check) -> Option<Decision> {
        let ([limit], [bucket]) = (p.policy.limits.as_slice(), check.buckets.as_slice()) else {
            return None;
        };
        let lease = limit
            .lease
            .filter(|_| self.local.is_none() && !bucket.shadow)?;
        let Rule::TokenBucket {
            capacity,
            refill_per_sec,
        } = bucket.rule
        else {
            return None;
        };
        match self.leases.use_for(&bucket.key, check.cost, lease.above) {
            LeaseUse::Normal => None,
            LeaseUse::Spent {
                lease_left,
                shared_left,
            } => {
                // What this key can still spend: its lease here, and what
                // Redis had left when the lease was taken.
                let remaining = (lease_left + shared_left).min(capacity);
                let headers =
                    RateHeaders::new(capacity, remaining, (capacity - remaining) / refill_per_sec);
                Some(Decision::Admit(Some(headers), None))
            }
            LeaseUse::Take => {
                let batch = f64::from(lease.batch).max(check.cost);
                let take = Check {
                    cost: batch,
                    buckets: check.buckets.clone(),
                };
                // Clears the key's "taking" mark however this ends, even if
                // this future is dropped while Redis is asked.
                let claim = self.leases.claim(&bucket.key);
                let seen = self.leases.resets();
                match self.ask(&take).await {
                    Ok(o) if o.allowed => {
                        claim.disarm();
                        let extra = batch - check.cost;
                        self.leases
                            .granted(&bucket.key, extra, o.limits[0].remaining, seen);
                        let mut o = o;
                        o.limits[0].remaining += extra;
                        // Its refund would give back the whole lease: none.
                        Some(match self.from_outcome(p, check.clone(), &o, false) {
                            Decision::Admit(h, _) => Decision::Admit(h, None),
                            d => d,
                        })
                    }
                    // Not enough for a whole lease: ask for this request
                    // alone, as usual.
                    Ok(_) => None,
                    // Redis failed: the failure policy answers now, rather
                    // than a second call into the same outage.
                    Err(e) => Some(self.degraded(p, check.clone(), &e)),
                }
            }
        }
    }

    fn from_outcome(
        self: &Arc<Self>,
        p: &Pending,
        check: Check,
        o: &Outcome,
        local: bool,
    ) -> Decision {
        let buckets = Buckets::from_vec(check.buckets);
        self.decision_from(p, check.cost, buckets, o.allowed, &o.limits, local)
    }

    /// The decision for a store's answer: `allowed`, and each bucket's
    /// state (`limits`, in the order of `buckets`).
    fn decision_from(
        self: &Arc<Self>,
        p: &Pending,
        cost: f64,
        buckets: Buckets,
        allowed: bool,
        limits: &[LimitState],
        local: bool,
    ) -> Decision {
        let shadow = |i: usize| buckets[i].shadow;
        for (i, s) in limits.iter().enumerate() {
            if shadow(i) && !s.enough {
                tracing::info!(
                    target: "fleetlimit",
                    limit = %p.policy.limits[i].name,
                    key = %p.log_ids[i],
                    remaining = s.remaining.floor().max(0.0),
                    reason = "limit-exceeded",
                    degraded = local,
                    shadow = true,
                    "would refuse (shadow mode: served)"
                );
            }
        }
        let Some(i) = reported(allowed, limits, shadow) else {
            return Decision::Admit(None, None);
        };
        let s = limits[i];
        let headers = RateHeaders::new(s.capacity, s.remaining, s.reset);
        if allowed {
            // Opt-in per route: the handle is an allocation and an
            // extension insert on every admitted request.
            let refund = if p.policy.refund {
                Refund::new(self, buckets, limits, p.cost, local)
            } else {
                None
            };
            return Decision::Admit(Some(headers), refund);
        }
        let limit = &p.policy.limits[i];
        let key = &buckets[i].key;
        if !local {
            // Remember the refusal: until it can succeed, this instance
            // answers the key by itself (see `refused.rs`).
            let now = tokio::time::Instant::now();
            let secs = |x: f64| Duration::from_secs_f64(x.clamp(0.0, 86_400.0 * 365.0));
            self.refused.insert(
                key,
                secs(s.wait),
                Refused {
                    until: now,
                    cost,
                    rule: buckets[i].rule,
                    headers,
                    full_at: now + secs(s.reset),
                },
                p.resets_seen,
            );
        }
        refusal(
            limit,
            p.log_ids[i],
            headers,
            retry_after_secs(s.wait),
            local,
            false,
        )
    }

    /// A refusal remembered from Redis under the same rule, for a limit
    /// that is not in shadow mode.
    fn refused_here<'k>(
        &self,
        p: &Pending,
        keys: impl Iterator<Item = (&'k str, Rule)>,
    ) -> Option<Decision> {
        for ((limit, (key, rule)), &id) in p.policy.limits.iter().zip(keys).zip(&p.log_ids) {
            if limit.shadow || p.policy.shadow {
                continue;
            }
            if let Some(r) = self
                .refused
                .get(key, f64::from(p.cost))
                .filter(|r| r.rule == rule)
            {
                let now = tokio::time::Instant::now();
                let left = |t: tokio::time::Instant| t.saturating_duration_since(now).as_secs_f64();
                let headers = RateHeaders {
                    reset: left(r.full_at).ceil() as u64,
                    ..r.headers
                };
                return Some(refusal(
                    limit,
                    id,
                    headers,
                    retry_after_secs(left(r.until)),
                    false,
                    true,
                ));
            }
        }
        None
    }

    /// Redis failed: the route's failure policy decides. Never a 500.
    fn degraded(self: &Arc<Self>, p: &Pending, check: Check, e: &StoreError) -> Decision {
        let limit = &p.policy.limits[0].name;
        // One WARN a second per route (its policy is the route's); the
        // decisions in between at DEBUG, counted in the next WARN's
        // `suppressed`.
        let log = p.policy.degraded_log.event();
        macro_rules! degraded_event {
            ($msg:literal; $($fields:tt)*) => {
                match log {
                    Some(suppressed) => tracing::warn!(target: "fleetlimit", $($fields)*, suppressed, $msg),
                    None => tracing::debug!(target: "fleetlimit", $($fields)*, $msg),
                }
            };
        }
        match p.policy.on_redis_error {
            FailurePolicy::Open => {
                degraded_event!("served without limiting"; %limit, key = %p.log_ids[0], reason = e.reason(), error = %e, degraded = true, policy = "open");
                Decision::Admit(None, None)
            }
            FailurePolicy::Closed => {
                degraded_event!("refused: limiter unavailable"; %limit, key = %p.log_ids[0], reason = e.reason(), error = %e, degraded = true, policy = "closed");
                Decision::Reject(
                    Rejection::problem(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the rate limiter cannot decide right now; retry shortly",
                        &[("limit", json_str(limit))],
                    )
                    .retry_after(self.closed_retry_after),
                )
            }
            FailurePolicy::Local => {
                // limit ÷ N: each instance's share, assuming the balancer
                // spreads a key's requests evenly. A request costing more
                // than a share is charged the whole share instead, so it can
                // pass when the local bucket is full rather than never.
                let mut local = check;
                for b in &mut local.buckets {
                    b.rule = b.rule.share(self.fleet_size());
                }
                let smallest = local
                    .buckets
                    .iter()
                    .map(|b| b.rule.capacity())
                    .fold(f64::INFINITY, f64::min);
                local.cost = local.cost.min(smallest);
                let outcome = self.fallback.check_now(&local);
                let s = outcome
                    .reported(|i| local.buckets[i].shadow)
                    .map(|i| outcome.limits[i]);
                degraded_event!(
                    "decided locally";
                    %limit,
                    key = %p.log_ids[0],
                    reason = e.reason(),
                    error = %e,
                    degraded = true,
                    policy = "local",
                    allowed = outcome.allowed,
                    remaining = s.map_or(0.0, |s| s.remaining.floor())
                );
                self.from_outcome(p, local, &outcome, true)
            }
        }
    }
}

/// An admitted request of a refund route without a handle gets a no-op one.
fn with_refund(d: Decision) -> Decision {
    match d {
        Decision::Admit(h, None) => Decision::Admit(h, Some(Refund::none())),
        d => d,
    }
}

/// Gives back units an admitted request did not need (its real cost was
/// lower than it was charged). On routes that ask for it (`refund = true`
/// in the route's TOML, [`RouteConfig::refund`](crate::config::RouteConfig::refund)
/// in code), the layer puts one in the extensions of every admitted,
/// limited request, so a handler can take `Extension<Refund>`; other routes
/// carry none (the handle costs an allocation and an extension insert per
/// request).
///
/// When nothing was charged in a store that could take units back (the
/// request was admitted by `on_redis_error = "open"` while Redis was down,
/// from a hot key's lease, or by a limit in shadow mode) the handle is a
/// no-op: [`refundable`](Self::refundable) is `0` and
/// [`give_back`](Self::give_back) returns `Ok(())` and does nothing. A
/// request admitted by the `local` policy gives back to the in-process
/// buckets that charged it.
///
/// ```toml
/// [[routes]]
/// path = "/search"
/// limits = ["per-key"]
/// cost = 5
/// refund = true
/// ```
///
/// ```
/// use axum::Extension;
/// use fleetlimit::Refund;
///
/// async fn search(Extension(refund): Extension<Refund>) -> &'static str {
///     let cheap = true; // found in the cache, say
///     if cheap {
///         // Charged the route's cost (e.g. 5); the real cost was 2.
///         let _ = refund.give_back(3).await;
///     }
///     "results"
/// }
/// ```
#[derive(Clone)]
pub struct Refund {
    /// `None`: the no-op handle (nothing was charged that can be given back).
    inner: Option<Arc<RefundInner>>,
}

struct RefundInner {
    limiter: Arc<Limiter>,
    /// Only the buckets that were charged.
    buckets: Buckets,
    local: bool,
    left: AtomicU32,
}

impl Refund {
    fn new(
        limiter: &Arc<Limiter>,
        mut buckets: Buckets,
        limits: &[LimitState],
        cost: u32,
        local: bool,
    ) -> Option<Self> {
        // Keep only the buckets that were charged, in place.
        let mut charged = limits.iter().map(|s| s.enough);
        buckets.retain(|_| charged.next().unwrap_or(false));
        if buckets.is_empty() {
            return None;
        }
        Some(Self {
            inner: Some(Arc::new(RefundInner {
                limiter: Arc::clone(limiter),
                buckets,
                local,
                left: AtomicU32::new(cost),
            })),
        })
    }

    /// The handle of a request that was charged nothing refundable.
    fn none() -> Self {
        Self { inner: None }
    }

    /// Units still refundable (the request's cost, less what was given
    /// back); `0` on a no-op handle.
    #[must_use]
    pub fn refundable(&self) -> u32 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.left.load(Ordering::Acquire))
    }

    /// Gives `units` back to every limit that charged this request (never
    /// more than it was charged, never past full). One store call, none on
    /// a no-op handle or when nothing is left to give back.
    pub async fn give_back(&self, units: u32) -> Result<(), crate::store::StoreError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let taken = inner
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                Some(left - units.min(left))
            })
            .unwrap_or(0);
        let n = units.min(taken);
        if n == 0 {
            return Ok(());
        }
        let refund = Check {
            cost: -f64::from(n),
            buckets: inner.buckets.to_vec(),
        };
        let limiter = &inner.limiter;
        if inner.local {
            return limiter.fallback.check(&refund).await.map(|_| ());
        }
        // Behind the breaker like any other call: while it is open a refund
        // fails at once instead of waiting out the deadline.
        limiter.ask(&refund).await.map(|_| ())
    }
}

impl fmt::Debug for Refund {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refund")
            .field("refundable", &self.refundable())
            .field("local", &self.inner.as_ref().is_some_and(|i| i.local))
            .finish_non_exhaustive()
    }
}

/// `429` with `Retry-After`, the limit's headers and a problem body.
fn refusal(
    limit: &crate::route::Limit,
    key: LogId,
    headers: RateHeaders,
    retry: u64,
    degraded: bool,
    cached: bool,
) -> Decision {
    // The abuse path: every refusal at DEBUG, except one INFO line a second
    // per limit (and per Redis / local decision), whose `suppressed` counts
    // the refusals since the previous one.
    let log = limit.refusal_log[usize::from(degraded)].event();
    macro_rules! refused_event {
        ($level:ident $(, $extra:ident)?) => {
            tracing::$level!(
                target: "fleetlimit",
                limit = %limit.name,
                key = %key,
                remaining = headers.remaining,
                retry_after = retry,
                reason = "limit-exceeded",
                degraded,
                cached,
                $($extra,)?
                "refused"
            )
        };
    }
    match log {
        Some(suppressed) => refused_event!(info, suppressed),
        None => refused_event!(debug),
    }
    let limit = &*limit.name;
    Decision::Reject(
        Rejection::problem(
            StatusCode::TOO_MANY_REQUESTS,
            &format!("rate limit {limit:?} exceeded; retry in {retry} s"),
            &[
                ("limit", json_str(limit)),
                ("retry_after", retry.to_string()),
            ],
        )
        .retry_after(retry)
        .rate_headers(&headers),
    )
}

/// Which of a limit's `early_log` throttles a line uses.
const MISSING_KEY: usize = 0;
const TOO_COSTLY: usize = 1;
const NO_CLIENT_IP: usize = 2;

/// Writes `$line` at `$level` once a second per limit and kind (with
/// `suppressed`, the lines held back since), at DEBUG otherwise: a client
/// that keeps omitting its key, or a server without `ConnectInfo`, must not
/// flood the logs with one line per request.
macro_rules! throttled {
    ($limit:expr, $kind:expr, $level:ident, $($field:tt)*) => {
        match $limit.early_log[$kind].event() {
            Some(suppressed) => tracing::$level!(target: "fleetlimit", suppressed, $($field)*),
            None => tracing::debug!(target: "fleetlimit", $($field)*),
        }
    };
}

fn missing_key(limit: &crate::route::Limit) -> Decision {
    throttled!(
        limit,
        MISSING_KEY,
        info,
        limit = %limit.name,
        reason = "missing-key",
        "refused: the request does not carry {}",
        limit.key.describe()
    );
    Decision::Reject(Rejection::problem(
        StatusCode::UNAUTHORIZED,
        &format!(
            "this endpoint is rate limited by {}, which the request does not carry",
            limit.key.describe()
        ),
        &[("limit", json_str(&limit.name))],
    ))
}

/// A cost no bucket of this limit can ever hold: refused at once, without
/// touching the store (so it drains nothing), and not with 429 — waiting
/// would not help.
fn too_costly(l: &crate::route::Limit, cost: u32, capacity: f64) -> Decision {
    let limit = &*l.name;
    throttled!(l, TOO_COSTLY, info, %limit, cost, capacity, reason = "cost-exceeds-capacity", "refused");
    Decision::Reject(Rejection::problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("this request costs {cost}, more than limit {limit:?} can ever allow ({capacity}); it can never be admitted"),
        &[("limit", json_str(limit)), ("cost", cost.to_string())],
    ))
}

fn no_client_ip(l: &crate::route::Limit) -> Decision {
    let limit = &*l.name;
    // A server setup problem (no ConnectInfo), not the client's doing; never
    // a shared "unknown" bucket.
    throttled!(
        l,
        NO_CLIENT_IP,
        error,
        %limit,
        reason = "no-client-ip",
        "cannot find the client address: serve with `into_make_service_with_connect_info::<SocketAddr>()` \
         or insert a `SocketAddr` extension"
    );
    Decision::Reject(
        Rejection::problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the rate limiter cannot identify the client",
            &[("limit", json_str(limit))],
        )
        .retry_after(1),
    )
}
