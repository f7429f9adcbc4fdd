//! What a reload changed ([`Changes`]), and what it may not change.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use crate::config::{Config, redact_url};
use crate::key::SecretOrigin;
use crate::route::Limit;

/// The settings `new` changes that a reload cannot, each named as in the
/// TOML file.
pub(crate) fn fixed_changes(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let mut differ = |name: &str, changed: bool| {
        if changed {
            out.push(name.to_owned());
        }
    };
    match (&old.redis, &new.redis) {
        (None, None) => {}
        (Some(_), None) => differ("[redis] (removed: the layer stays on Redis)", true),
        (None, Some(_)) => differ("[redis] (added: the layer stays on its store)", true),
        (Some(a), Some(b)) => {
            if a.url != b.url {
                let url = format!(
                    "[redis] url ({} → {})",
                    redact_url(&a.url),
                    redact_url(&b.url)
                );
                differ(&url, true);
            }
            let pool = format!("[redis] pool_size ({} → {})", a.pool_size, b.pool_size);
            differ(&pool, a.pool_size != b.pool_size);
            differ(
                "[redis] connect_timeout",
                a.connect_timeout != b.connect_timeout,
            );
            differ("[redis] coalesce", a.coalesce != b.coalesce);
            differ("[redis] batch_window", a.batch_window != b.batch_window);
            differ("[redis] tls_ca_file", a.tls_ca_file != b.tls_ca_file);
            differ(
                "[redis] tls_client_cert",
                a.tls_client_cert != b.tls_client_cert,
            );
            differ(
                "[redis] tls_client_key",
                a.tls_client_key != b.tls_client_key,
            );
        }
    }
    differ("[redis] deadline", old.deadline != new.deadline);
    let prefix = format!(
        "[redis] key_prefix ({:?} → {:?})",
        old.key_prefix, new.key_prefix
    );
    differ(&prefix, old.key_prefix != new.key_prefix);
    // The built-in secret follows the prefix, already named.
    let built_in = |c: &Config| *c.key_secret.origin() == SecretOrigin::Default;
    let both_built_in = built_in(old) && built_in(new);
    differ(
        "[keys] secret_env (the key secret)",
        !both_built_in && !old.key_secret.same_keys_as(&new.key_secret),
    );
    let max_keys = format!(
        "[memory] max_keys ({} → {})",
        old.memory_max_keys, new.memory_max_keys
    );
    differ(&max_keys, old.memory_max_keys != new.memory_max_keys);
    differ("[breaker]", old.breaker != new.breaker);
    differ(
        "[fleet] discover, heartbeat, dead_after",
        old.heartbeat != new.heartbeat,
    );
    let delayed = format!(
        "[escalation] max_delayed ({} → {})",
        old.max_delayed, new.max_delayed
    );
    differ(&delayed, old.max_delayed != new.max_delayed);
    differ("[shedding]", old.shedding != new.shedding);
    // Every region's exchange works out shares from the same regions and
    // the same splits: they change everywhere at once, by a restart.
    differ("[regions]", old.regions != new.regions);
    // A global limit's numbers too: every region decides and rescales
    // its share of the same bucket. And a new global limit has no quota
    // until the exchange that keeps them starts.
    for l in &new.limits {
        let was = old.limits.iter().find(|o| o.name == l.name);
        if was.is_some_and(|o| o.global != l.global) {
            differ(&format!("[limits.{}] scope, split", l.name), true);
        } else if l.global.is_some() && was.is_none_or(|o| o.rule != l.rule) {
            differ(
                &format!("[limits.{}] numbers of a global limit", l.name),
                true,
            );
        }
    }
    out
}

/// What a reload changed, for logs: limits and routes added, removed or
/// changed, and other settings that changed. Its `Display` is one line.
///
/// Routes are named by their methods and path (`GET /search`, `* /admin`,
/// and `[default]` for the default policy).
///
/// ```
/// use fleetlimit::{Config, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let toml = |capacity: u32, path: &str| format!(r#"
///     [limits.per-key]
///     key = "header:x-api-key"
///     capacity = {capacity}
///     refill = "1/s"
///
///     [[routes]]
///     path = "{path}"
///     limits = ["per-key"]
/// "#);
/// let layer = RateLimitLayer::new(Config::from_toml_str(&toml(10, "/"))?).await?;
/// let changes = layer.reload_handle().reload(Config::from_toml_str(&toml(5, "/v2"))?)?;
/// assert_eq!(changes.limits_changed(), ["per-key"]);
/// assert_eq!(changes.routes_added(), ["* /v2"]);
/// assert_eq!(changes.routes_removed(), ["* /"]);
/// assert!(!changes.is_empty());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Changes {
    pub(super) limits_added: Vec<String>,
    pub(super) limits_removed: Vec<String>,
    pub(super) limits_changed: Vec<String>,
    pub(super) limits_restarted: Vec<String>,
    pub(super) routes_added: Vec<String>,
    pub(super) routes_removed: Vec<String>,
    pub(super) routes_changed: Vec<String>,
    pub(super) settings_changed: Vec<String>,
}

impl Changes {
    /// Limits the new configuration adds.
    #[must_use]
    pub fn limits_added(&self) -> &[String] {
        &self.limits_added
    }

    /// Limits it no longer has (their buckets expire unused).
    #[must_use]
    pub fn limits_removed(&self) -> &[String] {
        &self.limits_removed
    }

    /// Limits whose settings changed (numbers, key, algorithm, plans...).
    #[must_use]
    pub fn limits_changed(&self) -> &[String] {
        &self.limits_changed
    }

    /// Of the changed limits, those whose callers start afresh: their
    /// `key` or algorithm changed, so what was counted no longer applies.
    #[must_use]
    pub fn limits_restarted(&self) -> &[String] {
        &self.limits_restarted
    }

    /// Routes the new configuration adds.
    #[must_use]
    pub fn routes_added(&self) -> &[String] {
        &self.routes_added
    }

    /// Routes it no longer has.
    #[must_use]
    pub fn routes_removed(&self) -> &[String] {
        &self.routes_removed
    }

    /// Routes whose policy changed (limits, cost, failure policy...).
    #[must_use]
    pub fn routes_changed(&self) -> &[String] {
        &self.routes_changed
    }

    /// Other settings that changed, named as in the TOML file
    /// (`[client_ip]`, `[headers] style`...).
    #[must_use]
    pub fn settings_changed(&self) -> &[String] {
        &self.settings_changed
    }

    /// Whether the new configuration is the running one.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    pub(super) fn between(old: &Config, new: &Config) -> Self {
        let mut c = Self::default();
        let limits = |cfg: &Config| -> BTreeMap<String, Arc<Limit>> {
            cfg.limits
                .iter()
                .map(|l| (l.name.to_string(), Arc::clone(l)))
                .collect()
        };
        let (a, b) = (limits(old), limits(new));
        for (name, l) in &b {
            match a.get(name) {
                None => c.limits_added.push(name.clone()),
                Some(was) if signature(was) != signature(l) => {
                    c.limits_changed.push(name.clone());
                    let algorithm = std::mem::discriminant(&was.rule);
                    if was.key != l.key || algorithm != std::mem::discriminant(&l.rule) {
                        c.limits_restarted.push(name.clone());
                    }
                }
                Some(_) => {}
            }
        }
        c.limits_removed = a.keys().filter(|n| !b.contains_key(*n)).cloned().collect();

        let (a, b) = (routes(old), routes(new));
        for (name, policy) in &b {
            match a.get(name) {
                None => c.routes_added.push(name.clone()),
                Some(was) if was != policy => c.routes_changed.push(name.clone()),
                Some(_) => {}
            }
        }
        c.routes_removed = a.keys().filter(|n| !b.contains_key(*n)).cloned().collect();

        let mut differ = |name: &str, changed: bool| {
            if changed {
                c.settings_changed.push(name.to_owned());
            }
        };
        differ("[client_ip]", old.client_ip != new.client_ip);
        differ("[headers] style", old.header_style != new.header_style);
        differ(
            "[keys] www_authenticate",
            old.www_authenticate != new.www_authenticate,
        );
        differ(
            "[plan_assignments]",
            old.plan_assignments != new.plan_assignments,
        );
        differ(
            "[plan_cache]",
            (old.plan_cache_ttl, old.plan_cache_keys) != (new.plan_cache_ttl, new.plan_cache_keys),
        );
        differ(
            "[redis] closed_retry_after",
            old.closed_retry_after != new.closed_retry_after,
        );
        differ(
            "[redis] refused_cache_keys",
            old.refused_cache_keys != new.refused_cache_keys,
        );
        // With discovery on, the heartbeat's count stands: not a change.
        differ(
            "[fleet] size",
            new.heartbeat.is_none() && old.fleet_size != new.fleet_size,
        );
        c
    }
}

/// Everything a limit is configured with, comparable: its words, and its
/// numbers exactly (the words round a rate to how a person writes it).
pub(super) fn signature(l: &Limit) -> String {
    let mut plans: Vec<_> = l.plans.iter().collect();
    plans.sort_by(|a, b| a.0.cmp(b.0));
    format!(
        "{}; lease {:?}; {:?}; {plans:?}",
        l.describe(),
        l.lease,
        l.rule
    )
}

/// Each route entry's policy by `<methods> <path>`, and the default one.
pub(super) fn routes(cfg: &Config) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = cfg
        .routes
        .iter()
        .map(|r| {
            let methods = r.methods.as_ref().map_or_else(
                || "*".to_owned(),
                |m| {
                    m.iter()
                        .map(http::Method::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                },
            );
            (format!("{methods} {}", r.path), r.policy.describe())
        })
        .collect();
    if let Some(p) = &cfg.default_route {
        out.insert("[default]".to_owned(), p.describe());
    }
    out
}

impl fmt::Display for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("nothing changed");
        }
        let restarted: BTreeSet<&String> = self.limits_restarted.iter().collect();
        let changed: Vec<String> = self
            .limits_changed
            .iter()
            .map(|n| match restarted.contains(n) {
                true => format!("{n} (key or algorithm changed: counted afresh)"),
                false => n.clone(),
            })
            .collect();
        let parts = [
            ("limits added", &self.limits_added),
            ("limits removed", &self.limits_removed),
            ("limits changed", &changed),
            ("routes added", &self.routes_added),
            ("routes removed", &self.routes_removed),
            ("routes changed", &self.routes_changed),
            ("settings changed", &self.settings_changed),
        ];
        let mut first = true;
        for (what, names) in parts {
            if names.is_empty() {
                continue;
            }
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            write!(f, "{what}: {}", names.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    const REGIONS: &str = r#"
[redis]
url = "redis://127.0.0.1:6379"

[regions]
this = "eu"

[regions.exchange]
eu = "redis://10.0.0.1:6379"
us = "redis://10.1.0.1:6379"

[limits.per-key]
key = "header:x-api-key"
capacity = 100
refill = "10/s"
scope = "global"

[limits.per-ip]
key = "ip"
capacity = 10
refill = "1/s"
"#;

    fn fixed(new: &str) -> Vec<String> {
        let old = Config::from_toml_str(REGIONS).unwrap();
        fixed_changes(&old, &Config::from_toml_str(new).unwrap())
    }

    /// Every region works out shares from the same regions and splits: a
    /// change to either is a restart, named as in the file; the rest of a
    /// global limit reloads as any limit's.
    #[test]
    fn regions_scope_and_split_are_restart_only() {
        assert!(fixed(REGIONS).is_empty());
        let interval = REGIONS.replace("this = \"eu\"", "this = \"eu\"\ninterval = \"5s\"");
        assert_eq!(fixed(&interval), ["[regions]"]);
        let region = REGIONS.replace("us = ", "ap = ");
        assert_eq!(fixed(&region), ["[regions]"]);
        let split = REGIONS.replace(
            "scope = \"global\"",
            "scope = \"global\"\nsplit = { eu = 0.6, us = 0.4 }",
        );
        assert_eq!(fixed(&split), ["[limits.per-key] scope, split"]);
        let region_scope = REGIONS.replace("scope = \"global\"", "scope = \"region\"");
        assert_eq!(fixed(&region_scope), ["[limits.per-key] scope, split"]);
        let became_global =
            REGIONS.replace("refill = \"1/s\"", "refill = \"1/s\"\nscope = \"global\"");
        assert_eq!(fixed(&became_global), ["[limits.per-ip] scope, split"]);
        // [regions] removed, its limit made regional: both named.
        let (head, limits) = REGIONS.split_once("[regions]").unwrap();
        let limits = &limits[limits.find("[limits").unwrap()..];
        let one_region = format!("{head}{limits}").replace("scope = \"global\"\n", "");
        assert_eq!(
            fixed(&one_region),
            ["[regions]", "[limits.per-key] scope, split"]
        );
        // A global limit's numbers do not (every region rescales buckets
        // of the same numbers); a regional limit's do.
        let numbers = REGIONS.replace("capacity = 100", "capacity = 200");
        assert_eq!(
            fixed(&numbers),
            ["[limits.per-key] numbers of a global limit"]
        );
        let regional = REGIONS.replace("capacity = 10\n", "capacity = 20\n");
        assert!(fixed(&regional).is_empty());
    }
}
