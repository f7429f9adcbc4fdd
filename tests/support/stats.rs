//! A layer's `Stats` by part, as plain fields: what the tests assert on
//! and print (each part `None` when the layer has none, as `Stats` says).

use fleetlimit::RateLimitLayer;
use fleetlimit::layer::Stats;

/// The circuit breaker's part (`Stats::breaker_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Breaker {
    /// `"closed"`, `"open"` or `"half_open"`.
    pub state: &'static str,
    pub opened: u64,
    pub closed: u64,
    pub short_circuited: u64,
    pub failures: u64,
}

/// The decision recorder's part (`Stats::records_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Records {
    pub written: u64,
    pub dropped: u64,
    pub failed: u64,
}

/// The regional quota exchange's part (`Stats::region_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub moved: u64,
    pub rebalanced: u64,
    pub in_flight: u64,
    pub calls: u64,
    pub cycles: u64,
}

pub fn breaker_of(s: &Stats) -> Option<Breaker> {
    Some(Breaker {
        state: s.breaker_state()?,
        opened: s.breaker_opened()?,
        closed: s.breaker_closed()?,
        short_circuited: s.breaker_short_circuited()?,
        failures: s.breaker_failures()?,
    })
}

/// Each part of `layer.stats()`.
pub trait Parts {
    fn breaker(&self) -> Option<Breaker>;
    fn records(&self) -> Option<Records>;
    fn region(&self) -> Option<Region>;
    /// `node_breakers()`, each node's breaker part.
    fn nodes(&self) -> Vec<(String, Breaker)>;
}

impl Parts for RateLimitLayer {
    fn breaker(&self) -> Option<Breaker> {
        breaker_of(&self.stats())
    }

    fn records(&self) -> Option<Records> {
        let s = self.stats();
        Some(Records {
            written: s.records_written()?,
            dropped: s.records_dropped()?,
            failed: s.records_failed()?,
        })
    }

    fn region(&self) -> Option<Region> {
        let s = self.stats();
        Some(Region {
            moved: s.region_moved()?,
            rebalanced: s.region_rebalanced()?,
            in_flight: s.region_in_flight()?,
            calls: s.region_calls()?,
            cycles: s.region_cycles()?,
        })
    }

    fn nodes(&self) -> Vec<(String, Breaker)> {
        self.node_breakers()
            .into_iter()
            .map(|(n, s)| (n, breaker_of(&s).expect("a node's breaker")))
            .collect()
    }
}
