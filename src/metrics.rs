//! Metrics through the [`metrics`](https://docs.rs/metrics) facade
//! (feature `metrics`; every metric is listed in docs/metrics.md).
//!
//! Every handle is registered once and kept: a route's when it first
//! decides a request, the store's, breakers' and plan cache's when they are
//! built. The request path then only adds to the recorder's atomics: no
//! label is formatted and no key is built per request. Labels are route
//! templates, limit names and closed sets of words, never a caller's key.
//!
//! Without the feature every type here is empty and every function does
//! nothing, so the call sites need no `cfg`.

#[cfg(not(feature = "metrics"))]
pub(crate) use self::off::*;
#[cfg(feature = "metrics")]
pub(crate) use self::on::*;

/// Which script a call ran (the `script` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Script {
    /// The single-token-bucket script, which also carries coalesced checks.
    Lean,
    /// The general script (several limits, windows, concurrency).
    Decide,
    /// A hot key's partial lease.
    Lease,
}

/// Why a hot key's request was refused by this instance's lease table,
/// without Redis (the `reason` label of
/// `fleetlimit_lease_local_refusals_total`).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseRefusal {
    /// The last lease got nothing: the key's free tokens were taken, by
    /// other instances' leases or their requests.
    Elsewhere,
    /// The last lease came short and is spent: waiting for the next one.
    Waiting,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl LeaseRefusal {
    const ALL: [Self; 2] = [Self::Elsewhere, Self::Waiting];

    fn as_str(self) -> &'static str {
        match self {
            Self::Elsewhere => "elsewhere",
            Self::Waiting => "waiting",
        }
    }
}

/// Precision spent by the Redis store's calls, per check (the `event`
/// label of `fleetlimit_precision_events_total`; docs/accuracy.md says
/// what each costs).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Precision {
    /// Given up on, and its answer never came (or was not awaited): Redis
    /// may have charged it before its bound.
    Unknown,
    /// Redis ran it after its bound and changed nothing.
    LateDiscarded,
    /// Its answer came after its caller stopped waiting, charged: given
    /// back.
    SettledCharged,
    /// Its answer came after its caller stopped waiting, not charged.
    SettledUncharged,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl Precision {
    const ALL: [Self; 4] = [
        Self::Unknown,
        Self::LateDiscarded,
        Self::SettledCharged,
        Self::SettledUncharged,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown_outcome",
            Self::LateDiscarded => "late_discarded",
            Self::SettledCharged => "settled_charged",
            Self::SettledUncharged => "settled_uncharged",
        }
    }
}

/// What became of a concurrency slot's release that failed (the `result`
/// label of `fleetlimit_slot_releases_total`; docs/accuracy.md, section
/// "Concurrency slots").
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotRelease {
    /// Failed, queued to be sent again.
    Failed,
    /// Sent again from the queue, and Redis answered.
    Retried,
    /// Pushed out of the full queue: counts until its `max_hold`.
    Dropped,
    /// Refused by Redis on the key's data (not a set of slots): not sent
    /// again.
    Refused,
    /// Still failing after the longest `max_hold`: let go.
    Expired,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl SlotRelease {
    const ALL: [Self; 5] = [
        Self::Failed,
        Self::Retried,
        Self::Dropped,
        Self::Refused,
        Self::Expired,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Self::Failed => "failed",
            Self::Retried => "retried",
            Self::Dropped => "dropped",
            Self::Refused => "refused",
            Self::Expired => "expired",
        }
    }
}

/// What one limit's part of a decision was (the `outcome` label).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Admitted,
    Refused,
    RefusedByOther,
    ShadowRefused,
    Escalated,
    DegradedOpen,
    DegradedClosed,
    DegradedLocal,
    DegradedLocalRefused,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl Outcome {
    const ALL: [Self; 9] = [
        Self::Admitted,
        Self::Refused,
        Self::RefusedByOther,
        Self::ShadowRefused,
        Self::Escalated,
        Self::DegradedOpen,
        Self::DegradedClosed,
        Self::DegradedLocal,
        Self::DegradedLocalRefused,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Refused => "refused",
            Self::RefusedByOther => "refused_by_other",
            Self::ShadowRefused => "shadow_refused",
            Self::Escalated => "escalated",
            Self::DegradedOpen => "degraded_open",
            Self::DegradedClosed => "degraded_closed",
            Self::DegradedLocal => "degraded_local",
            Self::DegradedLocalRefused => "degraded_local_refused",
        }
    }
}

#[cfg(feature = "metrics")]
mod on {
    use std::sync::{Arc, OnceLock};
    use std::time::Instant;

    use ::metrics::{Counter, Gauge, Histogram, SharedString, Unit};

    use super::{LeaseRefusal, Outcome, Precision, Script, SlotRelease};

    pub(crate) const DECISIONS: &str = "fleetlimit_decisions_total";
    pub(crate) const REFUSED_CACHE_HITS: &str = "fleetlimit_refused_cache_hits_total";
    pub(crate) const LEASE_GRANTS: &str = "fleetlimit_lease_grants_total";
    pub(crate) const LEASE_STRANDED: &str = "fleetlimit_lease_stranded_tokens_total";
    pub(crate) const LEASE_REFUSALS: &str = "fleetlimit_lease_local_refusals_total";
    pub(crate) const STORE_CALL: &str = "fleetlimit_store_call_duration_seconds";
    pub(crate) const SCRIPT_CALLS: &str = "fleetlimit_script_calls_total";
    pub(crate) const SCRIPT_CHECKS: &str = "fleetlimit_script_checks_total";
    pub(crate) const BREAKER_STATE: &str = "fleetlimit_breaker_state";
    pub(crate) const BREAKER_TRANSITIONS: &str = "fleetlimit_breaker_transitions_total";
    pub(crate) const PLAN_CACHE: &str = "fleetlimit_plan_cache_lookups_total";
    pub(crate) const FLEET_SIZE: &str = "fleetlimit_fleet_size";
    pub(crate) const PRECISION: &str = "fleetlimit_precision_events_total";
    pub(crate) const WRITE_BACK: &str = "fleetlimit_writeback_units_total";
    pub(crate) const SLOT_RELEASES: &str = "fleetlimit_slot_releases_total";

    /// The help texts, given to the recorder with each set of handles
    /// (a recorder keeps the last; they never change).
    fn describe() {
        use ::metrics::{describe_counter, describe_gauge, describe_histogram};
        describe_counter!(
            DECISIONS,
            Unit::Count,
            "Decisions per route and limit, by outcome (docs/metrics.md)"
        );
        describe_counter!(
            REFUSED_CACHE_HITS,
            Unit::Count,
            "Refusals answered from this instance's refused-key cache, without Redis"
        );
        describe_counter!(
            LEASE_GRANTS,
            Unit::Count,
            "Hot-key token leases Redis granted this instance"
        );
        describe_counter!(
            LEASE_STRANDED,
            Unit::Count,
            "Leased tokens that lapsed unspent on this instance (whole tokens)"
        );
        describe_counter!(
            LEASE_REFUSALS,
            Unit::Count,
            "Refusals of a hot key answered by this instance's lease table, without Redis"
        );
        describe_histogram!(
            STORE_CALL,
            Unit::Seconds,
            "Duration of Redis script calls deciding checks, by result"
        );
        describe_counter!(
            SCRIPT_CALLS,
            Unit::Count,
            "Decision script calls sent to Redis"
        );
        describe_counter!(
            SCRIPT_CHECKS,
            Unit::Count,
            "Request checks carried by decision script calls (coalesced calls carry several)"
        );
        describe_gauge!(
            BREAKER_STATE,
            Unit::Count,
            "1 for the circuit breaker's current state, 0 for the others"
        );
        describe_counter!(
            BREAKER_TRANSITIONS,
            Unit::Count,
            "Circuit breaker transitions, by the state entered"
        );
        describe_counter!(
            PLAN_CACHE,
            Unit::Count,
            "Plan lookups of the plan resolver's cache, by result"
        );
        describe_counter!(
            PRECISION,
            Unit::Count,
            "Checks whose precision was spent or settled, by event (docs/accuracy.md)"
        );
        describe_counter!(
            SLOT_RELEASES,
            Unit::Count,
            "Concurrency slot releases that failed, by what became of them"
        );
        describe_counter!(
            WRITE_BACK,
            Unit::Count,
            "Units the local policy admitted, by what the write-back did with them"
        );
        describe_gauge!(
            FLEET_SIZE,
            Unit::Count,
            "Live instances counted by the fleet heartbeat (the local policy's N)"
        );
    }

    /// One limit's handles within one route.
    #[derive(Debug)]
    struct LimitMetrics {
        decisions: [Counter; Outcome::ALL.len()],
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
                    let labels = |o: Outcome| {
                        [
                            ("route", route.clone()),
                            ("limit", limit.clone()),
                            ("outcome", SharedString::from(o.as_str())),
                        ]
                    };
                    let plain = [("route", route.clone()), ("limit", limit.clone())];
                    LimitMetrics {
                        decisions: Outcome::ALL.map(|o| ::metrics::counter!(DECISIONS, &labels(o))),
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
    pub(crate) fn decided<'n>(
        m: &PolicyMetrics,
        names: impl Iterator<Item = &'n Arc<str>>,
        outcomes: impl Iterator<Item = (Outcome, bool)>,
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
    }

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
                transitions: STATES
                    .map(|s| ::metrics::counter!(BREAKER_TRANSITIONS, &labels(s, "to"))),
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
}

#[cfg(not(feature = "metrics"))]
mod off {
    use std::sync::Arc;

    use super::{LeaseRefusal, Outcome, Precision, Script, SlotRelease};

    #[derive(Debug)]
    pub(crate) struct PolicyMetrics;

    impl PolicyMetrics {
        #[inline(always)]
        pub(crate) fn new(_route: &str) -> Self {
            Self
        }
    }

    #[inline(always)]
    pub(crate) fn decided<'n>(
        _: &PolicyMetrics,
        _: impl Iterator<Item = &'n Arc<str>>,
        _: impl Iterator<Item = (Outcome, bool)>,
    ) {
    }

    #[inline(always)]
    pub(crate) fn lease_granted<'n>(
        _: &PolicyMetrics,
        _: impl Iterator<Item = &'n Arc<str>>,
        _: usize,
    ) {
    }

    #[inline(always)]
    pub(crate) fn lease_stranded<'n>(
        _: &PolicyMetrics,
        _: impl Iterator<Item = &'n Arc<str>>,
        _: f64,
    ) {
    }

    #[inline(always)]
    pub(crate) fn lease_refused<'n>(
        _: &PolicyMetrics,
        _: impl Iterator<Item = &'n Arc<str>>,
        _: LeaseRefusal,
    ) {
    }

    pub(crate) struct StoreMetrics;

    impl StoreMetrics {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn sent(&self, _: Script, _: usize) {}
        #[inline(always)]
        pub(crate) fn start(&self) -> CallTimer {
            CallTimer
        }
        #[inline(always)]
        pub(crate) fn answered(&self, _: CallTimer, _: Result<(), &'static str>) {}

        pub(crate) fn precision(&self, _: Precision, _: u64) {}

        pub(crate) fn slot_release(&self, _: SlotRelease, _: u64) {}
    }

    pub(crate) struct CallTimer;

    #[derive(Debug)]
    pub(crate) struct WriteBackUnits;

    impl WriteBackUnits {
        pub(crate) fn new() -> Self {
            Self
        }
        pub(crate) fn charged(&self, _: f64) {}
        pub(crate) fn clamped(&self, _: f64) {}
        pub(crate) fn lost(&self, _: f64) {}
        pub(crate) fn expired(&self, _: f64) {}
    }

    #[derive(Debug)]
    pub(crate) struct BreakerMetrics;

    impl BreakerMetrics {
        #[inline(always)]
        pub(crate) fn new(_node: &str) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn entered(&self, _: u8) {}
    }

    #[derive(Debug)]
    pub(crate) struct PlanMetrics;

    impl PlanMetrics {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn hit(&self) {}
        #[inline(always)]
        pub(crate) fn miss(&self) {}
    }

    #[derive(Debug)]
    pub(crate) struct RefusedMetrics;

    impl RefusedMetrics {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn voided(&self, _: u64) {}
    }

    #[derive(Debug)]
    pub(crate) struct FleetMetrics;

    impl FleetMetrics {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn set(&self, _: u32) {}
    }
}

// The outcome rules do not depend on the feature: tested either way.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_labels_are_distinct() {
        let mut seen: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), Outcome::ALL.len());
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "ALL is in declaration order");
        }
    }
}
