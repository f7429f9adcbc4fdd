//! Without the feature `metrics`: every type empty, every function a
//! no-op, so the call sites need no `cfg`.

use std::sync::Arc;

use super::labels::{LeaseRefusal, Precision, Script, SlotRelease, Verdict};

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
    _: impl Iterator<Item = (Verdict, bool)>,
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
pub(crate) fn lease_stranded<'n>(_: &PolicyMetrics, _: impl Iterator<Item = &'n Arc<str>>, _: f64) {
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

    pub(crate) fn redirected(&self, _: usize, _: bool) {}
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

#[derive(Debug)]
pub(crate) struct RegionMetrics;

impl RegionMetrics {
    #[inline(always)]
    pub(crate) fn new(_region: &str) -> Self {
        Self
    }
    #[inline(always)]
    pub(crate) fn call(&self) {}
    #[inline(always)]
    pub(crate) fn cycle(&self) {}
}

#[derive(Debug)]
pub(crate) struct QuotaMetrics;

impl QuotaMetrics {
    #[inline(always)]
    pub(crate) fn new(_region: &str, _limit: &Arc<str>, _regions: &[Arc<str>]) -> Self {
        Self
    }
    #[inline(always)]
    pub(crate) fn gave(&self, _: u64) {}
    #[inline(always)]
    pub(crate) fn in_flight(&self, _: u64) {}
    #[inline(always)]
    pub(crate) fn generation_changed(&self) {}
    #[inline(always)]
    pub(crate) fn claimed(&self, _: u64) {}
    #[inline(always)]
    pub(crate) fn rules_differ(&self, _: usize) {}
    #[inline(always)]
    pub(crate) fn shares_held(&self, _: usize) {}
    #[inline(always)]
    pub(crate) fn stale(&self, _: usize, _: f64) {}
}
