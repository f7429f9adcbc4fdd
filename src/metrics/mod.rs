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

pub(crate) use self::labels::{LeaseRefusal, Precision, Script, SlotRelease, Verdict};
#[cfg(not(feature = "metrics"))]
pub(crate) use self::off::*;
#[cfg(feature = "metrics")]
pub(crate) use self::on::*;

mod labels;
#[cfg(feature = "metrics")]
mod names;
#[cfg(not(feature = "metrics"))]
mod off;
#[cfg(feature = "metrics")]
mod on;

// The outcome rules do not depend on the feature: tested either way.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_labels_are_distinct() {
        let mut seen: Vec<&str> = Verdict::ALL.iter().map(|o| o.as_str()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), Verdict::ALL.len());
        for (i, o) in Verdict::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "ALL is in declaration order");
        }
    }
}
