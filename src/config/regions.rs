//! `[regions]`: [`RegionsConfig`], which the file deserialises into and
//! code builds; its checks are `validate/regions.rs`'s, what it becomes
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
/// Redis (`[regions]` in TOML; [`ConfigBuilder::regions`](super::ConfigBuilder::regions)):
/// this instance's region, every region (at least two) with the Redis URL
/// this region's exchange reaches it by, and how often quotas move.
/// A limit made [`global`](super::LimitConfig::global) is then decided in
/// each region against that region's share of it.
///
/// ```
/// use std::time::Duration;
/// use fleetlimit::{Config, KeySource, LimitConfig, Rate, RegionsConfig, RouteConfig};
///
/// let regions = RegionsConfig::new("eu")
///     .region("eu", "redis://10.0.0.1:6379")
///     .region("us", "redis://10.1.0.1:6379")
///     .interval(Duration::from_secs(5));
/// let per_key = LimitConfig::token_bucket(KeySource::header("x-api-key"), 100, Rate::per_second(10))
///     .global_split([("eu", 0.6), ("us", 0.4)]);
/// let cfg = Config::builder()
///     .redis_url("redis://10.0.0.1:6379")
///     .regions(regions)
///     .limit("per-key", per_key)
///     .default_route(RouteConfig::new(["per-key"]))
///     .build();
/// # #[cfg(feature = "redis")]
/// assert!(cfg.is_ok(), "{cfg:?}");
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[must_use]
pub struct RegionsConfig {
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
    /// This instance is in region `this` (`this = "eu"` in TOML), which
    /// must be one of the [`region`](Self::region)s.
    pub fn new(this: impl Into<String>) -> Self {
        Self::with(Some(this.into()), None)
    }

    /// This instance's region is the value of environment variable `var`,
    /// read by [`build`](super::ConfigBuilder::build) (`this_env =
    /// "FLEETLIMIT_REGION"` in TOML): one file for every region, each
    /// deployment setting the variable. Unset or empty, the build fails.
    ///
    /// ```
    /// use fleetlimit::{Config, RegionsConfig};
    ///
    /// let regions = RegionsConfig::from_env("FLEETLIMIT_REGION_UNSET_IN_THIS_EXAMPLE")
    ///     .region("eu", "redis://10.0.0.1:6379")
    ///     .region("us", "redis://10.1.0.1:6379");
    /// let err = Config::builder().redis_url("redis://10.0.0.1:6379").regions(regions).build();
    /// # #[cfg(feature = "redis")]
    /// assert!(err.unwrap_err().message().contains("is not set"));
    /// ```
    pub fn from_env(var: impl Into<String>) -> Self {
        Self::with(None, Some(var.into()))
    }

    fn with(this: Option<String>, this_env: Option<String>) -> Self {
        Self {
            this,
            this_env,
            regions: Vec::new(),
            interval: DEFAULT_INTERVAL,
        }
    }

    /// Adds region `name` (1 to 64 letters, digits, `-`, `_` or `.`), and
    /// the Redis URL this region's exchange reaches it by (a line of
    /// `[regions.exchange]` in TOML). Every region, this one included.
    pub fn region(mut self, name: impl Into<String>, exchange_url: impl Into<String>) -> Self {
        self.regions.push((name.into(), exchange_url.into()));
        self
    }

    /// How often quotas move between regions (default 2 s; 100 ms to 60 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
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
