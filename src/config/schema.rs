//! The TOML schema (every table denies unknown fields) and its validation
//! into a [`Config`], with each error placed at its line and column.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde::Deserialize;
use toml::Spanned;

use super::validate::{exact_count, RouteSettings, RuleSpans, Span, Validator};
use super::{
    units, Config, ConfigError, FailurePolicy, OnMissing, Rate, RedisSettings, RouteEntry,
    DEFAULT_DEADLINE, DEFAULT_MEMORY_KEYS, DEFAULT_PLAN_CACHE_KEYS, DEFAULT_PLAN_CACHE_TTL,
    DEFAULT_REFUSED_CACHE_KEYS,
};
use crate::algorithm::Rule;
use crate::key::{ClientIpRules, ForwardedHeader, KeySecret, KeySource, SecretOrigin};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    redis: Option<RawRedis>,
    #[serde(default)]
    fleet: RawFleet,
    #[serde(default)]
    client_ip: RawClientIp,
    #[serde(default)]
    memory: RawMemory,
    #[serde(default)]
    breaker: RawBreaker,
    #[serde(default)]
    keys: RawKeys,
    #[serde(default)]
    limits: BTreeMap<Spanned<String>, Spanned<RawLimit>>,
    #[serde(default)]
    plans: BTreeMap<Spanned<String>, BTreeMap<Spanned<String>, Spanned<RawPlanLimit>>>,
    #[serde(default)]
    plan_assignments: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    plan_cache: RawPlanCache,
    #[serde(default)]
    routes: Vec<RawRoute>,
    default: Option<RawDefault>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    url: Option<Spanned<String>>,
    tls_ca_file: Option<Spanned<String>>,
    tls_client_cert: Option<Spanned<String>>,
    tls_client_key: Option<Spanned<String>>,
    pool_size: Option<Spanned<usize>>,
    deadline: Option<Spanned<String>>,
    connect_timeout: Option<Spanned<String>>,
    key_prefix: Option<Spanned<String>>,
    closed_retry_after: Option<Spanned<String>>,
    refused_cache_keys: Option<Spanned<usize>>,
    coalesce: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFleet {
    size: Option<Spanned<u32>>,
    #[serde(default)]
    discover: bool,
    heartbeat: Option<Spanned<String>>,
    dead_after: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    failures: Option<Spanned<u32>>,
    window: Option<Spanned<String>>,
    cool_off: Option<Spanned<String>>,
    probes: Option<Spanned<u32>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawKeys {
    /// The environment variable holding the secret API keys are hashed with.
    secret_env: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawClientIp {
    #[serde(default)]
    trusted_proxies: Vec<Spanned<String>>,
    forwarded_header: Option<Spanned<String>>,
    ipv6_prefix: Option<Spanned<u8>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMemory {
    max_keys: Option<Spanned<usize>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPlanCache {
    ttl: Option<Spanned<String>>,
    max_keys: Option<Spanned<usize>>,
}

#[derive(Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum AlgorithmName {
    #[default]
    TokenBucket,
    FixedWindow,
    SlidingWindow,
}

#[derive(Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Mode {
    #[default]
    Enforce,
    Shadow,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    key: Spanned<String>,
    #[serde(default)]
    on_missing: OnMissing,
    #[serde(default)]
    algorithm: AlgorithmName,
    capacity: Option<Spanned<u64>>,
    refill: Option<Spanned<String>>,
    limit: Option<Spanned<u64>>,
    window: Option<Spanned<String>>,
    #[serde(default)]
    mode: Mode,
    lease_batch: Option<Spanned<u32>>,
    lease_above: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlanLimit {
    capacity: Option<Spanned<u64>>,
    refill: Option<Spanned<String>>,
    limit: Option<Spanned<u64>>,
    window: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    path: Spanned<String>,
    methods: Option<Vec<Spanned<String>>>,
    limits: Vec<Spanned<String>>,
    cost: Option<Spanned<u32>>,
    on_redis_error: Option<FailurePolicy>,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    refund: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefault {
    limits: Vec<Spanned<String>>,
    cost: Option<Spanned<u32>>,
    on_redis_error: Option<FailurePolicy>,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    refund: bool,
}

fn parse_at<T, E: std::fmt::Display>(
    source: &str,
    v: &Spanned<String>,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, ConfigError> {
    parse(v.get_ref()).map_err(|e| ConfigError::at(source, Some(v.span()), e.to_string()))
}

/// A route's (or the default's) settings besides its limits, defaults filled in.
fn settings(
    cost: &Option<Spanned<u32>>,
    on_redis_error: Option<FailurePolicy>,
    mode: Mode,
    refund: bool,
) -> RouteSettings {
    RouteSettings {
        cost: cost.as_ref().map_or(1, |c| *c.get_ref()),
        cost_span: span(cost),
        on_redis_error: on_redis_error.unwrap_or(FailurePolicy::Open),
        shadow: mode == Mode::Shadow,
        refund,
    }
}

fn span<T>(v: &Option<Spanned<T>>) -> Span {
    v.as_ref().map(Spanned::span)
}

/// The numbers of a limit (or of its plan override), checked against its
/// algorithm: a token bucket has capacity and refill, a window has limit and
/// window, and nothing else.
struct Numbers<'a> {
    capacity: &'a Option<Spanned<u64>>,
    refill: &'a Option<Spanned<String>>,
    limit: &'a Option<Spanned<u64>>,
    window: &'a Option<Spanned<String>>,
}

impl Numbers<'_> {
    fn rule(
        &self,
        src: &str,
        name: &str,
        alg: AlgorithmName,
        base: Option<&Rule>,
        at: Span,
    ) -> Result<Rule, ConfigError> {
        let err = |s: Span, m: String| ConfigError::at(src, s, m);
        let forbid = |field: &str, s: Span, alg_name: &str| {
            s.map_or(Ok(()), |s| {
                Err(err(
                    Some(s),
                    format!("limit {name:?}: `{field}` does not apply to a {alg_name}"),
                ))
            })
        };
        let need = |field: &str| err(at.clone(), format!("limit {name:?}: missing `{field}`"));
        match alg {
            AlgorithmName::TokenBucket => {
                forbid("limit", span(self.limit), "token bucket (use `capacity`)")?;
                forbid("window", span(self.window), "token bucket (use `refill`)")?;
                let (base_cap, base_rate) = match base {
                    Some(Rule::TokenBucket {
                        capacity,
                        refill_per_sec,
                    }) => (Some(*capacity), Some(*refill_per_sec)),
                    _ => (None, None),
                };
                let capacity = match self.capacity {
                    Some(c) => exact_count(*c.get_ref()),
                    None => base_cap.ok_or_else(|| need("capacity"))?,
                };
                let refill_per_sec = match self.refill {
                    Some(r) => parse_at(src, r, Rate::from_str)?.tokens_per_second(),
                    None => base_rate.ok_or_else(|| need("refill"))?,
                };
                Ok(Rule::TokenBucket {
                    capacity,
                    refill_per_sec,
                })
            }
            AlgorithmName::FixedWindow | AlgorithmName::SlidingWindow => {
                forbid("capacity", span(self.capacity), "window (use `limit`)")?;
                forbid("refill", span(self.refill), "window (use `window`)")?;
                let (base_limit, base_window) = match base {
                    Some(
                        Rule::FixedWindow { limit, window } | Rule::SlidingWindow { limit, window },
                    ) => (Some(*limit), Some(*window)),
                    _ => (None, None),
                };
                let limit = match self.limit {
                    Some(l) => exact_count(*l.get_ref()),
                    None => base_limit.ok_or_else(|| need("limit"))?,
                };
                let window = match self.window {
                    Some(w) => parse_at(src, w, units::parse_duration)?,
                    None => base_window.ok_or_else(|| need("window"))?,
                };
                Ok(if alg == AlgorithmName::FixedWindow {
                    Rule::FixedWindow { limit, window }
                } else {
                    Rule::SlidingWindow { limit, window }
                })
            }
        }
    }

    /// Where to point at when the numbers are wrong; `fallback` (the table)
    /// for numbers not written here.
    fn spans(&self, fallback: Span) -> RuleSpans {
        RuleSpans {
            count: span(self.capacity).or_else(|| span(self.limit)),
            rate: span(self.refill).or_else(|| span(self.window)),
            fallback,
        }
    }
}

fn algorithm_of(rule: &Rule) -> AlgorithmName {
    match rule {
        Rule::TokenBucket { .. } => AlgorithmName::TokenBucket,
        Rule::FixedWindow { .. } => AlgorithmName::FixedWindow,
        Rule::SlidingWindow { .. } => AlgorithmName::SlidingWindow,
    }
}

fn duration_at(
    v: &Validator<'_>,
    d: &Spanned<String>,
    what: &str,
) -> Result<Duration, ConfigError> {
    let parsed = parse_at(v.src(), d, units::parse_duration)?;
    v.longer_than_zero(what, parsed, Some(d.span()))
}

impl RawConfig {
    pub(super) fn validate(self, src: &str) -> Result<Config, ConfigError> {
        let mut v = Validator::new(src);
        let mut deadline = DEFAULT_DEADLINE;
        let mut prefix = "rl".to_owned();
        let mut closed_retry_after = Duration::from_secs(1);
        let mut refused_cache_keys = DEFAULT_REFUSED_CACHE_KEYS;
        let redis = match self.redis {
            None => None,
            Some(r) => {
                let mut s = RedisSettings::default();
                if let Some(url) = &r.url {
                    s.url.clone_from(url.get_ref());
                }
                let path = |f: &Option<Spanned<String>>| f.as_ref().map(|f| f.get_ref().into());
                s.tls_ca_file = path(&r.tls_ca_file);
                s.tls_client_cert = path(&r.tls_client_cert);
                s.tls_client_key = path(&r.tls_client_key);
                let spans = super::validate::RedisSpans {
                    url: span(&r.url),
                    ca_file: span(&r.tls_ca_file),
                    client_cert: span(&r.tls_client_cert),
                    client_key: span(&r.tls_client_key),
                };
                super::validate::check_redis(src, &s, &spans)?;
                if let Some(n) = r.pool_size {
                    s.pool_size = v.at_least_one("pool_size", *n.get_ref(), Some(n.span()))?;
                }
                if let Some(d) = &r.deadline {
                    deadline = duration_at(&v, d, "deadline")?;
                }
                if let Some(d) = &r.connect_timeout {
                    s.connect_timeout = duration_at(&v, d, "connect_timeout")?;
                }
                if let Some(d) = &r.closed_retry_after {
                    closed_retry_after = duration_at(&v, d, "closed_retry_after")?;
                }
                if let Some(c) = r.coalesce {
                    s.coalesce = c;
                }
                if let Some(n) = &r.refused_cache_keys {
                    refused_cache_keys = *n.get_ref();
                }
                if let Some(p) = r.key_prefix {
                    v.check_name("key_prefix", p.get_ref(), Some(p.span()))?;
                    prefix = p.into_inner();
                }
                Some(s)
            }
        };
        let key_secret = match &self.keys.secret_env {
            None => KeySecret::default_for(&prefix),
            Some(name) => {
                let secret = super::secret_from_env(name.get_ref())
                    .map_err(|e| v.err(Some(name.span()), e))?;
                KeySecret::new(secret.as_bytes(), SecretOrigin::Env(name.get_ref().clone()))
            }
        };
        let fleet_size = match self.fleet.size {
            Some(n) => v.at_least_one("fleet size", *n.get_ref(), Some(n.span()))?,
            None => 1,
        };
        let heartbeat = if self.fleet.discover {
            let every = match &self.fleet.heartbeat {
                Some(d) => duration_at(&v, d, "heartbeat")?,
                None => Duration::from_secs(1),
            };
            let dead_after = match &self.fleet.dead_after {
                Some(d) => duration_at(&v, d, "dead_after")?,
                None => every * 3,
            };
            let at = span(&self.fleet.dead_after).or(span(&self.fleet.heartbeat));
            Some(v.heartbeat(every, dead_after, at)?)
        } else {
            if let Some(h) = self
                .fleet
                .heartbeat
                .as_ref()
                .or(self.fleet.dead_after.as_ref())
            {
                return Err(v.err(Some(h.span()), "heartbeat settings need `discover = true`"));
            }
            None
        };
        let mut breaker = crate::breaker::BreakerConfig::default();
        if let Some(n) = &self.breaker.failures {
            breaker.failures = v.at_least_one("failures", *n.get_ref(), Some(n.span()))?;
        }
        let window = match &self.breaker.window {
            Some(d) => Some(duration_at(&v, d, "window")?),
            None => None,
        };
        let span = self.breaker.window.as_ref().map(Spanned::span);
        breaker.window = v.breaker_window(window, deadline, span)?;
        if let Some(d) = &self.breaker.cool_off {
            breaker.cool_off = duration_at(&v, d, "cool_off")?;
        }
        if let Some(n) = &self.breaker.probes {
            breaker.probes = v.at_least_one("probes", *n.get_ref(), Some(n.span()))?;
        }
        let mut client_ip = ClientIpRules::default();
        for p in &self.client_ip.trusted_proxies {
            client_ip.trusted.push(parse_at(src, p, super::parse_net)?);
        }
        if let Some(h) = &self.client_ip.forwarded_header {
            client_ip.header = parse_at(src, h, |h| match h.to_ascii_lowercase().as_str() {
                "x-forwarded-for" => Ok(ForwardedHeader::XForwardedFor),
                "forwarded" => Ok(ForwardedHeader::Forwarded),
                _ => Err(format!(
                    "forwarded_header must be \"x-forwarded-for\" or \"forwarded\", not {h:?}"
                )),
            })?;
        }
        if let Some(p) = self.client_ip.ipv6_prefix {
            if *p.get_ref() > 128 {
                return Err(v.err(Some(p.span()), "ipv6_prefix must be between 0 and 128"));
            }
            client_ip.ipv6_prefix = p.into_inner();
        }

        for (name, l) in &self.limits {
            let l_span = Some(l.span());
            let l = l.get_ref();
            let key = parse_at(src, &l.key, KeySource::from_str)?;
            let numbers = Numbers {
                capacity: &l.capacity,
                refill: &l.refill,
                limit: &l.limit,
                window: &l.window,
            };
            let rule = numbers.rule(src, name.get_ref(), l.algorithm, None, l_span.clone())?;
            v.add_limit(
                name.get_ref(),
                Some(name.span()),
                key,
                l.on_missing,
                rule,
                &numbers.spans(l_span),
                l.mode == Mode::Shadow,
            )?;
            match (&l.lease_batch, &l.lease_above) {
                (None, None) => {}
                (Some(b), above) => {
                    let above = above.as_ref().map_or(50, |a| *a.get_ref());
                    v.set_lease(*b.get_ref(), above, Some(b.span()))?;
                }
                (None, Some(a)) => {
                    return Err(v.err(Some(a.span()), "lease_above needs lease_batch"))
                }
            }
        }
        for (plan, overrides) in &self.plans {
            for (limit, o) in overrides {
                let o_span = Some(o.span());
                let o = o.get_ref();
                let numbers = Numbers {
                    capacity: &o.capacity,
                    refill: &o.refill,
                    limit: &o.limit,
                    window: &o.window,
                };
                v.add_plan_rule(
                    plan.get_ref(),
                    Some(plan.span()),
                    limit.get_ref(),
                    Some(limit.span()),
                    &numbers.spans(Some(limit.span())),
                    |base| {
                        numbers
                            .rule(
                                src,
                                limit.get_ref(),
                                algorithm_of(base),
                                Some(base),
                                o_span.clone(),
                            )
                            .map_err(|e| e.message().to_owned())
                    },
                )?;
            }
        }
        let mut plan_assignments = HashMap::new();
        for (key, plan) in &self.plan_assignments {
            if !v.plans.contains(plan.get_ref()) {
                let mut known: Vec<&String> = v.plans.iter().collect();
                known.sort();
                return Err(v.err(
                    Some(plan.span()),
                    format!(
                        "unknown plan {:?} (defined under [plans]: {known:?})",
                        plan.get_ref()
                    ),
                ));
            }
            plan_assignments.insert(key.clone(), Arc::<str>::from(plan.get_ref().as_str()));
        }

        let limits: Vec<Arc<crate::policy::Limit>> = std::mem::take(&mut v.limits)
            .into_iter()
            .map(Arc::new)
            .collect();
        let mut routes = Vec::new();
        for r in &self.routes {
            let methods = match &r.methods {
                None => None,
                Some(ms) => Some(
                    ms.iter()
                        .map(|m| parse_at(src, m, |s| Method::from_str(&s.to_ascii_uppercase())))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
            };
            v.check_route(r.path.get_ref(), methods.as_deref(), Some(r.path.span()))?;
            let policy = v.policy(
                &limits,
                r.limits
                    .iter()
                    .map(|l| (l.get_ref().as_str(), Some(l.span()))),
                settings(&r.cost, r.on_redis_error, r.mode, r.refund),
            )?;
            routes.push(RouteEntry {
                path: r.path.get_ref().clone(),
                methods,
                policy,
            });
        }
        let default_route = match &self.default {
            None => None,
            Some(d) => Some(
                v.policy(
                    &limits,
                    d.limits
                        .iter()
                        .map(|l| (l.get_ref().as_str(), Some(l.span()))),
                    settings(&d.cost, d.on_redis_error, d.mode, d.refund),
                )?,
            ),
        };
        let memory_max_keys = match self.memory.max_keys {
            Some(n) => v.at_least_one("max_keys", *n.get_ref(), Some(n.span()))?,
            None => DEFAULT_MEMORY_KEYS,
        };
        let plan_cache_ttl = match &self.plan_cache.ttl {
            Some(t) => parse_at(src, t, units::parse_duration)?,
            None => DEFAULT_PLAN_CACHE_TTL,
        };
        let plan_cache_keys = match self.plan_cache.max_keys {
            Some(n) => v.at_least_one("max_keys", *n.get_ref(), Some(n.span()))?,
            None => DEFAULT_PLAN_CACHE_KEYS,
        };
        Ok(Config {
            redis,
            deadline,
            key_prefix: prefix.into(),
            key_secret,
            closed_retry_after,
            fleet_size,
            memory_max_keys,
            client_ip,
            limits,
            routes,
            default_route,
            plan_assignments: super::Hidden(plan_assignments),
            plan_cache_ttl,
            plan_cache_keys,
            breaker,
            heartbeat,
            refused_cache_keys,
        })
    }
}
