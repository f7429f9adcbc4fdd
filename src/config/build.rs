//! [`ConfigBuilder::build`]: the one place a [`Config`] is assembled, from
//! code or from TOML, each setting put through its check in `validate/`
//! (whose errors point at the file through the builder's spans).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::builder::ConfigBuilder;
use super::validate::Validator;
use super::DEFAULT_MAX_DELAYED;
use super::{
    Config, ConfigError, Hidden, DEFAULT_DEADLINE, DEFAULT_MEMORY_KEYS, DEFAULT_PLAN_CACHE_KEYS,
    DEFAULT_PLAN_CACHE_TTL, DEFAULT_REFUSED_CACHE_KEYS,
};
use crate::key::KeySource;
use crate::route::{Limit, RouteEntry};

impl ConfigBuilder {
    /// Validates and builds.
    pub fn build(mut self) -> Result<Config, ConfigError> {
        let at = std::mem::take(&mut self.at);
        let src = at.src.0.as_str();
        let mut v = Validator::new(src);
        if let Some(r) = &self.redis {
            v.redis(r, &at.redis)?;
        }
        let regions = match &self.regions {
            Some(r) => Some(v.regions(r, &at.regions, self.redis.is_some())?),
            None => None,
        };
        let deadline = match self.deadline {
            Some(d) => {
                v.longer_than_zero("deadline", d, at.deadline.clone())?;
                v.not_too_long("deadline", d, at.deadline.clone())?
            }
            None => DEFAULT_DEADLINE,
        };
        let closed_retry_after = match self.closed_retry_after {
            Some(d) => {
                let span = at.closed_retry_after.clone();
                v.not_too_long("closed_retry_after", d, span.clone())?;
                // Sent as Retry-After, in whole seconds: as [shedding]
                // retry_after, a shorter or fractional one is refused
                // rather than rounded where nobody sees it.
                v.whole_seconds("[redis] closed_retry_after", d, span)?
            }
            None => Duration::from_secs(1),
        };
        let prefix = self.key_prefix.unwrap_or_else(|| "rl".into());
        v.check_name("key_prefix", &prefix, at.key_prefix.clone())?;
        let key_secret = v.key_secret(self.key_secret.as_ref(), &prefix, at.secret_env.clone())?;
        let fleet_size = self.fleet_size.unwrap_or(1);
        v.at_least_one("fleet size", fleet_size, at.fleet_size.clone())?;
        if let Some(h) = &self.heartbeat {
            v.longer_than_zero("heartbeat", h.every, at.heartbeat.clone())?;
            v.longer_than_zero("dead_after", h.dead_after, at.dead_after.clone())?;
            v.not_too_long("heartbeat", h.every, at.heartbeat.clone())?;
            v.not_too_long("heartbeat dead_after", h.dead_after, at.dead_after.clone())?;
            let span = at.dead_after.clone().or(at.heartbeat.clone());
            v.heartbeat(h.every, h.dead_after, span)?;
        }
        let mut breaker = self.breaker;
        v.at_least_one("failures", breaker.failures, at.breaker_failures.clone())?;
        if let Some(w) = self.breaker_window {
            v.longer_than_zero("window", w, at.breaker_window.clone())?;
            v.not_too_long("breaker window", w, at.breaker_window.clone())?;
        }
        breaker.window = v.breaker_window(self.breaker_window, deadline, at.breaker_window)?;
        let cool_off = at.breaker_cool_off;
        v.longer_than_zero("cool_off", breaker.cool_off, cool_off.clone())?;
        v.not_too_long("breaker cool_off", breaker.cool_off, cool_off)?;
        v.at_least_one("probes", breaker.probes, at.breaker_probes)?;
        v.ipv6_prefix(self.client_ip.ipv6_prefix, at.ipv6_prefix)?;

        let mut custom_key_at = HashMap::new();
        for (name, l) in &self.limits {
            if let KeySource::Custom(custom) = &l.key {
                let span = l.at.login.key.clone();
                v.custom_key_name(name, custom, span.clone())?;
                custom_key_at.insert(
                    Arc::<str>::from(name.as_str()),
                    super::error::position(src, span),
                );
            }
            v.add_limit(
                &prefix,
                name,
                l.at.name.clone(),
                l.key.clone(),
                l.on_missing,
                l.rule,
                &l.at.rule,
                l.shadow,
            )?;
            if let Some((batch, above)) = l.lease {
                v.set_lease(batch, above, l.at.lease.clone())?;
            }
            v.set_login(l.failures.as_deref(), l.on_exceed, &l.at.login)?;
            if let Some(r) = l.record {
                v.set_record(r, &l.at.record)?;
            }
            if let Some(split) = &l.global {
                let plan = l
                    .plans
                    .first()
                    .map(|p| (p.plan.as_str(), p.at.limit.clone()));
                let lease = l.at.lease.clone();
                v.set_global(regions.as_ref(), split, &l.at.global, lease, plan)?;
            }
        }
        for (name, l) in &self.limits {
            for p in &l.plans {
                let (plan, rule) = (&p.plan, p.rule);
                v.add_plan_rule(
                    plan,
                    p.at.plan.clone(),
                    name,
                    p.at.limit.clone(),
                    &p.at.rule,
                    |base| {
                        if std::mem::discriminant(base) == std::mem::discriminant(&rule) {
                            Ok(rule)
                        } else {
                            Err(format!(
                                "plan {plan:?} of limit {name:?} must use the limit's algorithm"
                            ))
                        }
                    },
                )?;
            }
        }
        let mut plan_assignments = HashMap::new();
        for (key, plan, span) in self.plan_assignments.0 {
            v.assigned_plan(&plan, span)?;
            plan_assignments.insert(key, Arc::<str>::from(plan));
        }

        let limits: Vec<Arc<Limit>> = std::mem::take(&mut v.limits)
            .into_iter()
            .map(Arc::new)
            .collect();
        let mut routes = Vec::new();
        for (path, r) in self.routes {
            v.check_route(&path, r.methods.as_deref(), r.at.path.clone())?;
            let policy = v.policy(&limits, r.named_limits(), r.settings(), &path)?;
            routes.push(RouteEntry {
                path,
                methods: r.methods,
                policy,
            });
        }
        let default_route = match &self.default_route {
            Some(r) => Some(v.policy(&limits, r.named_limits(), r.settings(), "default")?),
            None => None,
        };
        let memory_max_keys = self.memory_max_keys.unwrap_or(DEFAULT_MEMORY_KEYS);
        v.at_least_one("max_keys", memory_max_keys, at.memory_max_keys)?;
        let plan_cache_ttl = self.plan_cache_ttl.unwrap_or(DEFAULT_PLAN_CACHE_TTL);
        v.not_too_long("plan cache ttl", plan_cache_ttl, None)?;
        let plan_cache_keys = self.plan_cache_keys.unwrap_or(DEFAULT_PLAN_CACHE_KEYS);
        v.at_least_one("max_keys", plan_cache_keys, at.plan_cache_keys)?;
        let max_delayed = v.max_delayed(
            self.max_delayed.unwrap_or(DEFAULT_MAX_DELAYED),
            at.max_delayed,
        )?;
        if let Some(s) = &self.shedding {
            v.shedding(s, &at.shedding)?;
        }
        let www_authenticate =
            v.www_authenticate(self.www_authenticate.as_deref(), at.www_authenticate)?;
        Ok(Config {
            redis: self.redis,
            regions,
            deadline,
            key_prefix: prefix.into(),
            key_secret,
            closed_retry_after,
            fleet_size,
            memory_max_keys,
            client_ip: self.client_ip,
            limits,
            routes,
            default_route,
            plan_assignments: Hidden(plan_assignments),
            plan_cache_ttl,
            plan_cache_keys,
            breaker,
            heartbeat: self.heartbeat,
            refused_cache_keys: self
                .refused_cache_keys
                .unwrap_or(DEFAULT_REFUSED_CACHE_KEYS),
            max_delayed,
            shedding: self.shedding,
            header_style: self.header_style.unwrap_or_default(),
            www_authenticate,
            file: None,
            custom_key_at,
        })
    }
}
