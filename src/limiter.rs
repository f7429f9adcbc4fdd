//! The request path, top to bottom: route → key → store → decision.
//!
//! [`Limiter::plan`] does the synchronous part (find the route's policy,
//! extract each limit's key, build the store keys once);
//! [`Limiter::decide`] asks the store and, when the store fails, applies the
//! route's failure policy. Both are free of Redis knowledge and of response
//! building: the layer turns a [`Decision`] into a response.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::MatchedPath;
use http::{Request, StatusCode};

use crate::config::{Config, FailurePolicy, OnMissing};
use crate::headers::{json_str, RateHeaders, Rejection};
use crate::key::{ClientIpRules, Extracted, KeyMaterial};
use crate::outcome::{retry_after_secs, Outcome};
use crate::policy::{Policy, RouteTable};
use crate::store::{Bucket, Check, MemoryStore, Store, StoreError};

pub(crate) struct Limiter {
    routes: RouteTable,
    client_ip: ClientIpRules,
    prefix: Arc<str>,
    store: Arc<dyn Store>,
    /// `true` when the primary store is already in-process: it cannot fail.
    store_is_local: bool,
    fallback: MemoryStore,
    fleet_size: u32,
    closed_retry_after: u64,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.store)
            .field("fleet_size", &self.fleet_size)
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
    check: Check,
    log_keys: Vec<String>,
}

/// What the layer does with the request.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Call the service; add these headers to its response, if any.
    Admit(Option<RateHeaders>),
    /// Answer this instead of calling the service.
    Reject(Rejection),
}

pub(crate) type DecisionFuture = Pin<Box<dyn Future<Output = Decision> + Send + 'static>>;

impl Limiter {
    pub(crate) fn new(cfg: &Config, store: Arc<dyn Store>, store_is_local: bool) -> Self {
        Self {
            routes: RouteTable::new(cfg),
            client_ip: cfg.client_ip.clone(),
            prefix: Arc::clone(&cfg.key_prefix),
            store,
            store_is_local,
            fallback: MemoryStore::new(cfg.memory_max_keys),
            fleet_size: cfg.fleet_size,
            closed_retry_after: cfg.closed_retry_after.as_secs_f64().ceil().max(1.0) as u64,
        }
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Route → policy → keys.
    pub(crate) fn plan<B>(&self, req: &Request<B>) -> Plan {
        let matched = req
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str);
        let Some(policy) = self.routes.lookup(matched, req.method()) else {
            return Plan::Unlimited;
        };
        let (headers, ext) = (req.headers(), req.extensions());
        // The client IP is resolved once, and only if some limit needs it.
        let mut ip: Option<Option<IpAddr>> = None;
        let mut client_ip = || *ip.get_or_insert_with(|| self.client_ip.client_ip(headers, ext));

        let mut buckets = Vec::with_capacity(policy.limits.len());
        let mut log_keys = Vec::with_capacity(policy.limits.len());
        for limit in &policy.limits {
            let peer = if limit.key.needs_ip() || limit.on_missing == OnMissing::Ip {
                client_ip()
            } else {
                None
            };
            let material = match limit.key.extract(headers, ext, peer) {
                Extracted::Found(m) => m,
                Extracted::Missing => match (limit.on_missing, peer) {
                    (OnMissing::Ip, Some(ip)) => KeyMaterial::ip(ip),
                    (OnMissing::Ip, None) => return Plan::Now(no_client_ip(&limit.name)),
                    (OnMissing::Reject, _) => {
                        tracing::info!(
                            target: "fleetlimit",
                            limit = %limit.name,
                            reason = "missing-key",
                            "refused: the request does not carry {}",
                            limit.key.describe()
                        );
                        return Plan::Now(Decision::Reject(Rejection::problem(
                            StatusCode::UNAUTHORIZED,
                            &format!("this endpoint is rate limited by {}, which the request does not carry", limit.key.describe()),
                            &[("limit", json_str(&limit.name))],
                        )));
                    }
                },
                Extracted::NoClientIp => return Plan::Now(no_client_ip(&limit.name)),
            };
            buckets.push(Bucket {
                key: material.redis_key(&self.prefix, &limit.name),
                capacity: limit.capacity as f64,
                refill_per_sec: limit.refill.tokens_per_second(),
            });
            log_keys.push(material.log_id());
        }
        Plan::Ask(Pending {
            policy: Arc::clone(policy),
            check: Check {
                cost: f64::from(policy.cost),
                buckets,
            },
            log_keys,
        })
    }

    /// Store → decision, with the failure policy when the store fails.
    pub(crate) fn decide(self: &Arc<Self>, p: Pending) -> DecisionFuture {
        let answer = self.store.check(&p.check);
        let this = Arc::clone(self);
        Box::pin(async move {
            match answer.await {
                Ok(outcome) => this.decision_from(&p, &outcome, false),
                Err(e) if this.store_is_local => {
                    // Only a custom store can get here; never turn it into a 500.
                    tracing::error!(target: "fleetlimit", error = %e, "store failed");
                    Decision::Admit(None)
                }
                Err(e) => this.degraded(&p, &e),
            }
        })
    }

    fn decision_from(&self, p: &Pending, o: &Outcome, degraded: bool) -> Decision {
        let Some(i) = o.reported() else {
            return Decision::Admit(None);
        };
        let s = o.limits[i];
        let headers = RateHeaders::new(s.capacity, s.remaining, s.reset);
        let limit = &p.policy.limits[i];
        if o.allowed {
            return Decision::Admit(Some(headers));
        }
        let retry = retry_after_secs(s.wait);
        tracing::info!(
            target: "fleetlimit",
            limit = %limit.name,
            key = %p.log_keys[i],
            remaining = headers.remaining,
            retry_after = retry,
            reason = "limit-exceeded",
            degraded,
            "refused"
        );
        Decision::Reject(
            Rejection::problem(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("rate limit {:?} exceeded; retry in {retry} s", &*limit.name),
                &[
                    ("limit", json_str(&limit.name)),
                    ("retry_after", retry.to_string()),
                ],
            )
            .retry_after(retry)
            .rate_headers(&headers),
        )
    }

    /// Redis failed: the route's failure policy decides. Never a 500.
    fn degraded(&self, p: &Pending, e: &StoreError) -> Decision {
        let limit = &p.policy.limits[0].name;
        let key = &p.log_keys[0];
        match p.policy.on_redis_error {
            FailurePolicy::Open => {
                tracing::warn!(target: "fleetlimit", %limit, %key, reason = e.reason(), error = %e, degraded = true, policy = "open", "served without limiting");
                Decision::Admit(None)
            }
            FailurePolicy::Closed => {
                tracing::warn!(target: "fleetlimit", %limit, %key, reason = e.reason(), error = %e, degraded = true, policy = "closed", "refused: limiter unavailable");
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
                // spreads a key's requests evenly.
                let n = f64::from(self.fleet_size.max(1));
                let mut local = p.check.clone();
                for b in &mut local.buckets {
                    b.capacity /= n;
                    b.refill_per_sec /= n;
                }
                let outcome = self.fallback.check_now(&local);
                let s = outcome.reported().map(|i| outcome.limits[i]);
                tracing::warn!(
                    target: "fleetlimit",
                    %limit,
                    %key,
                    reason = e.reason(),
                    error = %e,
                    degraded = true,
                    policy = "local",
                    allowed = outcome.allowed,
                    remaining = s.map_or(0.0, |s| s.remaining.floor()),
                    "decided locally"
                );
                self.decision_from(p, &outcome, true)
            }
        }
    }
}

fn no_client_ip(limit: &str) -> Decision {
    // A server setup problem (no ConnectInfo), not the client's doing; never
    // a shared "unknown" bucket.
    tracing::error!(
        target: "fleetlimit",
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
