//! `[regions]` and a limit's `scope = "global"`: the builder's types
//! ([`RegionsConfig`], [`LimitConfig::global`](super::LimitConfig::global))
//! and their lowering from TOML; their checks are `validate/regions.rs`'s,
//! what they become [`Regions`] and `crate::route::Global`, which
//! `crate::region` decides with.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::redis_url::redact_url;
use super::schema::{Pairs, RawRegions};
use super::validate::{fields, Span};
use super::{units, ConfigError};

/// How often quotas move between regions when `interval` is not given.
pub(super) const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);

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
#[derive(Clone)]
#[must_use]
pub struct RegionsConfig {
    pub(super) this: ThisRegion,
    /// Each region and its exchange URL, in the order given.
    pub(super) regions: Vec<(String, String)>,
    pub(super) interval: Duration,
}

/// Where this instance's region is named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ThisRegion {
    /// In the configuration (`this`).
    Name(String),
    /// In this environment variable, read by `build` (`this_env`).
    Env(String),
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
            .field("regions", &regions)
            .field("interval", &self.interval)
            .finish()
    }
}

impl RegionsConfig {
    /// This instance is in region `this` (`this = "eu"` in TOML), which
    /// must be one of the [`region`](Self::region)s.
    pub fn new(this: impl Into<String>) -> Self {
        Self::with(ThisRegion::Name(this.into()))
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
        Self::with(ThisRegion::Env(var.into()))
    }

    fn with(this: ThisRegion) -> Self {
        Self {
            this,
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

/// A limit's `scope = "global"`: how its shares start.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Split {
    /// Equal shares (no `split`).
    Equal,
    /// A weight per region named (`split`), in the order given; regions
    /// not named start with nothing.
    Weights(Vec<(String, f64)>),
}

/// Where `[regions]`'s settings were written.
#[derive(Clone, Debug, Default)]
pub(super) struct RegionsSpans {
    /// The `[regions]` table.
    pub(super) table: Span,
    pub(super) this: Span,
    pub(super) this_env: Span,
    pub(super) interval: Span,
    /// The `[regions.exchange]` table.
    pub(super) exchange: Span,
    /// Each region's name and URL, in order.
    pub(super) names: Vec<Span>,
    pub(super) links: Vec<Span>,
}

impl RegionsSpans {
    /// What a region-wide error points at: `this` or `this_env` when
    /// written, else the table.
    pub(super) fn this(&self) -> Span {
        (self.this.clone())
            .or_else(|| self.this_env.clone())
            .or_else(|| self.table.clone())
    }
}

/// Where a limit's `scope` and `split` were written.
#[derive(Clone, Debug, Default)]
pub(super) struct GlobalSpans {
    pub(super) scope: Span,
    pub(super) split: Span,
    /// Each `split` entry's region name and weight, in order.
    pub(super) names: Vec<Span>,
    pub(super) weights: Vec<Span>,
}

fn span<T>(v: &Option<Spanned<T>>) -> Span {
    v.as_ref().map(Spanned::span)
}

/// The settings a `[regions]` table says, defaults filled in.
pub(super) fn lower(
    src: &str,
    raw: &Spanned<RawRegions>,
) -> Result<(RegionsConfig, RegionsSpans), ConfigError> {
    let table = Some(raw.span());
    let raw = raw.get_ref();
    let this = match (&raw.this, &raw.this_env) {
        (Some(t), None) => ThisRegion::Name(t.get_ref().clone()),
        (None, Some(e)) => ThisRegion::Env(e.get_ref().clone()),
        (Some(_), Some(e)) => return Err(fields::this_region(src, Some(e.span()), true)),
        (None, None) => return Err(fields::this_region(src, table, false)),
    };
    let mut cfg = RegionsConfig::with(this);
    if let Some(d) = &raw.interval {
        cfg.interval = units::parse_duration(d.get_ref())
            .map_err(|e| ConfigError::at(src, Some(d.span()), e.to_string()))?;
    }
    let mut spans = RegionsSpans {
        table: table.clone(),
        this: span(&raw.this),
        this_env: span(&raw.this_env),
        interval: span(&raw.interval),
        exchange: span(&raw.exchange).or(table),
        names: Vec::new(),
        links: Vec::new(),
    };
    if let Some(exchange) = &raw.exchange {
        for (name, url) in &exchange.get_ref().0 {
            cfg.regions
                .push((name.get_ref().clone(), url.get_ref().clone()));
            spans.names.push(Some(name.span()));
            spans.links.push(Some(url.span()));
        }
    }
    Ok((cfg, spans))
}

/// A limit's `split`, with where each entry was written.
pub(super) fn split(raw: &Spanned<Pairs<f64>>) -> (Split, GlobalSpans) {
    let mut spans = GlobalSpans {
        split: Some(raw.span()),
        ..GlobalSpans::default()
    };
    let weights = (raw.get_ref().0.iter())
        .map(|(name, w)| {
            spans.names.push(Some(name.span()));
            spans.weights.push(Some(w.span()));
            (name.get_ref().clone(), *w.get_ref())
        })
        .collect();
    (Split::Weights(weights), spans)
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
