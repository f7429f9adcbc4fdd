//! `[regions]` and global limits checked, from code or from TOML: the
//! regions (names, at least two, this instance's among them, their
//! exchange URLs, the interval, Redis), and each global limit's algorithm,
//! features and split.

use std::sync::Arc;
use std::time::Duration;

use super::{Span, Validator};
use crate::algorithm::Rule;
use crate::config::error::short_number;
use crate::config::redis_url;
use crate::config::regions::{GlobalSpans, RegionsConfig, RegionsSpans, Split, ThisRegion};
use crate::config::ConfigError;
use crate::config::Regions;
use crate::route::{Global, WHOLE};

/// How often quotas may move: often enough to follow demand, seldom
/// enough that an exchange (a round trip to every region) ends before
/// the next one starts.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const MAX_INTERVAL: Duration = Duration::from_secs(60);

/// How far above 1 a split's weights may add up from rounding alone (far
/// below a share's resolution, one part per million).
const SUM_SLACK: f64 = 1e-9;

impl Validator<'_> {
    /// `[regions]`, this instance's region found (read from the environment
    /// for `this_env`); `on_redis`: the configuration has Redis.
    pub(in crate::config) fn regions(
        &self,
        r: &RegionsConfig,
        at: &RegionsSpans,
        on_redis: bool,
    ) -> Result<Regions, ConfigError> {
        let nth = |spans: &[Span], i: usize| spans.get(i).cloned().flatten();
        for (i, (name, _)) in r.regions.iter().enumerate() {
            let span = nth(&at.names, i);
            self.check_name("region name", name, span.clone())?;
            if r.regions[..i].iter().any(|(n, _)| n == name) {
                return Err(self.err(span, format!("region {name:?} is given twice")));
            }
        }
        let names: Vec<&str> = r.regions.iter().map(|(n, _)| n.as_str()).collect();
        let known = names.join(", ");
        if names.len() < 2 {
            return Err(self.err(
                at.exchange.clone(),
                format!(
                    "[regions.exchange] names {} region{} ({known}); a global limit needs at \
                     least two, each with the Redis URL this region's exchange reaches it by",
                    names.len(),
                    if names.len() == 1 { "" } else { "s" }
                ),
            ));
        }
        let (this, span, from) = match &r.this {
            ThisRegion::Name(t) => (t.clone(), at.this(), String::new()),
            ThisRegion::Env(var) => {
                let span = at.this_env.clone();
                let value = this_from_env(var, &known).map_err(|e| self.err(span.clone(), e))?;
                let from = format!(" (environment variable {var}, [regions] this_env)");
                (value, span, from)
            }
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
                at.interval.clone(),
                format!(
                    "[regions] interval is {}; it must be between {} and {} (how often quotas \
                     move between regions)",
                    crate::algorithm::duration_text(r.interval),
                    crate::algorithm::duration_text(MIN_INTERVAL),
                    crate::algorithm::duration_text(MAX_INTERVAL),
                ),
            ));
        }
        for (i, (name, url)) in r.regions.iter().enumerate() {
            redis_url::check(url, cfg!(feature = "tls")).map_err(|e| {
                self.err(nth(&at.links, i), format!("[regions.exchange] {name}: {e}"))
            })?;
        }
        if !on_redis {
            return Err(self.err(
                at.table.clone().or_else(|| at.this()),
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

    /// `scope = "global"` for the limit just added: a token bucket without
    /// leases (`lease_at`: where `lease_batch` was written) or plans (`plan`:
    /// the first, and where), its split over `regions`.
    pub(in crate::config) fn set_global(
        &mut self,
        regions: Option<&Regions>,
        split: &Split,
        at: &GlobalSpans,
        lease_at: Span,
        plan: Option<(&str, Span)>,
    ) -> Result<(), ConfigError> {
        let src = self.src;
        let l = self.limits.last_mut().expect("a limit was just added");
        let name = l.name.clone();
        let err =
            |span: Span, m: String| ConfigError::at(src, span, format!("limit {name:?}: {m}"));
        let Some(regions) = regions else {
            return Err(err(
                at.scope.clone(),
                "scope = \"global\" needs [regions] (this instance's region and every region \
                 that shares the limit)"
                    .into(),
            ));
        };
        if !matches!(l.rule, Rule::TokenBucket { .. }) {
            return Err(err(
                at.scope.clone(),
                "scope = \"global\" supports token buckets only: a window's count cannot change \
                 hands mid-window, and concurrency slots are not split across regions"
                    .into(),
            ));
        }
        if l.lease.is_some() {
            return Err(err(
                lease_at.or_else(|| at.scope.clone()),
                "hot-key leases (lease_batch) are not supported on a global limit \
                 (scope = \"global\")"
                    .into(),
            ));
        }
        if let Some((plan, span)) = plan {
            return Err(err(
                span.or_else(|| at.scope.clone()),
                format!(
                    "plans are not supported on a global limit (scope = \"global\") yet: \
                     remove [plans.{plan}.{name}] or the limit's scope"
                ),
            ));
        }
        let known = || regions.names.join(", ");
        let n = regions.names.len();
        let split = match split {
            Split::Equal => vec![WHOLE / n as u32; n],
            Split::Weights(weights) => {
                let nth = |spans: &[Span], i: usize| spans.get(i).cloned().flatten();
                let mut out = vec![0; n];
                let mut sum = 0.0;
                for (i, (region, w)) in weights.iter().enumerate() {
                    let Some(r) = regions.names.iter().position(|n| **n == **region) else {
                        return Err(err(
                            nth(&at.names, i),
                            format!(
                                "split names region {region:?}, which is not in \
                                 [regions.exchange] ({})",
                                known()
                            ),
                        ));
                    };
                    if weights[..i].iter().any(|(n, _)| n == region) {
                        return Err(err(
                            nth(&at.names, i),
                            format!("split names region {region:?} twice"),
                        ));
                    }
                    if !(w.is_finite() && *w >= 0.0) {
                        return Err(err(
                            nth(&at.weights, i).or_else(|| at.split.clone()),
                            format!(
                                "split: the weight of region {region:?} is {}; it must be a \
                                 number from 0 to 1 (its fraction of the limit)",
                                short_number(*w)
                            ),
                        ));
                    }
                    sum += w;
                    // At most 1 once the sum is checked; a larger one saturates.
                    out[r] = (w * f64::from(WHOLE)).floor() as u32;
                }
                let parts: u64 = out.iter().map(|&p| u64::from(p)).sum();
                if sum > 1.0 + SUM_SLACK || parts > u64::from(WHOLE) {
                    return Err(err(
                        at.split.clone(),
                        format!(
                            "split: the weights add up to {}; at most 1 (the regions' shares \
                             of a global limit never add up to more than the limit)",
                            // To the shares' resolution: 1.1, not 1.1000000000000001.
                            short_number((sum * f64::from(WHOLE)).round() / f64::from(WHOLE))
                        ),
                    ));
                }
                if parts == 0 {
                    return Err(err(
                        at.split.clone(),
                        "split gives no region any share: the limit would refuse every request"
                            .into(),
                    ));
                }
                out
            }
        };
        l.global = Some(Global {
            split: split.into(),
        });
        Ok(())
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
