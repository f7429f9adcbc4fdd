//! Every decision accounted: counted (feature `metrics`) and, for limits
//! with `record`, handed to the decision recorder (`crate::record`).

use std::sync::Arc;

use super::super::Pending;
use super::super::plan::RoutePlan;
use crate::metrics::Verdict;
use crate::record::{Entry, Recorder, Via};
use crate::route::Policy;

/// Counts the decision (feature `metrics`) and hands the decision about
/// each limit that records (see `record.rs`) to the recorder: `state(i)`,
/// limit `i`'s remaining and whether it had room for the request (`None`:
/// not known).
// Always: its closures then fold into the caller's known states.
#[inline(always)]
pub(super) fn record(
    recorder: Option<&Recorder>,
    plan: &RoutePlan,
    p: &Pending,
    allowed: bool,
    state: impl Fn(usize) -> Option<(f64, bool)>,
    via: Via,
) {
    let policy = &plan.policy;
    let buckets = &p.check.buckets;
    crate::metrics::decided(
        &policy.metrics,
        policy.limits.iter().map(|l| &l.name),
        buckets.iter().enumerate().map(|(i, b)| {
            let enough = state(i).map(|s| s.1);
            let outcome = outcome_of(policy, b.shadow, i, allowed, enough, via);
            let remembered = via == Via::Remembered && outcome == Verdict::Refused;
            (outcome, remembered)
        }),
    );
    let Some(recorder) = recorder else {
        return;
    };
    let limits = policy.limits.iter().zip(buckets).zip(&p.keys);
    for (i, ((limit, b), k)) in limits.enumerate() {
        let Some(record) = limit.record else { continue };
        recorder.record(Entry {
            limit: Arc::clone(&limit.name),
            record,
            key: k.log_id.of(&b.key).to_string(),
            plan: k.plan.clone(),
            allowed,
            remaining: state(i).map(|s| s.0),
            enough: state(i).map(|s| s.1),
            via,
        });
    }
}

/// Limit `i`'s part in a decision `via` that `allowed` the request or not
/// (the metrics' `outcome`); `enough`: whether the limit had room (`None`:
/// not known); `soft`: the limit only counts in the store (shadow, or an
/// escalation instead of a refusal, see escalate.rs).
fn outcome_of(
    policy: &Policy,
    soft: bool,
    i: usize,
    allowed: bool,
    enough: Option<bool>,
    via: Via,
) -> Verdict {
    let no_room = enough == Some(false);
    match via {
        Via::Open => Verdict::DegradedOpen,
        Via::Closed => Verdict::DegradedClosed,
        Via::Local if !allowed && no_room && !soft => Verdict::DegradedLocalRefused,
        Via::Local => Verdict::DegradedLocal,
        _ if no_room && soft => {
            if policy.shadow || policy.limits[i].shadow {
                Verdict::ShadowRefused
            } else {
                Verdict::Escalated
            }
        }
        _ if allowed => Verdict::Admitted,
        _ if no_room => Verdict::Refused,
        _ => Verdict::RefusedByOther,
    }
}
