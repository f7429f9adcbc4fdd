//! One `DEBUG` span per decision, `fleetlimit.decide`, so a request's trace
//! shows the limiter's time: the route, its limits, the first key's log id
//! (a digest for API keys, never the raw value), the outcome and whether
//! the decision was degraded. Nothing is built when no tracing subscriber
//! takes `DEBUG`; either way the request is decided by the same code.

use tracing::field::{display, Empty};
use tracing::{Instrument, Span};

use super::{Decided, Decision, Pending};
use crate::key::LogId;

/// The decision's span, when a subscriber takes it; `route`: the request's
/// `MatchedPath`.
#[inline]
pub(super) fn span(route: Option<&str>) -> Option<Span> {
    // No subscriber takes DEBUG: one load, no span (under tracing's `log`
    // feature a disabled span still builds and records its fields for
    // `log`, which is not where this span is read).
    if !tracing::level_enabled!(tracing::Level::DEBUG) {
        return None;
    }
    let span = tracing::debug_span!(
        target: "fleetlimit",
        "fleetlimit.decide",
        route = route.unwrap_or("-"),
        limit = Empty,
        key = Empty,
        outcome = Empty,
        status = Empty,
        degraded = false,
    );
    (!span.is_disabled()).then_some(span)
}

/// `decide(p)` inside the decision's span.
pub(super) fn traced(
    route: Option<&str>,
    p: Pending,
    decide: impl FnOnce(Pending) -> Decided,
) -> Decided {
    let Some(span) = span(route) else {
        return decide(p);
    };
    let limits: Vec<&str> = p.policy.limits.iter().map(|l| &*l.name).collect();
    span.record("limit", limits.join(",").as_str());
    if let Some(k) = p.keys.first() {
        key(&span, k.log_id, &k.key);
    }
    match span.in_scope(|| decide(p)) {
        Decided::Now(d) => {
            outcome(&span, &d);
            Decided::Now(d)
        }
        Decided::Later(f) => Decided::Later(Box::pin(async move {
            let d = f.instrument(span.clone()).await;
            outcome(&span, &d);
            d
        })),
        Decided::Unlimited => Decided::Unlimited,
    }
}

/// The first key's log id onto the span.
pub(super) fn key(span: &Span, id: LogId, key: &str) {
    span.record("key", display(id.of(key)));
}

/// The decision's outcome onto the span.
pub(super) fn outcome(span: &Span, d: &Decision) {
    match d {
        Decision::Admit(_) => span.record("outcome", "admitted"),
        Decision::Reject(r) => {
            span.record("outcome", "refused");
            span.record("status", r.status.as_u16())
        }
    };
}

/// Marks the current decision's span degraded (a failure policy answered).
pub(super) fn degraded() {
    Span::current().record("degraded", true);
}
