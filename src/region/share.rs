//! This instance's view of its region's quotas: per global limit, the
//! keys whose share moved away from the configured split (every other key
//! has its split), read from the region's Redis every quarter interval.
//!
//! A view is trusted for three quarters of an interval from the moment its
//! read was sent. The exchange holds quota it takes from this region for
//! longer than that before another region may use it (`exchange.rs`), so
//! no decision here uses a share this region has already given up. A view
//! older than that is not used: the request is decided as if Redis had
//! failed (the route's `on_redis_error`), since this region's quota is then
//! unknown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use super::agreement::{Agreement, fingerprint};
use crate::algorithm::Rule;
use crate::config::Regions;
use crate::route::{Global, Limit, WHOLE};

/// The most keys one limit counts demand for in one interval, per
/// instance: the rest of a flood of keys is not counted (it is not
/// refused for it), so memory stays bounded.
pub(crate) const MAX_COUNTED: usize = 4096;

/// A share as the exchange stores it: a count of [`WHOLE`]s, at most one
/// whole; `None` for anything else.
pub(crate) fn stored_share(s: &str) -> Option<u32> {
    s.parse::<u32>().ok().filter(|&n| n <= WHOLE)
}

/// What the layer keeps for global limits: one [`Quota`] each.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) regions: Regions,
    pub(crate) quotas: Box<[Arc<Quota>]>,
    pub(crate) stats: super::Stats,
    /// The exchange's calls and cycles, for the `metrics` facade.
    pub(crate) metrics: crate::metrics::RegionMetrics,
}

impl Runtime {
    /// The quotas of `limits`' global ones (`None`: there are none).
    pub(crate) fn new(regions: Option<&Regions>, limits: &[Arc<Limit>]) -> Option<Arc<Self>> {
        let regions = regions?;
        let quotas: Box<[Arc<Quota>]> = limits
            .iter()
            .filter_map(|l| {
                let g = l.global.as_ref()?;
                Some(Arc::new(Quota::new(l, g, regions)))
            })
            .collect();
        (!quotas.is_empty()).then(|| {
            Arc::new(Self {
                regions: regions.clone(),
                quotas,
                stats: super::Stats::default(),
                metrics: crate::metrics::RegionMetrics::new(&regions.names[regions.this]),
            })
        })
    }

    /// The quota of the global limit `name`.
    pub(crate) fn quota(&self, name: &str) -> Option<&Quota> {
        self.quotas.iter().find(|q| &*q.name == name).map(|q| &**q)
    }

    /// What the exchange did, its quota in flight summed over the global
    /// limits (each limit's cycle counts its own).
    pub(crate) fn stats(&self) -> super::RegionStats {
        let in_flight = self.quotas.iter().map(|q| q.in_flight.load(Relaxed)).sum();
        self.stats.snapshot(in_flight)
    }

    /// How long a view is trusted after its read was sent.
    pub(crate) fn trusted_for(&self) -> Duration {
        self.regions.interval * 3 / 4
    }
}

/// One global limit in this instance: its split, its view, its demand.
#[derive(Debug)]
pub(crate) struct Quota {
    pub(crate) name: Arc<str>,
    /// The limit's rule (global limits have no plans).
    pub(crate) rule: Rule,
    pub(crate) split: Box<[u32]>,
    /// This region's share of a key with none recorded.
    pub(crate) default: u32,
    /// This region's index.
    this: usize,
    view: ArcSwap<View>,
    demand: Mutex<HashMap<Box<str>, u64>>,
    /// Its quota moves from this region, for the `metrics` facade.
    pub(crate) metrics: crate::metrics::QuotaMetrics,
    /// Given or held but not yet received, at its last cycle (in
    /// millionths of the limit).
    pub(crate) in_flight: AtomicU64,
    /// Its rule as this instance publishes it (`agreement.rs`).
    pub(crate) fingerprint: Box<str>,
    /// When it last warned that the regions' rules differ (Unix ms).
    pub(crate) warned: AtomicU64,
    /// When this instance's cycles last reached each region.
    #[cfg(feature = "redis")]
    pub(crate) contacts: Contacts,
}

/// The shares read at one moment.
#[derive(Debug, Default)]
struct View {
    /// Store key → this region's share, for keys away from the split.
    shares: HashMap<Box<str>, u32>,
    /// Until when they may be used (`None`: never read yet).
    trusted_until: Option<Instant>,
    /// The generation of the region's exchange state they were read in.
    generation: super::Generation,
    /// The fleet's smaller rule, while the regions' rules differ.
    agreement: Option<Arc<Agreement>>,
}

impl Quota {
    fn new(l: &Limit, g: &Global, regions: &Regions) -> Self {
        Self {
            name: Arc::clone(&l.name),
            rule: l.rule,
            split: g.split.clone(),
            default: g.split[regions.this],
            this: regions.this,
            view: ArcSwap::default(),
            demand: Mutex::default(),
            metrics: crate::metrics::QuotaMetrics::new(
                &regions.names[regions.this],
                &l.name,
                &regions.names,
            ),
            in_flight: AtomicU64::new(0),
            fingerprint: fingerprint(l.rule, &g.split, regions).into(),
            warned: AtomicU64::new(0),
            #[cfg(feature = "redis")]
            contacts: Contacts::new(regions.names.len()),
        }
    }

    /// The bucket `key` is decided with here: `rule` (or the fleet's
    /// smaller rule, while the regions' rules differ) scaled by this
    /// region's share of `key`, both from one view; `Err` with the last
    /// view's when it is too old to be trusted (for the `local` policy's
    /// estimate, never for Redis's decision).
    pub(crate) fn bucket(&self, key: &str, rule: Rule) -> Result<Rule, Rule> {
        let view = self.view.load();
        // After a restart, a key not claimed yet is held by no one here;
        // while the regions' rules differ, the least split.
        let absent = match &view.agreement {
            _ if view.generation.restart => 0,
            Some(a) => a.split[self.this],
            None => self.default,
        };
        let rule = view.agreement.as_ref().map_or(rule, |a| a.rule);
        let share = view.shares.get(key).copied().unwrap_or(absent);
        let bucket = rule.quota(share);
        if view.trusted_until.is_none_or(|t| Instant::now() >= t) {
            return Err(bucket);
        }
        Ok(bucket)
    }

    /// Replaces the view with shares read by a call sent at `sent`, in
    /// `generation`; returns the generation the view had before.
    pub(crate) fn set_view(
        &self,
        shares: HashMap<Box<str>, u32>,
        (generation, agreement): (super::Generation, Option<Agreement>),
        sent: Instant,
        trust: Duration,
    ) -> super::Generation {
        let old = self.view.swap(Arc::new(View {
            shares,
            trusted_until: Some(sent + trust),
            generation,
            agreement: agreement.map(Arc::new),
        }));
        old.generation.clone()
    }

    /// The rule requests are decided with: `rule`, or the fleet's smaller
    /// one while the regions' rules differ.
    pub(crate) fn rule_now(&self, rule: Rule) -> Rule {
        self.view.load().agreement.as_ref().map_or(rule, |a| a.rule)
    }

    /// The fleet's smaller rule and least splits, while they differ.
    pub(crate) fn agreement(&self) -> Option<Arc<Agreement>> {
        self.view.load().agreement.clone()
    }

    /// Each region's split as this region counts it now (the least any
    /// region's rule gives it, while they differ).
    pub(crate) fn split_now(&self) -> Box<[u32]> {
        self.agreement()
            .map_or_else(|| self.split.clone(), |a| a.split.clone())
    }

    /// The generation of the last view read (empty: none yet).
    pub(crate) fn generation(&self) -> super::Generation {
        self.view.load().generation.clone()
    }

    /// Counts a request of `cost` for `key` in this interval's demand.
    pub(crate) fn offer(&self, key: &str, cost: u32) {
        let mut d = self.demand.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = d.get_mut(key) {
            *n += u64::from(cost);
        } else if d.len() < MAX_COUNTED {
            d.insert(key.into(), u64::from(cost));
        }
    }

    /// This interval's demand, the `most` keys asked most first; the
    /// counts start again.
    pub(crate) fn take_demand(&self, most: usize) -> Vec<(Box<str>, u64)> {
        let taken = std::mem::take(&mut *self.demand.lock().unwrap_or_else(|e| e.into_inner()));
        let mut v: Vec<(Box<str>, u64)> = taken.into_iter().collect();
        if v.len() > most {
            v.select_nth_unstable_by(most, |a, b| b.1.cmp(&a.1));
            v.truncate(most);
        }
        v
    }
}

impl Rule {
    /// This rule as a region holding `share` of it decides it: a token
    /// bucket of that share of the burst and of the refill (at least one
    /// millionth, so a region holding nothing refuses instead of dividing
    /// by zero).
    #[must_use]
    pub(crate) fn quota(&self, share: u32) -> Self {
        let s = f64::from(share.max(1)) / f64::from(WHOLE);
        match *self {
            Self::TokenBucket {
                capacity,
                refill_per_sec,
            } => Self::TokenBucket {
                capacity: capacity * s,
                refill_per_sec: refill_per_sec * s,
            },
            // Refused by the configuration: global limits are token buckets.
            other => other,
        }
    }
}

/// When this instance's cycles last reached each region, and last warned
/// of it (indexed as the configuration's regions).
/// (`contact.rs` keeps them.)
#[cfg(feature = "redis")]
#[derive(Debug)]
pub(crate) struct Contacts {
    pub(super) since: Instant,
    pub(super) seen: Mutex<Vec<(Option<Instant>, Option<Instant>)>>,
}

#[cfg(feature = "redis")]
impl Contacts {
    pub(crate) fn new(regions: usize) -> Self {
        Self {
            since: Instant::now(),
            seen: Mutex::new(vec![(None, None); regions]),
        }
    }
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    /// Each global limit's cycle counts its own quota in flight: the
    /// layer's figure is their sum, not the last cycle's.
    #[test]
    fn quota_in_flight_is_summed_over_the_global_limits() {
        let cfg = crate::Config::from_toml_str(
            r#"
[redis]
url = "redis://127.0.0.1:1"
[regions]
this = "a"
[regions.exchange]
a = "redis://127.0.0.1:1"
b = "redis://127.0.0.1:2"
[limits.api]
key = "header:x-api-key"
capacity = 20
refill = "20/s"
scope = "global"
[limits.login]
key = "header:x-api-key"
capacity = 5
refill = "5/s"
scope = "global"
[limits.local]
key = "header:x-api-key"
capacity = 5
refill = "5/s"
[default]
limits = ["api"]
[[routes]]
path = "/login"
limits = ["login", "local"]
"#,
        )
        .unwrap();
        let rt = Runtime::new(cfg.regions.as_ref(), &cfg.limits).unwrap();
        assert_eq!(rt.quotas.len(), 2, "the global limits only");
        rt.quota("api").unwrap().in_flight.store(300_000, Relaxed);
        rt.quota("login").unwrap().in_flight.store(25_000, Relaxed);
        rt.stats.calls.store(7, Relaxed);
        let stats = rt.stats();
        assert_eq!(stats.in_flight, 325_000);
        assert_eq!(stats.calls, 7);
        rt.quota("api").unwrap().in_flight.store(0, Relaxed);
        assert_eq!(rt.stats().in_flight, 25_000);
    }
}
