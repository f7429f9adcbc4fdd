//! `[regions]`: [`RegionsConfig`], which the file deserialises into and
//! the builder fills; its checks are `validate/regions.rs`'s, what it becomes
//! [`Regions`] (and a global limit's `crate::route::Global`), which
//! `crate::region` decides with.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::de;
use super::redis_url::redact_url;

/// How often quotas move between regions when `interval` is not given.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);

fn default_interval() -> Duration {
    DEFAULT_INTERVAL
}

/// Regions, for limits decided across regions that each keep their own
/// Redis (`[regions]` in TOML; in code the `ConfigBuilder` setters
/// [`this_region`](super::ConfigBuilder::this_region),
/// [`region`](super::ConfigBuilder::region) and the ones beside them):
/// this instance's region, every region (at least two) with the Redis URL
/// this region's exchange reaches it by, and how often quotas move.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegionsConfig {
    /// This instance's region, named (`this`) or in an environment
    /// variable read by `build` (`this_env`): one of them.
    pub(super) this: Option<String>,
    pub(super) this_env: Option<String>,
    #[serde(default = "default_interval", deserialize_with = "de::duration")]
    pub(super) interval: Duration,
    /// `[regions.exchange]`: each region and its exchange URL, in the
    /// order given.
    #[serde(default, rename = "exchange", deserialize_with = "de::pairs")]
    pub(super) regions: Vec<(String, String)>,
}

// By hand: exchange URLs may carry passwords, and `{:?}` ends up in logs.
impl fmt::Debug for RegionsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let regions: Vec<(&str, String)> = self
            .regions
            .iter()
            .map(|(name, url)| (name.as_str(), redact_url(url)))
            .collect();
        f.debug_struct("RegionsConfig")
            .field("this", &self.this)
            .field("this_env", &self.this_env)
            .field("regions", &regions)
            .field("interval", &self.interval)
            .finish()
    }
}

impl RegionsConfig {
    /// No region yet: what the builder's first regions setter starts from.
    pub(super) fn empty() -> Self {
        Self {
            this: None,
            this_env: None,
            regions: Vec::new(),
            interval: DEFAULT_INTERVAL,
        }
    }

    /// This instance is in region `this`.
    pub(super) fn this(&mut self, this: String) {
        (self.this, self.this_env) = (Some(this), None);
    }

    /// This instance's region is the value of environment variable `var`.
    pub(super) fn this_env(&mut self, var: String) {
        (self.this, self.this_env) = (None, Some(var));
    }

    /// Adds a region and its exchange URL.
    pub(super) fn add(&mut self, name: String, exchange_url: String) {
        self.regions.push((name, exchange_url));
    }

    /// How often quotas move between regions.
    pub(super) fn set_interval(&mut self, interval: Duration) {
        self.interval = interval;
    }
}

/// `[regions]` after validation.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Regions {
    /// This instance's region: an index into `names`.
    pub(crate) this: usize,
    /// Every region, in the order the configuration wrote them.
    pub(crate) names: Box<[Arc<str>]>,
    /// The Redis URL this region's exchange reaches each region by, in the
    /// order of `names` (this region's own entry is not used: the exchange
    /// uses the layer's own Redis).
    pub(crate) links: Box<[String]>,
    /// How often quotas move (and a fourth of it: how often views are read).
    pub(crate) interval: Duration,
}

// By hand: exchange URLs may carry passwords, and `Config`'s `{:?}` ends up
// in logs.
impl fmt::Debug for Regions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let links: Vec<String> = self.links.iter().map(|l| redact_url(l)).collect();
        f.debug_struct("Regions")
            .field("this", &self.this)
            .field("names", &self.names)
            .field("links", &links)
            .field("interval", &self.interval)
            .finish()
    }
}

impl Regions {
    /// One line for `Config::describe`: the regions, this one, their
    /// exchange URLs (redacted), the interval.
    pub(super) fn describe(&self) -> String {
        let regions: Vec<String> = (self.names.iter().zip(self.links.iter()))
            .map(|(name, url)| format!("{name} {}", redact_url(url)))
            .collect();
        format!(
            "regions: this instance in {}; exchange with {}; quotas move every {}",
            self.names[self.this],
            regions.join(", "),
            crate::algorithm::duration_text(self.interval)
        )
    }

    /// A global limit's starting shares, by region, in percent.
    pub(super) fn shares(&self, g: &crate::route::Global) -> String {
        let whole = f64::from(crate::route::WHOLE);
        let shares: Vec<String> = (self.names.iter().zip(g.split.iter()))
            .map(|(name, &ppm)| format!("{name} {}%", f64::from(ppm) * 100.0 / whole))
            .collect();
        shares.join(", ")
    }
}
