//! One `DEBUG` span per decision, `fleetlimit.decide`, so a request's trace
//! shows the limiter's time: the route, its limits, the first key's log id
//! (a digest for API keys, never the raw value), the outcome and whether
//! the decision was degraded. Nothing is built when no tracing subscriber
//! takes `DEBUG`; either way the request is decided by the same code.

use tracing::field::{Empty, display};
use tracing::{Instrument, Span};

use super::plan::RoutePlan;
use super::{Decided, Decision, Pending};

/// The decision's span, when a subscriber takes it; `route`: the request's
/// `MatchedPath`, `p`: its keys.
#[inline]
pub(super) fn span(route: Option<&str>, plan: &RoutePlan, p: &Pending) -> Option<Span> {
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
    if span.is_disabled() {
        return None;
    }
    let limits: Vec<&str> = plan.limits().iter().map(|l| &*l.name).collect();
    span.record("limit", limits.join(",").as_str());
    if !p.keys.is_empty() {
        span.record("key", display(p.shown_id(0)));
    }
    Some(span)
}

/// `decided`'s outcome onto its span (a decision that waits is followed
/// inside it).
pub(super) fn close(span: Span, decided: Decided) -> Decided {
    match decided {
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

/// The decision's outcome onto the span.
fn outcome(span: &Span, d: &Decision) {
    match d.refused_status() {
        None => span.record("outcome", "admitted"),
        Some(status) => {
            span.record("outcome", "refused");
            span.record("status", status.as_u16())
        }
    };
}

/// Marks the current decision's span degraded (a failure policy answered).
pub(super) fn degraded() {
    Span::current().record("degraded", true);
}
