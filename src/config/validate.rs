//! Validation shared by the TOML loader and the builder.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::{ConfigError, Heartbeat};
use crate::algorithm::Rule;
use crate::key::KeySource;
use crate::route::RecordConfig;
use crate::route::{FailurePolicy, LeaseConfig, Limit, OnExceed, OnMissing, Policy};
use crate::shed::Priority;

pub(super) struct Validator<'s> {
    src: &'s str,
    pub(super) limits: Vec<Limit>,
    pub(super) plans: HashSet<String>,
    routes_seen: HashSet<(String, Option<Method>)>,
}

pub(super) type Span = Option<Range<usize>>;

/// The largest capacity or window limit: 2^53, the last integer a double
/// (Lua's only number type) holds exactly.
pub(super) const MAX_COUNT: f64 = 9_007_199_254_740_992.0;

/// The fastest refill: one token per microsecond, the resolution of Redis
/// `TIME`; beyond it a token's period rounds to nothing in the scripts.
pub(super) const MAX_REFILL_PER_SEC: f64 = 1_000_000.0;

/// The longest span (capacity ÷ refill, or a window): 10 years. The lean
/// script answers 4 × (TAT − now) µs as a Redis integer, exact only below
/// 2^53, i.e. spans under 2^51 µs (26 years); TAT = now + span must also stay
/// a double with a sub-µs step. 10 years is a round number well inside both.
pub(super) const MAX_SPAN: Duration = Duration::from_secs(3650 * 86_400);

/// The longest `delay` of `on_exceed = "delay"`: a held request keeps its
/// connection and a place among `max_delayed`.
pub(super) const MAX_DELAY: Duration = Duration::from_secs(60);

/// A concurrency slot's longest hold when the configuration gives none.
pub(crate) const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(60);

/// The longest decision record a limit keeps, in entries and in age: a
/// stream is memory in Redis.
pub(super) const MAX_RECORD_LEN: u64 = 1_000_000;
pub(super) const MAX_RECORD_AGE: Duration = Duration::from_secs(30 * 86_400);

/// The longest `max_hold`: a slot is a request in flight, and a day is far
/// beyond any request (and any timeout in front of one).
pub(super) const MAX_HOLD: Duration = Duration::from_secs(86_400);

/// A count from the configuration as the stores hold it: above 2^53 a
/// double would round it, so it becomes infinity, which `check_rule` rejects
/// instead of accepting a different number.
pub(super) fn exact_count(n: u64) -> f64 {
    if n > 1 << 53 {
        f64::INFINITY
    } else {
        n as f64
    }
}

/// `x <= max`, false for NaN: a number that is not one is out of bounds.
fn within(x: f64, max: f64) -> bool {
    x <= max
}

/// A span for an error: exact to the second near the bound, short far off.
fn span_text(secs: f64) -> String {
    let d = secs / 86_400.0;
    if d < 1e6 {
        format!("{secs:.0} s ({d:.1} days)")
    } else {
        format!("{d:.2e} days")
    }
}

/// Where a rule's numbers were written, for its errors (all `None` for the
/// builder). `fallback`: the table, for numbers a plan inherits.
#[derive(Clone, Debug, Default)]
pub(super) struct RuleSpans {
    /// `capacity` or `limit`.
    pub(super) count: Span,
    /// `refill` or `window`.
    pub(super) rate: Span,
    pub(super) fallback: Span,
}

impl RuleSpans {
    fn count(&self) -> Span {
        self.count.clone().or_else(|| self.fallback.clone())
    }

    fn rate(&self) -> Span {
        self.rate.clone().or_else(|| self.fallback.clone())
    }

    /// A rule on both numbers: the rate if it was written here.
    fn both(&self) -> Span {
        self.rate.clone().or_else(|| self.count())
    }
}

/// Where a limit's failure counting and escalation were written.
#[derive(Clone, Debug, Default)]
pub(super) struct LoginSpans {
    pub(super) key: Span,
    /// One per failure status, in order.
    pub(super) statuses: Vec<Span>,
    pub(super) on_exceed: Span,
    pub(super) delay: Span,
}

/// A route's settings besides its limit names, as either front end gives them.
pub(super) struct RouteSettings {
    pub(super) cost: u32,
    /// Where `cost` was written, for its error.
    pub(super) cost_span: Span,
    pub(super) on_redis_error: FailurePolicy,
    pub(super) shadow: bool,
    pub(super) refund: bool,
    pub(super) priority: Priority,
}

impl<'s> Validator<'s> {
    pub(super) fn new(src: &'s str) -> Self {
        Self {
            src,
            limits: Vec::new(),
            plans: HashSet::new(),
            routes_seen: HashSet::new(),
        }
    }

    pub(super) fn err(&self, span: Span, msg: impl Into<String>) -> ConfigError {
        ConfigError::at(self.src, span, msg)
    }

    // The numeric rules, one place for the TOML loader and the builder.

    /// `n`, unless it is zero.
    pub(super) fn at_least_one<T: Copy + Default + PartialEq>(
        &self,
        what: &str,
        n: T,
        span: Span,
    ) -> Result<T, ConfigError> {
        if n == T::default() {
            return Err(self.err(span, format!("{what} must be at least 1")));
        }
        Ok(n)
    }

    /// `d`, if it is whole seconds and at least one: a `Retry-After`.
    pub(super) fn whole_seconds(
        &self,
        what: &str,
        d: Duration,
        span: Span,
    ) -> Result<Duration, ConfigError> {
        if d < Duration::from_secs(1) || d.subsec_nanos() != 0 {
            return Err(self.err(
                span,
                format!(
                    "{what} must be whole seconds, at least 1s (it is sent as Retry-After), not {}",
                    crate::algorithm::duration_text(d)
                ),
            ));
        }
        Ok(d)
    }

    /// `d`, unless it is zero.
    pub(super) fn longer_than_zero(
        &self,
        what: &str,
        d: Duration,
        span: Span,
    ) -> Result<Duration, ConfigError> {
        if d.is_zero() {
            return Err(self.err(span, format!("{what} must be longer than zero")));
        }
        Ok(d)
    }

    /// At most what a TOML duration may say (10^9 s, about 31 years): the
    /// builder takes any `Duration`, and the store adds to these (instants,
    /// PEXPIRE milliseconds), which must not overflow.
    pub(super) fn not_too_long(
        &self,
        what: &str,
        d: Duration,
        span: Span,
    ) -> Result<Duration, ConfigError> {
        if d > Duration::from_secs(super::units::MAX_DURATION_SECS) {
            return Err(self.err(
                span,
                format!(
                    "{what} is too long: at most {} s",
                    super::units::MAX_DURATION_SECS
                ),
            ));
        }
        Ok(d)
    }

    /// Heartbeats every `every`, an instance dead after `dead_after` without one.
    pub(super) fn heartbeat(
        &self,
        every: Duration,
        dead_after: Duration,
        span: Span,
    ) -> Result<Heartbeat, ConfigError> {
        if dead_after <= every {
            return Err(self.err(
                span,
                "dead_after must be longer than heartbeat, or live instances look dead",
            ));
        }
        Ok(Heartbeat { every, dead_after })
    }

    /// The breaker's `window`: longer than the deadline (one late check is
    /// not an outage); unset, 100 ms or 4 × the deadline, the longer.
    pub(super) fn breaker_window(
        &self,
        window: Option<Duration>,
        deadline: Duration,
        span: Span,
    ) -> Result<Duration, ConfigError> {
        match window {
            Some(w) if w <= deadline => Err(self.err(
                span,
                format!(
                    "[breaker] window ({w:?}) must be longer than the deadline ({deadline:?}): \
                     the breaker opens only when checks keep failing for longer than one late check"
                ),
            )),
            Some(w) => Ok(w),
            None => Ok(Duration::from_millis(100).max(deadline.saturating_mul(4))),
        }
    }

    /// Names end up inside Redis keys, so they may not hold `:`, `{` or `}`.
    pub(super) fn check_name(&self, what: &str, name: &str, span: Span) -> Result<(), ConfigError> {
        if crate::key::is_name(name) {
            Ok(())
        } else {
            Err(self.err(
                span,
                format!("{what} {name:?} must be 1 to 64 characters of letters, digits, '-', '_' or '.'"),
            ))
        }
    }

    /// A rule's numbers: non-zero, and within the bounds both stores carry
    /// exactly (see "Bounds" in docs/configuration.md).
    pub(super) fn check_rule(
        &self,
        limit: &str,
        rule: &Rule,
        spans: &RuleSpans,
    ) -> Result<(), ConfigError> {
        let cap = rule.capacity();
        let what = match rule {
            Rule::TokenBucket { .. } => "capacity",
            Rule::Concurrency { .. } => "max_in_flight",
            _ => "limit",
        };
        let bad = |span: Span, msg: String| Err(self.err(span, format!("limit {limit:?}: {msg}")));
        if cap < 1.0 {
            return bad(spans.count(), format!("{what} must be at least 1"));
        }
        // Counts above 2^53 arrive as infinity (see `exact_count`): Lua's
        // doubles stop counting whole units there.
        if !within(cap, MAX_COUNT) {
            return bad(
                spans.count(),
                format!("{what} must be at most 2^53 = {MAX_COUNT}, the largest count a double holds exactly"),
            );
        }
        match *rule {
            Rule::TokenBucket {
                capacity,
                refill_per_sec,
            } => {
                if !within(refill_per_sec, MAX_REFILL_PER_SEC) {
                    return bad(
                        spans.rate(),
                        format!("refill is {refill_per_sec} tokens per second; at most {MAX_REFILL_PER_SEC} (one token per microsecond, the resolution of Redis's clock)"),
                    );
                }
                let span_secs = capacity / refill_per_sec;
                if !within(span_secs, MAX_SPAN.as_secs_f64()) {
                    return bad(
                        spans.both(),
                        format!(
                            "capacity ÷ refill (the time an empty bucket takes to fill) is {}; at most {} s ({} days, 10 years), \
                             so the Redis script's microsecond arithmetic stays exact",
                            span_text(span_secs),
                            MAX_SPAN.as_secs(),
                            MAX_SPAN.as_secs() / 86_400
                        ),
                    );
                }
            }
            Rule::FixedWindow { window, .. } | Rule::SlidingWindow { window, .. } => {
                if window.as_millis() < 1 {
                    return bad(spans.rate(), "window must be at least 1ms".into());
                }
                if window.subsec_nanos() % 1_000_000 != 0 {
                    return bad(
                        spans.rate(),
                        "window must be a whole number of milliseconds (Redis counts windows in ms)"
                            .into(),
                    );
                }
                if window > MAX_SPAN {
                    return bad(
                        spans.rate(),
                        format!(
                            "window must be at most {} days (10 years)",
                            MAX_SPAN.as_secs() / 86_400
                        ),
                    );
                }
            }
            Rule::Concurrency { max_hold, .. } => {
                if max_hold.as_millis() < 1 || max_hold.subsec_nanos() % 1_000_000 != 0 {
                    return bad(
                        spans.rate(),
                        "max_hold must be a whole number of milliseconds, at least 1ms (Redis keeps slots' deadlines in ms)".into(),
                    );
                }
                if max_hold > MAX_HOLD {
                    return bad(
                        spans.rate(),
                        format!(
                            "max_hold must be at most {} h (a slot is one request in flight)",
                            MAX_HOLD.as_secs() / 3600
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_limit(
        &mut self,
        name: &str,
        name_span: Span,
        key: KeySource,
        on_missing: OnMissing,
        rule: Rule,
        spans: &RuleSpans,
        shadow: bool,
    ) -> Result<(), ConfigError> {
        self.check_name("limit name", name, name_span.clone())?;
        if self.limits.iter().any(|l| &*l.name == name) {
            return Err(self.err(name_span, format!("limit {name:?} is defined twice")));
        }
        self.check_rule(name, &rule, spans)?;
        self.limits
            .push(Limit::new(name, key, on_missing, rule, shadow));
        Ok(())
    }

    /// Hot-key leases for the limit just added (token buckets only).
    pub(super) fn set_lease(
        &mut self,
        batch: u32,
        above: u32,
        span: Span,
    ) -> Result<(), ConfigError> {
        let src = self.src;
        let l = self.limits.last_mut().expect("a limit was just added");
        if !matches!(l.rule, Rule::TokenBucket { .. }) {
            return Err(ConfigError::at(
                src,
                span,
                format!("limit {:?}: leases are for token buckets", l.name),
            ));
        }
        if batch < 2 || f64::from(batch) > l.rule.capacity() {
            return Err(ConfigError::at(
                src,
                span,
                format!(
                    "limit {:?}: lease_batch must be between 2 and the capacity",
                    l.name
                ),
            ));
        }
        l.lease = Some(LeaseConfig { batch, above });
        Ok(())
    }

    /// Decision records for the limit just added: a bounded stream.
    pub(super) fn set_record(
        &mut self,
        r: RecordConfig,
        [len_at, age_at]: &[Span; 2],
    ) -> Result<(), ConfigError> {
        let src = self.src;
        let l = self.limits.last_mut().expect("a limit was just added");
        let err = |at: &Span, m: String| Err(ConfigError::at(src, at.clone(), m));
        if !(1..=MAX_RECORD_LEN).contains(&r.max_len) {
            return err(
                len_at,
                format!(
                    "limit {:?}: record max_len must be between 1 and {MAX_RECORD_LEN}",
                    l.name
                ),
            );
        }
        if r.max_age < Duration::from_secs(1) || r.max_age > MAX_RECORD_AGE {
            return err(
                age_at,
                format!(
                    "limit {:?}: record max_age must be between 1s and {}d",
                    l.name,
                    MAX_RECORD_AGE.as_secs() / 86_400
                ),
            );
        }
        l.record = Some(r);
        Ok(())
    }

    /// Failure-only counting and escalation for the limit just added.
    /// A limit keyed by the account alone that counts failures must not
    /// refuse: whoever knows an account's name could lock its owner out.
    pub(super) fn set_login(
        &mut self,
        failures: Option<&[u16]>,
        on_exceed: OnExceed,
        at: &LoginSpans,
    ) -> Result<(), ConfigError> {
        let src = self.src;
        let l = self.limits.last_mut().expect("a limit was just added");
        let name = l.name.clone();
        let err =
            |span: Span, m: String| ConfigError::at(src, span, format!("limit {name:?}: {m}"));
        if let Some(statuses) = failures {
            if statuses.is_empty() {
                let span = at.statuses.first().cloned().flatten();
                return Err(err(
                    span,
                    "failure_statuses needs at least one status".into(),
                ));
            }
            for (i, &code) in statuses.iter().enumerate() {
                if !(100..=599).contains(&code) {
                    let span = at.statuses.get(i).cloned().flatten();
                    return Err(err(
                        span,
                        "failure_statuses: each must be an HTTP status from 100 to 599".into(),
                    ));
                }
            }
            if l.lease.is_some() {
                return Err(err(
                    at.key.clone(),
                    "a limit that counts failures cannot take hot-key leases (lease_batch): \
                     a leased request is not charged alone, so a success could not be given back"
                        .into(),
                ));
            }
            if l.rule.is_concurrency() {
                return Err(err(
                    at.key.clone(),
                    "a concurrency limit cannot count failures: its slot is given back when \
                     every response ends, failure or not (use a token bucket or a window)"
                        .into(),
                ));
            }
            let by_account_alone = matches!(l.key, KeySource::Account(_));
            if by_account_alone && on_exceed == OnExceed::Refuse && !l.shadow {
                return Err(err(
                    at.on_exceed.clone().or(at.key.clone()),
                    "counts failures per account and refuses when exceeded: an attacker who \
                     knows only the account name could lock its owner out. Use \
                     `on_exceed = \"challenge\"` or `on_exceed = \"delay\"` (and refuse per \
                     IP or per IP+account instead)"
                        .into(),
                ));
            }
            l.failures = Some(statuses.into());
        }
        if l.rule.is_concurrency() && on_exceed != OnExceed::Refuse {
            return Err(err(
                at.on_exceed.clone().or(at.key.clone()),
                "a concurrency limit can only refuse: past max_in_flight no slot is taken, \
                 so a delayed or challenged request would run uncounted"
                    .into(),
            ));
        }
        if let OnExceed::Delay(d) = on_exceed {
            if d.is_zero() || d > MAX_DELAY {
                return Err(err(
                    at.delay.clone(),
                    format!(
                        "delay must be longer than zero and at most {} s (a request is held that long)",
                        MAX_DELAY.as_secs()
                    ),
                ));
            }
        }
        l.on_exceed = on_exceed;
        Ok(())
    }

    /// `[plans.<plan>.<limit>]`: the limit's numbers for callers on `plan`.
    pub(super) fn add_plan_rule(
        &mut self,
        plan: &str,
        plan_span: Span,
        limit: &str,
        limit_span: Span,
        spans: &RuleSpans,
        rule: impl FnOnce(&Rule) -> Result<Rule, String>,
    ) -> Result<(), ConfigError> {
        self.check_name("plan name", plan, plan_span)?;
        let Some(i) = self.limits.iter().position(|l| &*l.name == limit) else {
            let known = self.limits.iter().map(|l| &*l.name);
            return Err(unknown_limit(self.src, known, limit, limit_span));
        };
        let r = rule(&self.limits[i].rule).map_err(|e| self.err(limit_span.clone(), e))?;
        self.check_rule(limit, &r, spans)?;
        self.limits[i].plans.insert(plan.into(), r);
        self.plans.insert(plan.to_owned());
        Ok(())
    }

    pub(super) fn check_route(
        &mut self,
        path: &str,
        methods: Option<&[Method]>,
        span: Span,
    ) -> Result<(), ConfigError> {
        if !path.starts_with('/') {
            return Err(self.err(span, format!("route path {path:?} must start with '/'")));
        }
        let keys: Vec<Option<Method>> = match methods {
            None => vec![None],
            Some(ms) => ms.iter().cloned().map(Some).collect(),
        };
        for k in keys {
            let label = k.as_ref().map_or("*", Method::as_str).to_owned();
            if !self.routes_seen.insert((path.to_owned(), k)) {
                return Err(self.err(
                    span.clone(),
                    format!("route {label} {path} is listed twice"),
                ));
            }
        }
        Ok(())
    }

    /// Resolves a route's limit names. Call after every limit and plan is in.
    /// `label`: the route template (`default` for the default policy), its
    /// metrics' `route` label.
    pub(super) fn policy<'n>(
        &self,
        limits: &[Arc<Limit>],
        names: impl Iterator<Item = (&'n str, Span)>,
        route: RouteSettings,
        label: &str,
    ) -> Result<Arc<Policy>, ConfigError> {
        let RouteSettings {
            cost,
            cost_span,
            on_redis_error,
            shadow,
            refund,
            priority,
        } = route;
        if cost == 0 {
            return Err(self.err(cost_span, "cost must be at least 1"));
        }
        let mut picked: Vec<Arc<Limit>> = Vec::new();
        for (name, span) in names {
            let Some(l) = limits.iter().find(|l| &*l.name == name) else {
                let known = limits.iter().map(|l| &*l.name);
                return Err(unknown_limit(self.src, known, name, span));
            };
            let smallest = l
                .plans
                .values()
                .map(Rule::capacity)
                .fold(l.rule.capacity(), f64::min);
            // A concurrency limit takes one slot whatever the cost.
            if f64::from(cost) > smallest && !l.rule.is_concurrency() {
                let holds = if l.plans.is_empty() {
                    format!("capacity {smallest}")
                } else {
                    format!("{smallest} on its smallest plan")
                };
                return Err(self.err(
                    cost_span.clone(),
                    format!("cost {cost} is more than limit {name:?} can ever hold ({holds}); every request would be refused"),
                ));
            }
            if picked.iter().any(|x| Arc::ptr_eq(x, l)) {
                return Err(self.err(span, format!("limit {name:?} is listed twice")));
            }
            let delays = |x: &Limit| matches!(x.on_exceed, OnExceed::Delay(_));
            let slots_and_delay = |a: &Limit, b: &Limit| a.rule.is_concurrency() && delays(b);
            if picked
                .iter()
                .any(|x| slots_and_delay(x, l) || slots_and_delay(l, x))
            {
                return Err(self.err(
                    span,
                    format!(
                        "limit {name:?}: a route cannot have both a concurrency limit and a limit \
                         that delays (on_exceed = \"delay\"): a delayed request would hold its \
                         slot while it waits"
                    ),
                ));
            }
            picked.push(Arc::clone(l));
        }
        Ok(Arc::new(Policy {
            traits: crate::route::Traits::of(&picked),
            limits: picked,
            cost,
            on_redis_error,
            shadow,
            refund,
            degraded_log: Default::default(),
            priority,
            ietf_policy: Default::default(),
            metrics: crate::metrics::PolicyMetrics::new(label),
        }))
    }
}

/// A limit name that is not among `known` (the limits defined).
pub(super) fn unknown_limit<'a>(
    src: &str,
    known: impl Iterator<Item = &'a str>,
    name: &str,
    span: Span,
) -> ConfigError {
    let known: Vec<&str> = known.collect();
    ConfigError::at(
        src,
        span,
        format!("unknown limit {name:?} (defined: {})", known.join(", ")),
    )
}
