//! The metrics, registered with the `metrics` facade (feature `metrics`).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use ::metrics::{Counter, Gauge, Histogram, SharedString};

use super::labels::{LeaseRefusal, Precision, Script, SlotRelease, Verdict};
use super::names::*;

/// One limit's handles within one route.
#[derive(Debug)]
struct LimitMetrics {
    decisions: [Counter; Verdict::ALL.len()],
    refused_cache_hits: Counter,
    lease_grants: Counter,
    lease_stranded: Counter,
    lease_refusals: [Counter; LeaseRefusal::ALL.len()],
}

/// A route's handles: its label, and each limit's handles once the
/// route has decided a request.
#[derive(Debug)]
pub(crate) struct PolicyMetrics {
    route: SharedString,
    limits: OnceLock<Box<[LimitMetrics]>>,
}

impl PolicyMetrics {
    /// `route`: the route template, or `default` for the default policy.
    pub(crate) fn new(route: &str) -> Self {
        Self {
            route: SharedString::from(Arc::<str>::from(route)),
            limits: OnceLock::new(),
        }
    }

    /// `names`: the route's limits, read when its handles are made.
    fn limits<'n>(&self, names: impl Iterator<Item = &'n Arc<str>>) -> &[LimitMetrics] {
        self.limits.get_or_init(|| {
            describe();
            let route = &self.route;
            let one = |limit: &Arc<str>| {
                let limit = SharedString::from(Arc::clone(limit));
                let labels = |o: Verdict| {
                    [
                        ("route", route.clone()),
                        ("limit", limit.clone()),
                        ("outcome", SharedString::from(o.as_str())),
                    ]
                };
                let plain = [("route", route.clone()), ("limit", limit.clone())];
                LimitMetrics {
                    decisions: Verdict::ALL.map(|o| ::metrics::counter!(DECISIONS, &labels(o))),
                    refused_cache_hits: ::metrics::counter!(REFUSED_CACHE_HITS, &plain),
                    lease_grants: ::metrics::counter!(LEASE_GRANTS, &plain),
                    lease_stranded: ::metrics::counter!(LEASE_STRANDED, &plain),
                    lease_refusals: LeaseRefusal::ALL.map(|r| {
                        let labels = [
                            ("route", route.clone()),
                            ("limit", limit.clone()),
                            ("reason", SharedString::from(r.as_str())),
                        ];
                        ::metrics::counter!(LEASE_REFUSALS, &labels)
                    }),
                }
            };
            names.map(one).collect()
        })
    }
}

/// Counts a decision of a route (its handles `m`, its limits `names`):
/// each limit's outcome, and whether it was a refusal remembered from
/// Redis (a refused-cache hit). Lazy: without the feature, `outcomes`
/// is never read.
// Always: once per decision, its iterators then fold into the caller's.
#[inline(always)]
pub(crate) fn decided<'n>(
    m: &PolicyMetrics,
    names: impl Iterator<Item = &'n Arc<str>>,
    outcomes: impl Iterator<Item = (Verdict, bool)>,
) {
    for (m, (outcome, remembered)) in m.limits(names).iter().zip(outcomes) {
        m.decisions[outcome as usize].increment(1);
        if remembered {
            m.refused_cache_hits.increment(1);
        }
    }
}

/// Redis granted a lease to limit `i` of a route.
pub(crate) fn lease_granted<'n>(
    m: &PolicyMetrics,
    names: impl Iterator<Item = &'n Arc<str>>,
    i: usize,
) {
    if let Some(m) = m.limits(names).get(i) {
        m.lease_grants.increment(1);
    }
}

/// `tokens` of limit 0's lease lapsed unspent (or were replaced).
/// Lazy: without the feature, nothing is read.
pub(crate) fn lease_stranded<'n>(
    m: &PolicyMetrics,
    names: impl Iterator<Item = &'n Arc<str>>,
    tokens: f64,
) {
    if tokens <= 0.0 || !tokens.is_finite() {
        return;
    }
    // Whole requests' worth: a lease holds whole costs.
    if let Some(m) = m.limits(names).first() {
        m.lease_stranded.increment(tokens.round() as u64);
    }
}

/// Limit 0's lease table refused a request, without Redis.
pub(crate) fn lease_refused<'n>(
    m: &PolicyMetrics,
    names: impl Iterator<Item = &'n Arc<str>>,
    why: LeaseRefusal,
) {
    if let Some(m) = m.limits(names).first() {
        m.lease_refusals[why as usize].increment(1);
    }
}

/// The store's handles: call durations by result, calls and checks by
/// script.
pub(crate) struct StoreMetrics {
    ok: Histogram,
    /// By `StoreError::reason`, registered at the first such error.
    errors: [OnceLock<Histogram>; REASONS.len()],
    calls: [Counter; 3],
    checks: [Counter; 3],
    precision: [Counter; Precision::ALL.len()],
    releases: [Counter; SlotRelease::ALL.len()],
    /// Per kind of redirection, decided (0) or left to the policy (1).
    redirects: [[Counter; 2]; REDIRECTS.len()],
}

/// The `kind` label of `fleetlimit_cluster_redirects_total`, in the order
/// `per_node.rs` counts them.
const REDIRECTS: [&str; 4] = ["moved", "ask", "tryagain", "not_local"];

const REASONS: [&str; 8] = [
    "timeout",
    "late",
    "unavailable",
    "redis-error",
    "protocol",
    "script-error",
    "overloaded",
    "circuit-open",
];

impl StoreMetrics {
    pub(crate) fn new() -> Self {
        describe();
        let script = |s: &'static str| [("script", s)];
        Self {
            ok: ::metrics::histogram!(STORE_CALL, "result" => "ok"),
            errors: Default::default(),
            calls: [
                ::metrics::counter!(SCRIPT_CALLS, &script("lean")),
                ::metrics::counter!(SCRIPT_CALLS, &script("decide")),
                ::metrics::counter!(SCRIPT_CALLS, &script("lease")),
            ],
            checks: [
                ::metrics::counter!(SCRIPT_CHECKS, &script("lean")),
                ::metrics::counter!(SCRIPT_CHECKS, &script("decide")),
                ::metrics::counter!(SCRIPT_CHECKS, &script("lease")),
            ],
            precision: Precision::ALL
                .map(|p| ::metrics::counter!(PRECISION, "event" => p.as_str())),
            releases: SlotRelease::ALL
                .map(|r| ::metrics::counter!(SLOT_RELEASES, "result" => r.as_str())),
            redirects: REDIRECTS.map(|kind| {
                ["decided", "policy"].map(|outcome| {
                    ::metrics::counter!(CLUSTER_REDIRECTS, "kind" => kind, "outcome" => outcome)
                })
            }),
        }
    }

    /// A Cluster's call met redirection `kind` (an index of `REDIRECTS`);
    /// its checks were all `decided` by Redis, or not.
    pub(crate) fn redirected(&self, kind: usize, decided: bool) {
        if let Some(counts) = self.redirects.get(kind) {
            counts[usize::from(!decided)].increment(1);
        }
    }

    /// `n` failed slot releases came to `result`.
    pub(crate) fn slot_release(&self, result: SlotRelease, n: u64) {
        self.releases[result as usize].increment(n);
    }

    /// `checks` checks spent or settled precision as `event` says.
    pub(crate) fn precision(&self, event: Precision, checks: u64) {
        self.precision[event as usize].increment(checks);
    }

    /// A script call carrying `checks` checks is sent.
    pub(crate) fn sent(&self, script: Script, checks: usize) {
        let i = script as usize;
        self.calls[i].increment(1);
        self.checks[i].increment(checks as u64);
    }

    /// Starts timing a store call.
    pub(crate) fn start(&self) -> CallTimer {
        CallTimer(Instant::now())
    }

    /// A store call timed by `t` answered: `Ok`, or the error's
    /// `StoreError::reason`.
    pub(crate) fn answered(&self, t: CallTimer, result: Result<(), &'static str>) {
        let secs = t.0.elapsed().as_secs_f64();
        match result {
            Ok(()) => self.ok.record(secs),
            Err(reason) => {
                let Some(i) = REASONS.iter().position(|r| *r == reason) else {
                    return;
                };
                self.errors[i]
                    .get_or_init(|| ::metrics::histogram!(STORE_CALL, "result" => reason))
                    .record(secs);
            }
        }
    }
}

/// When a store call was sent.
pub(crate) struct CallTimer(Instant);

/// The `local` write-back's units (whole or fractional), by result.
#[derive(Debug)]
pub(crate) struct WriteBackUnits {
    charged: Counter,
    clamped: Counter,
    lost: Counter,
    expired: Counter,
}

impl WriteBackUnits {
    pub(crate) fn new() -> Self {
        describe();
        let c = |r: &'static str| ::metrics::counter!(WRITE_BACK, "result" => r);
        Self {
            charged: c("charged"),
            clamped: c("clamped"),
            lost: c("lost"),
            expired: c("expired"),
        }
    }

    /// Charged to the primary store.
    pub(crate) fn charged(&self, units: f64) {
        self.charged.increment(whole(units));
    }

    /// Not charged: the key held less.
    pub(crate) fn clamped(&self, units: f64) {
        self.clamped.increment(whole(units));
    }

    /// Forgotten before they were written back (bounded ledger, reload).
    pub(crate) fn lost(&self, units: f64) {
        self.lost.increment(whole(units));
    }

    /// No longer weighing on the key when their turn came.
    pub(crate) fn expired(&self, units: f64) {
        self.expired.increment(whole(units));
    }
}

/// Units as a count: rounded up (a fraction spent is spent).
fn whole(units: f64) -> u64 {
    units.max(0.0).ceil() as u64
}

/// One circuit breaker's state gauges and transition counters (the
/// `node` label: `store`, or a cluster primary's `host:port`).
#[derive(Debug)]
pub(crate) struct BreakerMetrics {
    state: [Gauge; 3],
    transitions: [Counter; 3],
}

/// The `state` label of a breaker's state byte (0 closed, 1 open, 2
/// half-open, as breaker.rs stores it).
const STATES: [&str; 3] = ["closed", "open", "half_open"];

impl BreakerMetrics {
    pub(crate) fn new(node: &str) -> Self {
        describe();
        let node = SharedString::from(Arc::<str>::from(node));
        let labels = |s: &'static str, key: &'static str| {
            [("node", node.clone()), (key, SharedString::from(s))]
        };
        let m = Self {
            state: STATES.map(|s| ::metrics::gauge!(BREAKER_STATE, &labels(s, "state"))),
            transitions: STATES.map(|s| ::metrics::counter!(BREAKER_TRANSITIONS, &labels(s, "to"))),
        };
        m.show(0);
        m
    }

    fn show(&self, state: u8) {
        for (i, g) in self.state.iter().enumerate() {
            g.set(if i == usize::from(state) { 1.0 } else { 0.0 });
        }
    }

    /// The breaker entered `state`.
    pub(crate) fn entered(&self, state: u8) {
        if let Some(c) = self.transitions.get(usize::from(state)) {
            c.increment(1);
        }
        self.show(state);
    }
}

/// The plan cache's hit and miss counters.
#[derive(Debug)]
pub(crate) struct PlanMetrics {
    hit: Counter,
    miss: Counter,
}

impl PlanMetrics {
    pub(crate) fn new() -> Self {
        describe();
        Self {
            hit: ::metrics::counter!(PLAN_CACHE, "result" => "hit"),
            miss: ::metrics::counter!(PLAN_CACHE, "result" => "miss"),
        }
    }

    /// Answered from the cache.
    pub(crate) fn hit(&self) {
        self.hit.increment(1);
    }

    /// The resolver is asked (or already being asked) for this key.
    pub(crate) fn miss(&self) {
        self.miss.increment(1);
    }
}

/// Refusals the refused-key cache answered from entries a reset then
/// voided (`fleetlimit_precision_events_total{event="refused_cache_voided"}`).
#[derive(Debug)]
pub(crate) struct RefusedMetrics(Counter);

impl RefusedMetrics {
    pub(crate) fn new() -> Self {
        describe();
        Self(::metrics::counter!(PRECISION, "event" => "refused_cache_voided"))
    }

    pub(crate) fn voided(&self, refusals: u64) {
        self.0.increment(refusals);
    }
}

/// The fleet size gauge.
#[derive(Debug)]
pub(crate) struct FleetMetrics(Gauge);

impl FleetMetrics {
    pub(crate) fn new() -> Self {
        describe();
        Self(::metrics::gauge!(FLEET_SIZE))
    }

    pub(crate) fn set(&self, n: u32) {
        self.0.set(f64::from(n));
    }
}

/// The regions' exchange of this instance: its calls and cycles (the
/// `region` label: this instance's region).
#[derive(Debug)]
pub(crate) struct RegionMetrics {
    calls: Counter,
    cycles: Counter,
}

impl RegionMetrics {
    pub(crate) fn new(region: &str) -> Self {
        describe();
        let region = SharedString::from(Arc::<str>::from(region));
        let labels = [("region", region)];
        Self {
            calls: ::metrics::counter!(REGION_CALLS, &labels),
            cycles: ::metrics::counter!(REGION_CYCLES, &labels),
        }
    }

    /// A call to any region's Redis.
    pub(crate) fn call(&self) {
        self.calls.increment(1);
    }

    /// A cycle ran.
    pub(crate) fn cycle(&self) {
        self.cycles.increment(1);
    }
}

/// One global limit's quota moves from this region (labels `limit` and
/// `region`: this instance's region).
#[derive(Debug)]
pub(crate) struct QuotaMetrics {
    moved: Counter,
    rebalanced: Counter,
    in_flight: Gauge,
    generations: Counter,
    claims: Counter,
    rules_differ: Gauge,
    shares_held: Gauge,
    /// Per region (this one's unused).
    stale: Box<[Gauge]>,
}

impl QuotaMetrics {
    pub(crate) fn new(region: &str, limit: &Arc<str>, regions: &[Arc<str>]) -> Self {
        describe();
        let labels = [
            ("limit", SharedString::from(Arc::clone(limit))),
            ("region", SharedString::from(Arc::<str>::from(region))),
        ];
        let stale = regions
            .iter()
            .map(|with| {
                let mut l = labels.to_vec();
                l.push(("with", SharedString::from(Arc::clone(with))));
                ::metrics::gauge!(REGION_STALE, &l)
            })
            .collect();
        Self {
            moved: ::metrics::counter!(REGION_MOVED, &labels),
            rebalanced: ::metrics::counter!(REGION_REBALANCED, &labels),
            in_flight: ::metrics::gauge!(REGION_IN_FLIGHT, &labels),
            generations: ::metrics::counter!(REGION_GENERATIONS, &labels),
            claims: ::metrics::counter!(REGION_CLAIMS, &labels),
            rules_differ: ::metrics::gauge!(REGION_RULES_DIFFER, &labels),
            shares_held: ::metrics::gauge!(REGION_SHARES_HELD, &labels),
            stale,
        }
    }

    /// One key's hand-off of `ppm` millionths of the limit.
    pub(crate) fn gave(&self, ppm: u64) {
        self.moved.increment(ppm);
        self.rebalanced.increment(1);
    }

    /// Quota under way at this cycle, in millionths of the limit.
    pub(crate) fn in_flight(&self, ppm: u64) {
        self.in_flight.set(ppm as f64);
    }

    /// This region's Redis was found in a new generation.
    pub(crate) fn generation_changed(&self) {
        self.generations.increment(1);
    }

    /// `n` keys claimed after a restart.
    pub(crate) fn claimed(&self, n: u64) {
        self.claims.increment(n);
    }

    /// Keys whose share here is recorded.
    pub(crate) fn shares_held(&self, n: usize) {
        self.shares_held.set(n as f64);
    }

    /// Seconds since region `y` was last reached.
    pub(crate) fn stale(&self, y: usize, secs: f64) {
        if let Some(g) = self.stale.get(y) {
            g.set(secs);
        }
    }

    /// How many regions' rules differ from this instance's, now.
    pub(crate) fn rules_differ(&self, n: usize) {
        self.rules_differ.set(n as f64);
    }
}
