//! [`ConfigBuilder::build`]: the model, from code or from a file, checked
//! (`validate/`, each error placed in the file when there is one) and
//! compiled once into the runtime's [`Config`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::builder::ConfigBuilder;
use super::place::Place;
use super::redis::RedisSettings;
use super::validate::Validator;
use super::{
    Config, ConfigError, DEFAULT_DEADLINE, DEFAULT_MAX_DELAYED, DEFAULT_MEMORY_KEYS,
    DEFAULT_PLAN_CACHE_KEYS, DEFAULT_PLAN_CACHE_TTL, DEFAULT_REFUSED_CACHE_KEYS, Hidden,
};
use crate::key::KeySource;
use crate::route::{Limit, RouteEntry};

/// How often each instance heartbeats when `[fleet] heartbeat` is not given.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);

/// The key prefix when none is given.
const DEFAULT_KEY_PREFIX: &str = "rl";

/// A `closed` route's `Retry-After` when none is given.
const DEFAULT_CLOSED_RETRY_AFTER: Duration = Duration::from_secs(1);

impl ConfigBuilder {
    /// Validates and builds.
    pub fn build(self) -> Result<Config, ConfigError> {
        let src = self.src.0.as_str();
        let mut v = Validator::new(src);
        let at = |keys: &[&str]| Place::of(keys);

        // What only a file can write wrong, first, as the file is read.
        let fleet = &self.fleet;
        if !fleet.discover && (fleet.heartbeat.is_some() || fleet.dead_after.is_some()) {
            let written = at(&["fleet", "heartbeat"]).or(at(&["fleet", "dead_after"]));
            return Err(v.err(written, "heartbeat settings need `discover = true`"));
        }
        let rules = (self.limits.iter())
            .map(|(name, l)| v.limit_fields(name, l))
            .collect::<Result<Vec<_>, _>>()?;
        let plan_rules = v.plan_rules(&self, &rules)?;
        if let Some(r) = &self.regions {
            if r.this.is_some() == r.this_env.is_some() {
                return Err(v.this_region(at(&["regions"]), r.this.is_some()));
            }
        }

        let redis = self.redis.url.clone().map(|url| {
            let (r, base) = (&self.redis, RedisSettings::default());
            RedisSettings {
                url,
                pool_size: r.pool_size.unwrap_or(base.pool_size),
                connect_timeout: r.connect_timeout.unwrap_or(base.connect_timeout),
                coalesce: r.coalesce.unwrap_or(base.coalesce),
                batch_window: r.batch_window,
                tls_ca_file: r.tls_ca_file.clone(),
                tls_client_cert: r.tls_client_cert.clone(),
                tls_client_key: r.tls_client_key.clone(),
            }
        });
        if let Some(r) = &redis {
            v.redis(r)?;
        }
        let regions = match &self.regions {
            Some(r) => Some(v.regions(r, redis.is_some())?),
            None => None,
        };
        let deadline = match self.redis.deadline {
            Some(d) => {
                v.longer_than_zero("deadline", d, at(&["redis", "deadline"]))?;
                v.not_too_long("deadline", d, at(&["redis", "deadline"]))?
            }
            None => DEFAULT_DEADLINE,
        };
        let closed_retry_after = match self.redis.closed_retry_after {
            Some(d) => {
                let place = at(&["redis", "closed_retry_after"]);
                v.not_too_long("closed_retry_after", d, place.clone())?;
                // Sent as Retry-After, in whole seconds: as [shedding]
                // retry_after, a shorter or fractional one is refused
                // rather than rounded where nobody sees it.
                v.whole_seconds("[redis] closed_retry_after", d, place)?
            }
            None => DEFAULT_CLOSED_RETRY_AFTER,
        };
        let prefix = (self.redis.key_prefix.clone()).unwrap_or_else(|| DEFAULT_KEY_PREFIX.into());
        v.check_name("key_prefix", &prefix, at(&["redis", "key_prefix"]))?;
        let key_secret = v.key_secret(&self.keys, &prefix)?;
        let fleet_size = fleet.size.unwrap_or(1);
        v.at_least_one("fleet size", fleet_size, at(&["fleet", "size"]))?;
        let heartbeat = match fleet.discover {
            false => None,
            true => {
                let every = fleet.heartbeat.unwrap_or(DEFAULT_HEARTBEAT);
                let dead_after = fleet.dead_after.unwrap_or(every * 3);
                let (every_at, dead_at) =
                    (at(&["fleet", "heartbeat"]), at(&["fleet", "dead_after"]));
                v.longer_than_zero("heartbeat", every, every_at.clone())?;
                v.longer_than_zero("dead_after", dead_after, dead_at.clone())?;
                v.not_too_long("heartbeat", every, every_at.clone())?;
                v.not_too_long("heartbeat dead_after", dead_after, dead_at.clone())?;
                Some(v.heartbeat(every, dead_after, dead_at.or(every_at))?)
            }
        };
        let mut breaker = self.breaker.settings;
        let b_at = |field: &str| at(&["breaker", field]);
        v.at_least_one("failures", breaker.failures, b_at("failures"))?;
        let window = self.breaker.window_given.then_some(breaker.window);
        if let Some(w) = window {
            v.longer_than_zero("window", w, b_at("window"))?;
            v.not_too_long("breaker window", w, b_at("window"))?;
        }
        breaker.window = v.breaker_window(window, deadline, b_at("window"))?;
        v.longer_than_zero("cool_off", breaker.cool_off, b_at("cool_off"))?;
        v.not_too_long("breaker cool_off", breaker.cool_off, b_at("cool_off"))?;
        v.at_least_one("probes", breaker.probes, b_at("probes"))?;
        v.ipv6_prefix(self.client_ip.ipv6_prefix)?;

        let mut custom_key_at = HashMap::new();
        for (((name, l), rule), plans) in self.limits.iter().zip(rules).zip(&plan_rules) {
            if let KeySource::Custom(custom) = &l.key {
                let key_at = at(&["limits", name, "key"]);
                v.custom_key_name(name, custom, key_at.clone())?;
                custom_key_at.insert(Arc::<str>::from(name.as_str()), v.position(&key_at));
            }
            v.add_limit(&prefix, (name, l), rule, plans, regions.as_ref())?;
        }
        for ((name, _), plans) in self.limits.iter().zip(&plan_rules) {
            for p in plans {
                v.add_plan_rule(name, p)?;
            }
        }
        let mut plan_assignments = HashMap::new();
        for (key, plan) in self.plan_assignments.0 {
            v.assigned_plan(&plan, at(&["plan_assignments", &key]))?;
            plan_assignments.insert(key, Arc::<str>::from(plan));
        }

        let limits: Vec<Arc<Limit>> = std::mem::take(&mut v.limits)
            .into_iter()
            .map(Arc::new)
            .collect();
        let mut routes = Vec::new();
        for (i, r) in self.routes.iter().enumerate() {
            let route_at = at(&["routes", &i.to_string()]);
            v.check_route(&r.path, r.methods.as_deref(), route_at.field("path"))?;
            let policy = v.policy(&limits, r, &route_at, &r.path)?;
            routes.push(RouteEntry {
                path: r.path.clone(),
                methods: r.methods.clone(),
                policy,
            });
        }
        let default_route = match &self.default_route {
            Some(r) => Some(v.policy(&limits, r, &at(&["default"]), "default")?),
            None => None,
        };
        let descriptors = v.descriptors(&limits, &self.descriptors)?;
        let memory_max_keys = self.memory.max_keys.unwrap_or(DEFAULT_MEMORY_KEYS);
        v.at_least_one("max_keys", memory_max_keys, at(&["memory", "max_keys"]))?;
        let plan_cache_ttl = self.plan_cache.ttl.unwrap_or(DEFAULT_PLAN_CACHE_TTL);
        v.not_too_long("plan cache ttl", plan_cache_ttl, Place::default())?;
        let plan_cache_keys = self.plan_cache.max_keys.unwrap_or(DEFAULT_PLAN_CACHE_KEYS);
        v.at_least_one("max_keys", plan_cache_keys, at(&["plan_cache", "max_keys"]))?;
        let max_delayed =
            v.max_delayed(self.escalation.max_delayed.unwrap_or(DEFAULT_MAX_DELAYED))?;
        if let Some(s) = &self.shedding {
            v.shedding(s)?;
        }
        let www_authenticate = v.www_authenticate(self.keys.www_authenticate.as_deref())?;
        Ok(Config {
            redis,
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
            descriptors,
            plan_assignments: Hidden(plan_assignments),
            plan_cache_ttl,
            plan_cache_keys,
            breaker,
            heartbeat,
            refused_cache_keys: (self.redis.refused_cache_keys)
                .unwrap_or(DEFAULT_REFUSED_CACHE_KEYS),
            max_delayed,
            shedding: self.shedding,
            header_style: self.headers.style.unwrap_or_default(),
            www_authenticate,
            file: None,
            custom_key_at,
        })
    }
}
