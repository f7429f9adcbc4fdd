//! Every metric's name and help text (docs/metrics.md lists them).

use ::metrics::Unit;

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
pub(crate) const CLUSTER_REDIRECTS: &str = "fleetlimit_cluster_redirects_total";
pub(crate) const REGION_MOVED: &str = "fleetlimit_region_quota_moved_total";
pub(crate) const REGION_REBALANCED: &str = "fleetlimit_region_rebalanced_total";
pub(crate) const REGION_IN_FLIGHT: &str = "fleetlimit_region_quota_in_flight";
pub(crate) const REGION_CALLS: &str = "fleetlimit_region_exchange_calls_total";
pub(crate) const REGION_CYCLES: &str = "fleetlimit_region_exchange_cycles_total";
pub(crate) const REGION_GENERATIONS: &str = "fleetlimit_region_generation_changes_total";
pub(crate) const REGION_CLAIMS: &str = "fleetlimit_region_claims_total";
pub(crate) const REGION_RULES_DIFFER: &str = "fleetlimit_region_rules_differ";
pub(crate) const REGION_SHARES_HELD: &str = "fleetlimit_region_shares_held";
pub(crate) const REGION_STALE: &str = "fleetlimit_region_exchange_stale_seconds";

/// The help texts, given to the recorder with each set of handles
/// (a recorder keeps the last; they never change).
pub(super) fn describe() {
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
        CLUSTER_REDIRECTS,
        Unit::Count,
        "Calls of coalesced checks on a Cluster that met a slot on the move, by kind and outcome"
    );
    describe_counter!(
        WRITE_BACK,
        Unit::Count,
        "Units the local policy admitted, by what the write-back did with them"
    );
    describe_counter!(
        REGION_MOVED,
        Unit::Count,
        "Quota of a global limit this region gave other regions, in millionths of the limit"
    );
    describe_counter!(
        REGION_REBALANCED,
        Unit::Count,
        "Hand-offs of a global limit's quota by this region (one key, one cycle)"
    );
    describe_gauge!(
        REGION_IN_FLIGHT,
        Unit::Count,
        "Quota of a global limit this region gave or holds but the receivers have not yet counted, in millionths of the limit"
    );
    describe_counter!(
        REGION_CALLS,
        Unit::Count,
        "Calls the regions' exchange made to any region's Redis"
    );
    describe_counter!(
        REGION_GENERATIONS,
        Unit::Count,
        "Times this instance found its region's Redis in a new generation of the exchange's state (restarted empty)"
    );
    describe_gauge!(
        REGION_SHARES_HELD,
        Unit::Count,
        "Keys of a global limit whose share in this region is recorded (away from the split), at the last view read"
    );
    describe_gauge!(
        REGION_STALE,
        Unit::Seconds,
        "Seconds since this instance's cycle last reached another region's Redis (label with)"
    );
    describe_gauge!(
        REGION_RULES_DIFFER,
        Unit::Count,
        "Regions whose rule of a global limit differs from this instance's (decided with the smaller while above 0)"
    );
    describe_counter!(
        REGION_CLAIMS,
        Unit::Count,
        "Keys of a global limit this region claimed after its Redis restarted, from the other regions' records"
    );
    describe_counter!(
        REGION_CYCLES,
        Unit::Count,
        "Exchange cycles this instance ran for its region"
    );
    describe_gauge!(
        FLEET_SIZE,
        Unit::Count,
        "Live instances counted by the fleet heartbeat (the local policy's N)"
    );
}
