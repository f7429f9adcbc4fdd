//! A limit's `scope = "global"`: its share of the limit in each region
//! (`crate::region` decides and moves shares; `docs/regions.md`).

/// A whole limit, in the parts-per-million shares are counted in (integers
/// in Redis, so a sum is exact).
pub(crate) const WHOLE: u32 = 1_000_000;

/// A limit's `scope = "global"`: its share in each region before any
/// exchange, in [`WHOLE`]s, in the order of `crate::config::Regions::names` (their sum is
/// at most [`WHOLE`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Global {
    pub(crate) split: Box<[u32]>,
}
