//! `[regions]` checked, from code or from TOML: the regions (names, at
//! least two, this instance's among them, their exchange URLs, the
//! interval, Redis). A global limit's own checks are `limit.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use super::{Place, Validator};
use crate::config::ConfigError;
use crate::config::Regions;
use crate::config::redis_url;
use crate::config::regions::RegionsConfig;

/// How often quotas may move: often enough to follow demand, seldom
/// enough that an exchange (a round trip to every region) ends before
/// the next one starts.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const MAX_INTERVAL: Duration = Duration::from_secs(60);

impl Validator<'_> {
    /// `[regions]`, this instance's region found (read from the environment
    /// for `this_env`); `on_redis`: the configuration has Redis.
    pub(in crate::config) fn regions(
        &self,
        r: &RegionsConfig,
        on_redis: bool,
    ) -> Result<Regions, ConfigError> {
        let table = Place::of(&["regions"]);
        let name_at = |name: &str| Place::name(&["regions", "exchange", name]);
        for (i, (name, _)) in r.regions.iter().enumerate() {
            self.check_name("region name", name, name_at(name))?;
            if r.regions[..i].iter().any(|(n, _)| n == name) {
                let m = format!("region {name:?} is given twice");
                return Err(self.err(name_at(name), m));
            }
        }
        let names: Vec<&str> = r.regions.iter().map(|(n, _)| n.as_str()).collect();
        let known = names.join(", ");
        if names.len() < 2 {
            return Err(self.err(
                table.field("exchange").or(table.clone()),
                format!(
                    "[regions.exchange] names {} region{} ({known}); a global limit needs at \
                     least two, each with the Redis URL this region's exchange reaches it by",
                    names.len(),
                    if names.len() == 1 { "" } else { "s" }
                ),
            ));
        }
        let this_at = table
            .field("this")
            .or(table.field("this_env"))
            .or(table.clone());
        let (this, span, from) = match (&r.this, &r.this_env) {
            (Some(t), _) => (t.clone(), this_at, String::new()),
            (None, Some(var)) => {
                let span = table.field("this_env");
                let value = this_from_env(var, &known).map_err(|e| self.err(span.clone(), e))?;
                let from = format!(" (environment variable {var}, [regions] this_env)");
                (value, span, from)
            }
            (None, None) => return Err(self.this_region(table, false)),
        };
        let Some(this) = names.iter().position(|n| *n == this) else {
            return Err(self.err(
                span,
                format!(
                    "this instance's region {this:?}{from} is not in [regions.exchange] ({known})"
                ),
            ));
        };
        if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&r.interval) {
            return Err(self.err(
                table.field("interval"),
                format!(
                    "[regions] interval is {}; it must be between {} and {} (how often quotas \
                     move between regions)",
                    crate::algorithm::duration_text(r.interval),
                    crate::algorithm::duration_text(MIN_INTERVAL),
                    crate::algorithm::duration_text(MAX_INTERVAL),
                ),
            ));
        }
        for (name, url) in &r.regions {
            redis_url::check(url, cfg!(feature = "tls")).map_err(|e| {
                let at = Place::of(&["regions", "exchange", name]);
                self.err(at, format!("[regions.exchange] {name}: {e}"))
            })?;
        }
        if !on_redis {
            return Err(self.err(
                table.clone(),
                "[regions] needs the Redis store (a [redis] section, or ConfigBuilder::redis_url): \
                 each region decides its share of a global limit in its own Redis",
            ));
        }
        Ok(Regions {
            this,
            names: names.iter().map(|n| Arc::<str>::from(*n)).collect(),
            links: r.regions.iter().map(|(_, url)| url.clone()).collect(),
            interval: r.interval,
        })
    }
}

/// This instance's region from environment variable `var` (`known`: the
/// regions, for the error).
fn this_from_env(var: &str, known: &str) -> Result<String, String> {
    if var.is_empty() {
        return Err("[regions] this_env must name an environment variable".into());
    }
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Ok(v),
        Ok(_) | Err(std::env::VarError::NotPresent) => Err(format!(
            "environment variable {var} ([regions] this_env) is not set; it names this \
             instance's region, one of {known}"
        )),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!(
            "environment variable {var} ([regions] this_env) is not valid UTF-8"
        )),
    }
}

impl Validator<'_> {
    /// `[regions]` names this instance's region by `this` or `this_env`:
    /// `both` written (at `this_env`), or neither (at the table).
    pub(in crate::config) fn this_region(&self, table: Place, both: bool) -> ConfigError {
        if both {
            let m = "[regions] takes `this` or `this_env`, not both: this instance's region is named once";
            return self.err(table.field("this_env"), m);
        }
        self.err(
            table,
            "[regions] needs `this` (this instance's region, e.g. this = \"eu\") or `this_env` \
             (the environment variable naming it, e.g. this_env = \"FLEETLIMIT_REGION\")",
        )
    }
}
