//! [`Stats`]: what a layer has counted, one snapshot.

use std::fmt;

use crate::breaker::{BreakerState, BreakerStats};
use crate::record::RecordStats;
use crate::region::RegionStats;

/// What a layer has counted since it was built, read at once
/// ([`RateLimitLayer::stats`](crate::RateLimitLayer::stats); a cluster
/// primary's own breaker: [`node_breakers`](crate::RateLimitLayer::node_breakers)).
///
/// Three parts, each there only when the layer has it, so each accessor
/// answers `None` without its part:
///
/// - `breaker_*`: the circuit breaker in front of the store (none on the
///   in-process store, which cannot fail); on a Redis Cluster, every
///   node's breaker added up, with the worst state;
/// - `records_*`: the decision recorder (none when no limit has `record`,
///   or the store is not the configuration's Redis);
/// - `region_*`: this instance's part of the quota exchange (`[regions]`
///   with a global limit, `docs/regions.md`).
///
/// ```
/// use fleetlimit::RateLimitLayer;
///
/// fn redis_is_shunned(layer: &RateLimitLayer) -> bool {
///     layer.stats().breaker_state().is_some_and(|s| s != "closed")
/// }
///
/// fn export(layer: &RateLimitLayer) {
///     let s = layer.stats();
///     if let (Some(state), Some(opened)) = (s.breaker_state(), s.breaker_opened()) {
///         println!("breaker {state}: opened {opened} times");
///     }
/// }
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    breaker: Option<BreakerStats>,
    records: Option<RecordStats>,
    region: Option<RegionStats>,
}

impl Stats {
    pub(crate) fn new(
        breaker: Option<BreakerStats>,
        records: Option<RecordStats>,
        region: Option<RegionStats>,
    ) -> Self {
        Self {
            breaker,
            records,
            region,
        }
    }

    /// The breaker's state: `"closed"` (calls go to the store), `"open"`
    /// (calls are refused at once, the failure policy decides) or
    /// `"half_open"` (a few probe calls test whether the store is back);
    /// the names of the metric `fleetlimit_breaker_state`.
    #[must_use]
    pub fn breaker_state(&self) -> Option<&'static str> {
        self.breaker.map(|b| match b.state {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        })
    }

    /// Times the breaker opened.
    #[must_use]
    pub fn breaker_opened(&self) -> Option<u64> {
        self.breaker.map(|b| b.opened)
    }

    /// Times the breaker closed again after being open.
    #[must_use]
    pub fn breaker_closed(&self) -> Option<u64> {
        self.breaker.map(|b| b.closed)
    }

    /// Checks answered without calling the store because the breaker was
    /// open.
    #[must_use]
    pub fn breaker_short_circuited(&self) -> Option<u64> {
        self.breaker.map(|b| b.short_circuited)
    }

    /// Store calls that failed (errors and deadline misses).
    #[must_use]
    pub fn breaker_failures(&self) -> Option<u64> {
        self.breaker.map(|b| b.failures)
    }

    /// Decision records Redis acknowledged.
    #[must_use]
    pub fn records_written(&self) -> Option<u64> {
        self.records.map(|r| r.written)
    }

    /// Decision records dropped because the queue was full (Redis slower
    /// than the traffic).
    #[must_use]
    pub fn records_dropped(&self) -> Option<u64> {
        self.records.map(|r| r.dropped)
    }

    /// Decision records in a batch Redis refused or did not answer within
    /// the deadline (a timed-out batch may still have been written).
    #[must_use]
    pub fn records_failed(&self) -> Option<u64> {
        self.records.map(|r| r.failed)
    }

    /// Quota this region gave away, summed over keys, in millionths of a
    /// limit (a key's whole limit moved once counts 1,000,000).
    #[must_use]
    pub fn region_moved(&self) -> Option<u64> {
        self.region.map(|r| r.moved)
    }

    /// Hand-offs: one key given away in one cycle.
    #[must_use]
    pub fn region_rebalanced(&self) -> Option<u64> {
        self.region.map(|r| r.rebalanced)
    }

    /// Quota this region gave but the receivers have not yet counted, at
    /// each global limit's last cycle, summed (in millionths of a limit):
    /// missing for a while, never counted twice.
    #[must_use]
    pub fn region_in_flight(&self) -> Option<u64> {
        self.region.map(|r| r.in_flight)
    }

    /// Calls the exchange made to any region's Redis (reads of this
    /// region's shares included).
    #[must_use]
    pub fn region_calls(&self) -> Option<u64> {
        self.region.map(|r| r.calls)
    }

    /// Cycles this instance ran (one region runs one an interval).
    #[must_use]
    pub fn region_cycles(&self) -> Option<u64> {
        self.region.map(|r| r.cycles)
    }
}

impl fmt::Debug for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Stats");
        if let Some(b) = &self.breaker {
            d.field("breaker", b);
        }
        if let Some(r) = &self.records {
            d.field("records", r);
        }
        if let Some(r) = &self.region {
            d.field("region", r);
        }
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::breaker::{Breaker, Permit};
    use crate::config::BreakerConfig;
    use crate::store::StoreError;

    /// A breaker opened by `failures` refused calls, then asked once more
    /// (short-circuited).
    fn opened_breaker() -> Breaker {
        let b = Breaker::new(BreakerConfig {
            failures: 2,
            window: Duration::from_millis(100),
            cool_off: Duration::from_secs(1),
            probes: 1,
        });
        for _ in 0..2 {
            b.record(b.permit(), Some(&StoreError::Unavailable(String::new())));
        }
        assert_eq!(b.permit(), Permit::Refuse);
        b
    }

    // What the removed `BreakerState` example did: "Redis is shunned" is
    // a breaker state other than closed, now read through `Stats`.
    #[tokio::test(start_paused = true)]
    async fn a_shunned_store_is_a_breaker_state_other_than_closed() {
        let closed = Breaker::new(BreakerConfig::default());
        let shunned = |b: Option<&Breaker>| {
            Stats::new(b.map(Breaker::stats), None, None)
                .breaker_state()
                .is_some_and(|s| s != "closed")
        };
        assert!(!shunned(Some(&closed)));
        assert!(shunned(Some(&opened_breaker())));
        // No breaker (the in-process store): never shunned.
        assert!(!shunned(None));
        assert_eq!(Stats::default().breaker_state(), None);
    }

    // What the removed `BreakerStats` example exported: state, times
    // opened, checks not sent.
    #[tokio::test(start_paused = true)]
    async fn the_breaker_counters_read_through_stats() {
        let b = opened_breaker();
        let s = Stats::new(Some(b.stats()), None, None);
        assert_eq!(s.breaker_state(), Some("open"));
        assert_eq!(s.breaker_opened(), Some(1));
        assert_eq!(s.breaker_short_circuited(), Some(1));
        assert_eq!(s.breaker_failures(), Some(2));
        assert_eq!(s.breaker_closed(), Some(0));
        assert_eq!(s.records_written(), None);
        assert_eq!(s.region_moved(), None);
    }
}
