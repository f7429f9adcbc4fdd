//! Step 1: what a request is charged by. Each limit's key (custom keys
//! from the application's extractors) and the request's cost, written
//! into its [`Pending`]; then, once the caller's plan is known, each
//! limit's numbers ([`rules`]). Step 0, shedding, is here too ([`shed`]):
//! it runs before any key is read.

mod rules;
mod shed;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use http::Request;

pub(super) use self::rules::{look_up_plans, rules};
pub(super) use self::shed::shed;
use super::Pending;
use super::pending::KeyInfo;
use super::plan::RoutePlan;
use crate::RequestRef;
use crate::answer::{self as response, Rejection};
use crate::key::{ClientIpRules, CustomKeys, Extracted, KeyMaterial, KeySecret};
use crate::route::{Limit, OnMissing};

/// Computes a request's cost (see [`RateLimitLayerBuilder::cost_fn`](crate::layer::RateLimitLayerBuilder::cost_fn)).
pub(crate) type CostFn = Arc<dyn Fn(&RequestRef<'_>) -> u32 + Send + Sync>;

/// What one configuration keys requests with.
pub(crate) struct Keys {
    pub(super) client_ip: ClientIpRules,
    /// The application's key extractors, for limits keyed `custom:<name>`.
    pub(super) custom: CustomKeys,
    /// API keys are hashed with it in store keys bound for Redis; `None`
    /// when the primary store is the in-process one, whose keys never
    /// leave the process (spared the digest on the request path).
    pub(super) secret: Option<KeySecret>,
    /// A missing key's `401` challenge.
    pub(super) www_authenticate: http::HeaderValue,
    /// The builder's cost functions, by `MatchedPath`.
    pub(super) cost_fns: HashMap<String, CostFn>,
}

/// Each limit's key and the request's cost, written into `p`, or the
/// answer to a request without its key. `matched`: its `MatchedPath`;
/// `cost`: the cost its front door gave (Envoy's `hits_addend`), which
/// wins over a cost function and the route's.
// The refusal is rare; boxing it would cost every caller.
#[allow(clippy::result_large_err)]
#[inline]
pub(super) fn keys<B>(
    plan: &RoutePlan,
    keys: &Keys,
    req: &Request<B>,
    matched: Option<&str>,
    cost: Option<u32>,
    p: &mut Pending,
) -> Result<(), Rejection> {
    let (headers, ext) = (req.headers(), req.extensions());
    let view = RequestRef::new(req);
    // The client IP is resolved once, and only if some limit needs it.
    let mut ip: Option<Option<IpAddr>> = None;
    let mut client_ip = || *ip.get_or_insert_with(|| keys.client_ip.client_ip(headers, ext));
    p.start();
    let limits = plan.limits();
    let buckets = &mut p.check.buckets;
    buckets.truncate(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        let material = material(keys, limit, &view, &mut client_ip)?;
        if buckets.len() == i {
            buckets.push(crate::store::Bucket {
                key: String::new(),
                rule: limit.rule,
                shadow: false,
            });
        }
        // The buffer the thread's last request left is written over; the
        // numbers are the limit's own until the caller's plan is known.
        let b = &mut buckets[i];
        b.rule = limit.rule;
        b.shadow = plan.soft[i];
        let (_, log_id) = material.write_key(&mut b.key, &limit.key_head, keys.secret.as_ref());
        let plan_key = (!limit.plans.is_empty()).then(|| material.plan_key());
        p.keys.push(KeyInfo {
            log_id,
            plan_key,
            plan: None,
            rule: limit.rule,
        });
    }
    let cost_fn = if keys.cost_fns.is_empty() {
        None
    } else {
        matched.and_then(|m| keys.cost_fns.get(m))
    };
    p.cost = match (cost, cost_fn) {
        // At least one unit, as a fixed cost must be: a computed 0 would
        // be free and never refused (`?pages=0`).
        (Some(c), _) => c.max(1),
        (None, Some(f)) => f(&view).max(1),
        (None, None) => plan.policy.cost,
    };
    p.check.cost = f64::from(p.cost);
    Ok(())
}

/// What `limit` is keyed by in this request, or the answer to a request
/// without it. `client_ip`: the request's, resolved at the first call.
// The refusal is rare; boxing it would cost every caller.
#[allow(clippy::result_large_err)]
#[inline]
fn material<'v>(
    keys: &Keys,
    limit: &Limit,
    view: &RequestRef<'v>,
    client_ip: &mut impl FnMut() -> Option<IpAddr>,
) -> Result<KeyMaterial<'v>, Rejection> {
    let peer = if limit.key.needs_ip() {
        client_ip()
    } else {
        None
    };
    match limit.key.extract(view, peer, &keys.custom) {
        Extracted::Found(m) => Ok(m),
        Extracted::Missing => match limit.on_missing {
            OnMissing::Ip => match client_ip() {
                Some(ip) => Ok(KeyMaterial::ip(ip)),
                None => Err(response::no_client_ip(limit)),
            },
            OnMissing::Reject => Err(response::missing_key(limit, &keys.www_authenticate)),
        },
        Extracted::NoClientIp => Err(response::no_client_ip(limit)),
        Extracted::Invalid => Err(response::invalid_key(limit)),
        Extracted::Failed => Err(response::key_unavailable(limit)),
    }
}
