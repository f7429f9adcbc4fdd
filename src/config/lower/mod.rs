//! Lowering: the parsed TOML becomes a [`ConfigBuilder`], each setting
//! with where it was written. Text is parsed here (durations, rates, keys,
//! methods, addresses: the parsers' errors, placed); every check is
//! `validate/`'s: what only a file can write wrong (fields that need
//! another, numbers an algorithm has no use for, names that must refer to
//! something in the file) through `validate/fields.rs` as the file is
//! read, the rest by [`ConfigBuilder::build`].

use std::str::FromStr;
use std::time::Duration;

use http::Method;
use ipnet::IpNet;
use toml::Spanned;

use crate::config::builder::{ConfigBuilder, SecretSource};
use crate::config::parts::{
    LimitConfig, LimitSpans, RouteConfig, RouteSpans, DEFAULT_FAILURE_STATUSES,
};
use crate::config::redis::{RedisSettings, RedisSpans};
use crate::config::regions::{self, GlobalSpans, Split};
use crate::config::schema::{Count, Exceed, Mode, RawConfig, RawLimit, RawRecord, Scope};
use crate::config::validate::{fields, unknown_limit, LoginSpans};
use crate::config::{units, ConfigError, Heartbeat};
use crate::key::{ForwardedHeader, KeySource};
use crate::route::RecordConfig;
use crate::route::{FailurePolicy, OnExceed};

mod numbers;

use self::numbers::{parse_at, plan_rule, span, Numbers};

/// The builder a configuration file says.
pub(super) fn lower(raw: RawConfig, src: &str) -> Result<ConfigBuilder, ConfigError> {
    let mut b = ConfigBuilder::default();
    b.at.src.0 = src.to_owned();
    let duration = |d: &Spanned<String>| parse_at(src, d, units::parse_duration);
    if let Some(r) = raw.redis {
        let s = b.redis.get_or_insert_with(RedisSettings::default);
        if let Some(url) = &r.url {
            s.url.clone_from(url.get_ref());
        }
        let path = |f: &Option<Spanned<String>>| f.as_ref().map(|f| f.get_ref().into());
        s.tls_ca_file = path(&r.tls_ca_file);
        s.tls_client_cert = path(&r.tls_client_cert);
        s.tls_client_key = path(&r.tls_client_key);
        b.at.redis = RedisSpans {
            url: span(&r.url),
            ca_file: span(&r.tls_ca_file),
            client_cert: span(&r.tls_client_cert),
            client_key: span(&r.tls_client_key),
            pool_size: span(&r.pool_size),
            connect_timeout: span(&r.connect_timeout),
            batch_window: span(&r.batch_window),
        };
        if let Some(n) = &r.pool_size {
            s.pool_size = *n.get_ref();
        }
        if let Some(d) = &r.connect_timeout {
            s.connect_timeout = duration(d)?;
        }
        if let Some(c) = r.coalesce {
            s.coalesce = c;
        }
        if let Some(w) = &r.batch_window {
            s.batch_window = Some(duration(w)?);
        }
        if let Some(d) = &r.deadline {
            b.deadline = Some(duration(d)?);
        }
        b.at.deadline = span(&r.deadline);
        if let Some(d) = &r.closed_retry_after {
            b.closed_retry_after = Some(duration(d)?);
        }
        b.at.closed_retry_after = span(&r.closed_retry_after);
        b.refused_cache_keys = r.refused_cache_keys.map(Spanned::into_inner);
        b.at.key_prefix = span(&r.key_prefix);
        b.key_prefix = r.key_prefix.map(Spanned::into_inner);
    }
    b.at.www_authenticate = span(&raw.keys.www_authenticate);
    b.www_authenticate = raw.keys.www_authenticate.map(Spanned::into_inner);
    b.header_style = raw.headers.style;
    if let Some(name) = raw.keys.secret_env {
        b.at.secret_env = Some(name.span());
        b.key_secret = Some(SecretSource::Env(name.into_inner()));
    }
    b.at.fleet_size = span(&raw.fleet.size);
    b.fleet_size = raw.fleet.size.as_ref().map(|n| *n.get_ref());
    let fleet = &raw.fleet;
    let heartbeat_at = fleet.heartbeat.as_ref().or(fleet.dead_after.as_ref());
    fields::heartbeat(src, fleet.discover, heartbeat_at.map(Spanned::span))?;
    if fleet.discover {
        let every = match &fleet.heartbeat {
            Some(d) => duration(d)?,
            None => Duration::from_secs(1),
        };
        let dead_after = match &fleet.dead_after {
            Some(d) => duration(d)?,
            None => every * 3,
        };
        b.heartbeat = Some(Heartbeat { every, dead_after });
        b.at.heartbeat = span(&fleet.heartbeat);
        b.at.dead_after = span(&fleet.dead_after);
    }
    let breaker = &raw.breaker;
    if let Some(n) = &breaker.failures {
        b.breaker.failures = *n.get_ref();
    }
    if let Some(d) = &breaker.window {
        b.breaker_window = Some(duration(d)?);
    }
    if let Some(d) = &breaker.cool_off {
        b.breaker.cool_off = duration(d)?;
    }
    if let Some(n) = &breaker.probes {
        b.breaker.probes = *n.get_ref();
    }
    b.at.breaker_failures = span(&breaker.failures);
    b.at.breaker_window = span(&breaker.window);
    b.at.breaker_cool_off = span(&breaker.cool_off);
    b.at.breaker_probes = span(&breaker.probes);
    for p in &raw.client_ip.trusted_proxies {
        b.client_ip.trusted.push(parse_at(src, p, parse_net)?);
    }
    if let Some(h) = &raw.client_ip.forwarded_header {
        b.client_ip.header = parse_at(src, h, |h| match h.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Ok(ForwardedHeader::XForwardedFor),
            "forwarded" => Ok(ForwardedHeader::Forwarded),
            _ => Err(format!(
                "forwarded_header must be \"x-forwarded-for\" or \"forwarded\", not {h:?}"
            )),
        })?;
    }
    if let Some(p) = &raw.client_ip.ipv6_prefix {
        b.client_ip.ipv6_prefix = *p.get_ref();
    }
    b.at.ipv6_prefix = span(&raw.client_ip.ipv6_prefix);

    for (name, l) in &raw.limits {
        b.limits
            .push((name.get_ref().clone(), limit(src, name, l)?));
    }
    for (plan, overrides) in &raw.plans {
        for (name, o) in overrides {
            let Some((_, l)) = b.limits.iter_mut().find(|(n, _)| n == name.get_ref()) else {
                let known = raw.limits.keys().map(|n| n.get_ref().as_str());
                return Err(unknown_limit(src, known, name.get_ref(), Some(name.span())));
            };
            l.plans.push(plan_rule(src, plan, name, o, &l.rule)?);
        }
    }
    for (key, plan) in raw.plan_assignments {
        let at = Some(plan.span());
        b.plan_assignments.0.push((key, plan.into_inner(), at));
    }
    for r in &raw.routes {
        let methods = match &r.methods {
            None => None,
            Some(ms) => Some(
                ms.iter()
                    .map(|m| parse_at(src, m, |s| Method::from_str(&s.to_ascii_uppercase())))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let mut route = route(&r.limits, &r.cost, r.on_redis_error, r.mode, r.refund);
        route.priority = r.priority.unwrap_or_default();
        route.methods = methods;
        route.at.path = Some(r.path.span());
        b.routes.push((r.path.get_ref().clone(), route));
    }
    if let Some(d) = &raw.default {
        b.default_route = Some(route(
            &d.limits,
            &d.cost,
            d.on_redis_error,
            d.mode,
            d.refund,
        ));
    }
    if let (Some(route), Some(d)) = (&mut b.default_route, &raw.default) {
        route.priority = d.priority.unwrap_or_default();
    }
    if let Some(sh) = &raw.shedding {
        let (cfg, spans) = super::shedding::lower(src, sh)?;
        b.shedding = Some(cfg);
        b.at.shedding = spans;
    }
    if let Some(r) = &raw.regions {
        let (cfg, spans) = super::regions::lower(src, r)?;
        b.regions = Some(cfg);
        b.at.regions = spans;
    }
    b.at.memory_max_keys = span(&raw.memory.max_keys);
    b.memory_max_keys = raw.memory.max_keys.map(Spanned::into_inner);
    if let Some(t) = &raw.plan_cache.ttl {
        b.plan_cache_ttl = Some(duration(t)?);
    }
    b.at.plan_cache_keys = span(&raw.plan_cache.max_keys);
    b.plan_cache_keys = raw.plan_cache.max_keys.map(Spanned::into_inner);
    b.at.max_delayed = span(&raw.escalation.max_delayed);
    b.max_delayed = raw.escalation.max_delayed.map(Spanned::into_inner);
    Ok(b)
}

/// `[limits.<name>]`: its key and numbers parsed, its leases paired.
fn limit(
    src: &str,
    name: &Spanned<String>,
    l: &Spanned<RawLimit>,
) -> Result<LimitConfig, ConfigError> {
    let l_span = Some(l.span());
    let l = l.get_ref();
    let key = parse_at(src, &l.key, KeySource::from_str)?;
    let numbers = Numbers {
        capacity: &l.capacity,
        refill: &l.refill,
        limit: &l.limit,
        window: &l.window,
        max_in_flight: &l.max_in_flight,
        max_hold: &l.max_hold,
    };
    let rule = numbers.rule(src, name.get_ref(), l.algorithm, None, l_span.clone())?;
    let mut out = LimitConfig::new(key, rule).on_missing(l.on_missing);
    out.shadow = l.mode == Mode::Shadow;
    fields::lease(src, l.lease_batch.is_some(), span(&l.lease_above))?;
    out.lease = l.lease_batch.as_ref().map(|b| {
        let above = l.lease_above.as_ref().map_or(50, |a| *a.get_ref());
        (*b.get_ref(), above)
    });
    out.at = LimitSpans {
        name: Some(name.span()),
        rule: numbers.spans(l_span),
        lease: span(&l.lease_batch),
        login: LoginSpans::default(),
        record: Default::default(),
        global: GlobalSpans::default(),
    };
    login(src, name.get_ref(), l, &mut out)?;
    global(src, name.get_ref(), l, &mut out)?;
    if let Some(r) = &l.record {
        out.at.record = [Some(r.span()), Some(r.span())];
        out.record = match r.get_ref() {
            RawRecord::On(false) => None,
            RawRecord::On(true) => Some(RecordConfig::default()),
            RawRecord::Table(t) => {
                let mut c = RecordConfig::default();
                if let Some(n) = &t.max_len {
                    c = c.max_len(*n.get_ref());
                    out.at.record[0] = Some(n.span());
                }
                if let Some(a) = &t.max_age {
                    c = c.max_age(parse_at(src, a, units::parse_duration)?);
                    out.at.record[1] = Some(a.span());
                }
                Some(c)
            }
        };
    }
    Ok(out)
}

/// A limit's `count`, `failure_statuses`, `on_exceed` and `delay`: the
/// fields that only make sense together are paired (`validate/fields.rs`
/// checks that they are), the rest is checked by `build` (statuses, the
/// lockout rule, the delay's bounds).
fn login(src: &str, name: &str, l: &RawLimit, out: &mut LimitConfig) -> Result<(), ConfigError> {
    let counts_failures = l.count.as_ref().map(|c| *c.get_ref()) == Some(Count::Failures);
    let mut spans = LoginSpans {
        key: Some(l.key.span()),
        on_exceed: span(&l.on_exceed),
        delay: span(&l.delay),
        ..LoginSpans::default()
    };
    fields::failure_statuses(src, name, counts_failures, span(&l.failure_statuses))?;
    match (&l.failure_statuses, counts_failures) {
        (Some(f), _) => {
            let mut statuses = Vec::new();
            for s in f.get_ref() {
                let code = u16::try_from(*s.get_ref()).unwrap_or(0);
                statuses.push(code);
                spans.statuses.push(Some(s.span()));
            }
            if statuses.is_empty() {
                // Pointed at by `build`'s "at least one status".
                spans.statuses.push(Some(f.span()));
            }
            out.failures = Some(statuses);
        }
        (None, true) => out.failures = Some(DEFAULT_FAILURE_STATUSES.to_vec()),
        (None, false) => {}
    }
    let exceed = l.on_exceed.as_ref().map(|e| *e.get_ref());
    fields::delay(src, name, exceed, span(&l.on_exceed), span(&l.delay))?;
    out.on_exceed = match (exceed, &l.delay) {
        (Some(Exceed::Delay), Some(d)) => OnExceed::Delay(parse_at(src, d, units::parse_duration)?),
        (Some(Exceed::Challenge), _) => OnExceed::Challenge,
        _ => OnExceed::Refuse,
    };
    out.at.login = spans;
    Ok(())
}

/// A limit's `scope` and `split` (which needs `scope = "global"`).
fn global(src: &str, name: &str, l: &RawLimit, out: &mut LimitConfig) -> Result<(), ConfigError> {
    let global = l.scope.as_ref().map(|s| *s.get_ref()) == Some(Scope::Global);
    fields::split(src, name, global, span(&l.split))?;
    if global {
        let (split, mut spans) = match &l.split {
            Some(s) => regions::split(s),
            None => (Split::Equal, GlobalSpans::default()),
        };
        spans.scope = span(&l.scope);
        out.global = Some(split);
        out.at.global = spans;
    }
    Ok(())
}

/// A route's (or the default's) policy, defaults filled in.
fn route(
    limits: &[Spanned<String>],
    cost: &Option<Spanned<u32>>,
    on_redis_error: Option<FailurePolicy>,
    mode: Mode,
    refund: bool,
) -> RouteConfig {
    let mut r = RouteConfig::new(limits.iter().map(|l| l.get_ref().clone()));
    r.cost = cost.as_ref().map_or(1, |c| *c.get_ref());
    r.on_redis_error = on_redis_error.unwrap_or(FailurePolicy::Open);
    r.shadow = mode == Mode::Shadow;
    r.refund = refund;
    r.at = RouteSpans {
        path: None,
        limits: limits.iter().map(|l| Some(l.span())).collect(),
        cost: span(cost),
    };
    r
}

fn parse_net(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| {
            format!("invalid proxy address {s:?}; expected a CIDR such as \"10.0.0.0/8\" or an IP")
        })
}
