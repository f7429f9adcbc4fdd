//! A limit checked and compiled into the runtime's `route::Limit`: first
//! what only a file can write wrong (fields that need another, numbers its
//! algorithm has no use for), before any other check as when the file was
//! read; then its rule, lease, login ladder, record, scope and plans.

use std::time::Duration;

use super::*;
use crate::algorithm::Rule;
use crate::config::limit::{Count, Exceed, LimitConfig, Mode, Scope};
use crate::config::numbers::algorithm_of;
use crate::config::place::RulePlaces;
use crate::config::{ConfigBuilder, ConfigError, Regions};
use crate::key::KeySource;
use crate::route::{Global, LeaseConfig, Limit, OnExceed, RecordConfig, WHOLE};

/// The statuses `count = "failures"` counts when `failure_statuses` is
/// not given: a refused sign-in.
const DEFAULT_FAILURE_STATUSES: [u16; 2] = [401, 403];

/// Requests a second on one instance above which a key is leased, when
/// `lease_above` is not given.
const DEFAULT_LEASE_ABOVE: u32 = 50;

/// How far above 1 a split's weights may add up from rounding alone (far
/// below a share's resolution, one part per million).
const SUM_SLACK: f64 = 1e-9;

/// A plan's numbers for a limit, and where they were written.
pub(in crate::config) struct PlanRule {
    pub(in crate::config) plan: String,
    pub(in crate::config) rule: Rule,
    /// The limit's name in `[plans.<plan>.<limit>]`.
    at: Place,
}

/// Where limit `name`'s table is.
fn table(name: &str) -> Place {
    Place::of(&["limits", name])
}

impl Validator<'_> {
    /// What only a file can write wrong in limit `name`, and the rule its
    /// numbers make.
    pub(in crate::config) fn limit_fields(
        &self,
        name: &str,
        l: &LimitConfig,
    ) -> Result<Rule, ConfigError> {
        let at = table(name);
        let place = |f: Option<&str>| f.map_or_else(|| at.clone(), |f| at.field(f));
        let rule = l.numbers().rule(self, name, l.algorithm, None, place)?;
        let limit_err =
            |field: &str, m: &str| self.err(at.field(field), format!("limit {name:?}: {m}"));
        if l.lease_above.is_some() && l.lease_batch.is_none() {
            return Err(self.err(at.field("lease_above"), "lease_above needs lease_batch"));
        }
        if l.failure_statuses.is_some() && l.count != Count::Failures {
            let m = "`failure_statuses` needs `count = \"failures\"`";
            return Err(limit_err("failure_statuses", m));
        }
        match (l.on_exceed, l.delay) {
            (Some(Exceed::Delay), None) => {
                return Err(limit_err(
                    "on_exceed",
                    "`on_exceed = \"delay\"` needs `delay`, how long to hold a request (e.g. \"2s\")",
                ));
            }
            (Some(Exceed::Delay), Some(_)) | (_, None) => {}
            (_, Some(_)) => {
                return Err(limit_err("delay", "`delay` needs `on_exceed = \"delay\"`"));
            }
        }
        if l.split.is_some() && l.scope != Scope::Global {
            let m = "`split` needs `scope = \"global\"` (it shares a global limit between regions)";
            return Err(limit_err("split", m));
        }
        Ok(rule)
    }

    /// Every limit's plans: those given in code, then the file's
    /// (`[plans.<plan>.<limit>]`, whose numbers not given are the limit's).
    pub(in crate::config) fn plan_rules(
        &self,
        b: &ConfigBuilder,
        rules: &[Rule],
    ) -> Result<Vec<Vec<PlanRule>>, ConfigError> {
        let mut out = Vec::new();
        for ((name, l), base) in b.limits.iter().zip(rules) {
            let mut plans = Vec::new();
            for (plan, numbers) in &l.plans {
                let alg = numbers.algorithm.unwrap_or(l.algorithm);
                let at = Place::name(&["plans", plan, name]);
                let rule = numbers.rule(self, name, alg, Some(base), |_| at.clone())?;
                let plan = plan.clone();
                plans.push(PlanRule { plan, rule, at });
            }
            out.push(plans);
        }
        for (plan, limits) in &b.plans {
            for (name, numbers) in limits {
                let at = Place::name(&["plans", plan, name]);
                let Some(i) = b.limits.iter().position(|(n, _)| n == name) else {
                    let known = b.limits.iter().map(|(n, _)| n.as_str());
                    return Err(self.unknown_limit(known, name, at));
                };
                let base = &rules[i];
                // Placed at the limit's name in the table header, as always.
                let rule =
                    numbers.rule(self, name, algorithm_of(base), Some(base), |_| at.clone())?;
                let plan = plan.clone();
                out[i].push(PlanRule { plan, rule, at });
            }
        }
        Ok(out)
    }

    /// Limit `name` (its fields checked, `rule` its numbers' rule) with its
    /// lease, login ladder, record and scope, compiled; its plans come
    /// after every limit ([`add_plan_rule`](Self::add_plan_rule)).
    pub(in crate::config) fn add_limit(
        &mut self,
        prefix: &str,
        (name, l): (&str, &LimitConfig),
        rule: Rule,
        plans: &[PlanRule],
        regions: Option<&Regions>,
    ) -> Result<(), ConfigError> {
        let at = table(name);
        self.check_name("limit name", name, Place::name(&["limits", name]))?;
        if self.limits.iter().any(|x| &*x.name == name) {
            let m = format!("limit {name:?} is defined twice");
            return Err(self.err(Place::name(&["limits", name]), m));
        }
        self.check_rule(name, &rule, &RulePlaces::new(&at, &at))?;
        let shadow = l.mode == Mode::Shadow;
        let mut limit = Limit::new(prefix, name, l.key.clone(), l.on_missing, rule, shadow);
        if let Some(batch) = l.lease_batch {
            let above = l.lease_above.unwrap_or(DEFAULT_LEASE_ABOVE);
            limit.lease = Some(self.lease(&limit, batch, above, at.field("lease_batch"))?);
        }
        self.login(&mut limit, l, &at)?;
        if let Some(r) = l.record {
            self.record(&limit, &r, &at)?;
            limit.record = Some(r);
        }
        if l.scope == Scope::Global {
            let plan = plans.first().map(|p| (p.plan.as_str(), p.at.clone()));
            limit.global = Some(self.global(&limit, l.split.as_deref(), regions, &at, plan)?);
        }
        self.limits.push(limit);
        Ok(())
    }

    /// Hot-key leases (token buckets only).
    fn lease(
        &self,
        l: &Limit,
        batch: u32,
        above: u32,
        at: Place,
    ) -> Result<LeaseConfig, ConfigError> {
        if !matches!(l.rule, Rule::TokenBucket { .. }) {
            return Err(self.err(
                at,
                format!("limit {:?}: leases are for token buckets", l.name),
            ));
        }
        if batch < 2 || f64::from(batch) > l.rule.capacity() {
            return Err(self.err(
                at,
                format!(
                    "limit {:?}: lease_batch must be between 2 and the capacity",
                    l.name
                ),
            ));
        }
        Ok(LeaseConfig { batch, above })
    }

    /// Decision records: a bounded stream.
    fn record(&self, l: &Limit, r: &RecordConfig, at: &Place) -> Result<(), ConfigError> {
        let record = at.field("record");
        if !(1..=MAX_RECORD_LEN).contains(&r.max_len) {
            return Err(self.err(
                at.field("record").field("max_len").or(record),
                format!(
                    "limit {:?}: record max_len must be between 1 and {MAX_RECORD_LEN}",
                    l.name
                ),
            ));
        }
        if r.max_age < Duration::from_secs(1) || r.max_age > MAX_RECORD_AGE {
            return Err(self.err(
                at.field("record").field("max_age").or(record),
                format!(
                    "limit {:?}: record max_age must be between 1s and {}d",
                    l.name,
                    MAX_RECORD_AGE.as_secs() / 86_400
                ),
            ));
        }
        Ok(())
    }

    /// Failure-only counting and escalation. A limit keyed by the account
    /// alone that counts failures must not refuse: whoever knows an
    /// account's name could lock its owner out.
    fn login(&self, l: &mut Limit, c: &LimitConfig, at: &Place) -> Result<(), ConfigError> {
        let name = l.name.clone();
        let err = |place: Place, m: &str| self.err(place, format!("limit {name:?}: {m}"));
        let key = at.field("key");
        let on_exceed_at = at.field("on_exceed").or(key.clone());
        let on_exceed = match (c.on_exceed, c.delay) {
            (Some(Exceed::Delay), Some(d)) => OnExceed::Delay(d),
            (Some(Exceed::Challenge), _) => OnExceed::Challenge,
            _ => OnExceed::Refuse,
        };
        let failures = match (&c.failure_statuses, c.count) {
            (Some(statuses), _) => Some(statuses.clone()),
            (None, Count::Failures) => Some(DEFAULT_FAILURE_STATUSES.to_vec()),
            (None, Count::Requests) => None,
        };
        if let Some(statuses) = failures {
            let list = at.field("failure_statuses");
            if statuses.is_empty() {
                let first = list.field("0").or(list.clone());
                return Err(err(first, "failure_statuses needs at least one status"));
            }
            for (i, &code) in statuses.iter().enumerate() {
                if !(100..=599).contains(&code) {
                    let m = "failure_statuses: each must be an HTTP status from 100 to 599";
                    return Err(err(list.field(&i.to_string()), m));
                }
            }
            if l.lease.is_some() {
                return Err(err(
                    key,
                    "a limit that counts failures cannot take hot-key leases (lease_batch): \
                     a leased request is not charged alone, so a success could not be given back",
                ));
            }
            if l.rule.is_concurrency() {
                return Err(err(
                    key,
                    "a concurrency limit cannot count failures: its slot is given back when \
                     every response ends, failure or not (use a token bucket or a window)",
                ));
            }
            let by_account_alone = matches!(l.key, KeySource::Account(_));
            if by_account_alone && on_exceed == OnExceed::Refuse && !l.shadow {
                return Err(err(
                    on_exceed_at,
                    "counts failures per account and refuses when exceeded: an attacker who \
                     knows only the account name could lock its owner out. Use \
                     `on_exceed = \"challenge\"` or `on_exceed = \"delay\"` (and refuse per \
                     IP or per IP+account instead)",
                ));
            }
            l.failures = Some(statuses.into());
        }
        if l.rule.is_concurrency() && on_exceed != OnExceed::Refuse {
            return Err(err(
                on_exceed_at,
                "a concurrency limit can only refuse: past max_in_flight no slot is taken, \
                 so a delayed or challenged request would run uncounted",
            ));
        }
        if let OnExceed::Delay(d) = on_exceed {
            if d.is_zero() || d > MAX_DELAY {
                return Err(err(
                    at.field("delay"),
                    &format!(
                        "delay must be longer than zero and at most {} s (a request is held that long)",
                        MAX_DELAY.as_secs()
                    ),
                ));
            }
        }
        l.on_exceed = on_exceed;
        Ok(())
    }

    /// `scope = "global"`: a token bucket without leases or plans (`plan`:
    /// the first, and where), split over `regions` by `split`'s weights
    /// (`None`: equally).
    fn global(
        &self,
        l: &Limit,
        split: Option<&[(String, f64)]>,
        regions: Option<&Regions>,
        at: &Place,
        plan: Option<(&str, Place)>,
    ) -> Result<Global, ConfigError> {
        let name = &l.name;
        let err = |place: Place, m: String| self.err(place, format!("limit {name:?}: {m}"));
        let scope = at.field("scope");
        let split_at = at.field("split");
        let Some(regions) = regions else {
            return Err(err(
                scope,
                "scope = \"global\" needs [regions] (this instance's region and every region \
                 that shares the limit)"
                    .into(),
            ));
        };
        if !matches!(l.rule, Rule::TokenBucket { .. }) {
            return Err(err(
                scope,
                "scope = \"global\" supports token buckets only: a window's count cannot change \
                 hands mid-window, and concurrency slots are not split across regions"
                    .into(),
            ));
        }
        if l.lease.is_some() {
            return Err(err(
                at.field("lease_batch").or(scope),
                "hot-key leases (lease_batch) are not supported on a global limit \
                 (scope = \"global\")"
                    .into(),
            ));
        }
        if let Some((plan, place)) = plan {
            return Err(err(
                place.or(scope),
                format!(
                    "plans are not supported on a global limit (scope = \"global\") yet: \
                     remove [plans.{plan}.{name}] or the limit's scope"
                ),
            ));
        }
        let n = regions.names.len();
        let Some(weights) = split else {
            return Ok(Global {
                split: vec![WHOLE / n as u32; n].into(),
            });
        };
        let known = || regions.names.join(", ");
        let mut out = vec![0; n];
        let mut sum = 0.0;
        for (i, (region, w)) in weights.iter().enumerate() {
            let region_at = Place::name(&["limits", name, "split", region]);
            let Some(r) = regions.names.iter().position(|n| **n == **region) else {
                return Err(err(
                    region_at,
                    format!(
                        "split names region {region:?}, which is not in [regions.exchange] ({})",
                        known()
                    ),
                ));
            };
            if weights[..i].iter().any(|(n, _)| n == region) {
                return Err(err(
                    region_at,
                    format!("split names region {region:?} twice"),
                ));
            }
            if !(w.is_finite() && *w >= 0.0) {
                return Err(err(
                    split_at.field(region).or(split_at.clone()),
                    format!(
                        "split: the weight of region {region:?} is {}; it must be a number from \
                         0 to 1 (its fraction of the limit)",
                        crate::config::error::short_number(*w)
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
                split_at,
                format!(
                    "split: the weights add up to {}; at most 1 (the regions' shares of a global \
                     limit never add up to more than the limit)",
                    // To the shares' resolution: 1.1, not 1.1000000000000001.
                    crate::config::error::short_number(
                        (sum * f64::from(WHOLE)).round() / f64::from(WHOLE)
                    )
                ),
            ));
        }
        if parts == 0 {
            return Err(err(
                split_at,
                "split gives no region any share: the limit would refuse every request".into(),
            ));
        }
        Ok(Global { split: out.into() })
    }

    /// A plan's rule for the limit it names. Call after every limit is in.
    pub(in crate::config) fn add_plan_rule(
        &mut self,
        limit: &str,
        p: &PlanRule,
    ) -> Result<(), ConfigError> {
        let plan = &p.plan;
        self.check_name("plan name", plan, Place::name(&["plans", plan]))?;
        let Some(i) = self.limits.iter().position(|l| &*l.name == limit) else {
            let known: Vec<String> = self.limits.iter().map(|l| l.name.to_string()).collect();
            return Err(self.unknown_limit(known.iter().map(String::as_str), limit, p.at.clone()));
        };
        let base = &self.limits[i].rule;
        if std::mem::discriminant(base) != std::mem::discriminant(&p.rule) {
            let m = format!("plan {plan:?} of limit {limit:?} must use the limit's algorithm");
            return Err(self.err(p.at.clone(), m));
        }
        let table = Place::of(&["plans", plan, limit]);
        self.check_rule(limit, &p.rule, &RulePlaces::new(&table, &p.at))?;
        self.limits[i].plans.insert(plan.as_str().into(), p.rule);
        self.plans.insert(plan.clone());
        Ok(())
    }
}
