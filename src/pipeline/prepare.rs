//! Steps 0 and 1, synchronous: route → policy (and shedding) → each
//! limit's key (custom keys from the application's extractors) → cost, as
//! functions of the limiter.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::MatchedPath;
use http::Request;
use smallvec::SmallVec;

use std::ops::ControlFlow;

use super::{Decision, Limiter};
use crate::algorithm::Rule;
use crate::answer::{self as response, Rejection};
use crate::key::{Extracted, KeyMaterial, LogId};
use crate::route::{Limit, OnMissing, Policy};
use crate::shed::{Accepted, Priority, Ticket};
use crate::RequestRef;

/// Computes a request's cost (see [`RateLimitLayerBuilder::cost_fn`](crate::layer::RateLimitLayerBuilder::cost_fn)).
pub(crate) type CostFn = Arc<dyn Fn(&RequestRef<'_>) -> u32 + Send + Sync>;

/// A request's route (see [`Limiter::route`]).
pub(crate) struct Routed<'r> {
    /// Its `MatchedPath`.
    pub(crate) matched: Option<&'r str>,
    /// Its entry's policy, else the default one (limits or not).
    pub(super) policy: Option<&'r Arc<Policy>>,
}

/// A request to decide: its route's policy, cost and keys.
pub(crate) struct Pending {
    pub(super) policy: Arc<Policy>,
    pub(super) cost: u32,
    /// One per limit of the policy, in order: what the request is keyed
    /// and charged by in each (one vector, so a route of two limits
    /// allocates once).
    pub(super) keys: SmallVec<[PendingKey; 1]>,
    /// The refused cache's resets when Redis was asked (see `reset.rs`).
    pub(super) resets_seen: u64,
    /// When Redis was asked: a refusal is remembered from then, as Redis
    /// decided it after that (see `refused.rs`).
    pub(super) asked_at: Option<tokio::time::Instant>,
    /// A global limit's share in this region is not known now (`region/`):
    /// decided as if Redis had failed.
    pub(super) quota_unknown: bool,
}

pub(super) struct PendingKey {
    /// The store key; moved into its bucket (then empty).
    pub(super) key: String,
    /// The key's id for logs, kept after the key moves into its bucket.
    pub(super) log_id: LogId,
    /// The key value plans are looked up by, for limits that have plans.
    pub(super) plan_key: Option<String>,
    /// The caller's plan, once looked up (kept for decision records).
    pub(super) plan: Option<Arc<str>>,
    /// The limit's numbers under the caller's plan (the route's until the
    /// plan is known): the fleet's, for the headers, even when the
    /// `local` policy decides.
    pub(super) rule: Rule,
}

impl Pending {
    /// Limit `i`'s key id for logs.
    pub(super) fn log_id(&self, i: usize) -> LogId {
        self.keys[i].log_id
    }

    /// Each limit's numbers under the caller's plan, in order.
    pub(super) fn rules(&self) -> impl Iterator<Item = &Rule> + '_ {
        self.keys.iter().map(|k| &k.rule)
    }
}

/// The request's route: its `MatchedPath` and the policy of its entry (or
/// the default one), with or without limits. Looked up once, for shedding
/// and for the limits.
#[inline]
pub(super) fn route<'r, B>(l: &'r Limiter, req: &'r Request<B>) -> Routed<'r> {
    let matched = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    if matched.is_none() && !l.unrouted_logged.load(Ordering::Relaxed) {
        check_unrouted(l, req.uri().path());
    }
    Routed {
        matched,
        policy: l.routes.policy_of(matched, req.method()),
    }
}

/// Step 0, with `[shedding]` only: shed the request by its route's
/// priority, before any key is charged, or count it in flight. `None`
/// when shedding is off.
pub(super) fn shed<B>(
    l: &Limiter,
    req: &Request<B>,
    route: &Routed<'_>,
) -> Option<Result<Ticket, Decision>> {
    let shedder = l.core.shed.as_ref()?;
    let priority = route.policy.map_or(Priority::Normal, |p| p.priority);
    let accepted = req.extensions().get::<Accepted>().map(|a| a.0);
    // Held by `on_exceed = "delay"`: parked on purpose (a login attack
    // can fill every place), not load on the handlers.
    let held = l
        .core
        .max_delayed
        .saturating_sub(l.core.delayed.available_permits());
    let held = u32::try_from(held).unwrap_or(u32::MAX);
    Some(shedder.admit(priority, accepted, held).map_err(|s| {
        Decision::Reject(response::overloaded(
            s.priority.as_str(),
            s.signal.as_str(),
            s.pressure,
            s.retry_after,
        ))
    }))
}

/// Keys → cost, the route's policy known and limited.
pub(super) fn keys<B>(
    l: &Limiter,
    req: &Request<B>,
    matched: Option<&str>,
    policy: &Arc<Policy>,
) -> ControlFlow<Decision, Pending> {
    let (headers, ext) = (req.headers(), req.extensions());
    let view = RequestRef::new(req);
    // The client IP is resolved once, and only if some limit needs it.
    let mut ip: Option<Option<IpAddr>> = None;
    let mut client_ip = || *ip.get_or_insert_with(|| l.client_ip.client_ip(headers, ext));
    let reject = |r| ControlFlow::Break(Decision::Reject(r));

    let mut keys = SmallVec::with_capacity(policy.limits.len());
    for limit in &policy.limits {
        let material = match material(l, limit, &view, &mut client_ip) {
            Ok(m) => m,
            Err(r) => return reject(r),
        };
        let plans = !limit.plans.is_empty();
        let k = material.store_key(&limit.key_head, l.core.key_secret.as_ref(), plans);
        keys.push(PendingKey {
            log_id: k.log_id(),
            key: k.key,
            plan_key: k.plan_key,
            plan: None,
            rule: limit.rule,
        });
    }
    let cost_fn = if l.cost_fns.is_empty() {
        None
    } else {
        matched.and_then(|m| l.cost_fns.get(m))
    };
    let cost = match cost_fn {
        // At least one unit, as a fixed cost must be: a computed 0 would
        // be free and never refused (`?pages=0`).
        Some(f) => f(&view).max(1),
        None => policy.cost,
    };
    ControlFlow::Continue(Pending {
        policy: Arc::clone(policy),
        cost,
        keys,
        resets_seen: 0,
        asked_at: None,
        quota_unknown: false,
    })
}

/// What `limit` is keyed by in this request, or the answer to a request
/// without it. `client_ip`: the request's, resolved at the first call.
// The refusal is rare; boxing it would cost every caller.
#[allow(clippy::result_large_err)]
pub(super) fn material<'v>(
    l: &Limiter,
    limit: &Limit,
    view: &RequestRef<'v>,
    client_ip: &mut impl FnMut() -> Option<IpAddr>,
) -> Result<KeyMaterial<'v>, Rejection> {
    let peer = if limit.key.needs_ip() {
        client_ip()
    } else {
        None
    };
    match limit.key.extract(view, peer, &l.custom_keys) {
        Extracted::Found(m) => Ok(m),
        Extracted::Missing => match limit.on_missing {
            OnMissing::Ip => match client_ip() {
                Some(ip) => Ok(KeyMaterial::ip(ip)),
                None => Err(response::no_client_ip(limit)),
            },
            OnMissing::Reject => Err(response::missing_key(limit, &l.www_authenticate)),
        },
        Extracted::NoClientIp => Err(response::no_client_ip(limit)),
        Extracted::Invalid => Err(response::invalid_key(limit)),
        Extracted::Failed => Err(response::key_unavailable(limit)),
    }
}

/// A request without `MatchedPath` for a path a configured route names:
/// the layer is outside the `Router` (the router sets `MatchedPath`
/// after it), so no route entry can ever apply. Said once per layer.
/// Paths no route names stay quiet: inside a `Router` they are its
/// fallback (404s), which carry no `MatchedPath` either.
#[cold]
fn check_unrouted(l: &Limiter, path: &str) {
    let Some(template) = l.routes.template_for(path) else {
        return;
    };
    if l.unrouted_logged.swap(true, Ordering::Relaxed) {
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

/// Route → policy → keys → cost, on the general path (unit tests).
#[cfg(test)]
pub(super) fn prepare<B>(l: &Limiter, req: &Request<B>) -> ControlFlow<Decision, Pending> {
    let route = route(l, req);
    let policy = route.policy.expect("a route with limits");
    keys(l, req, route.matched, policy)
}
