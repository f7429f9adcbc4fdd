//! One `DEBUG` span per decision, `fleetlimit.decide`, so a request's trace
//! shows the limiter's time: the route, its limits, the first key's log id
//! (a digest for API keys, never the raw value), the outcome and whether
//! the decision was degraded. Nothing is built when the span is disabled.

use std::sync::Arc;

use axum::extract::MatchedPath;
use http::Request;
use tracing::field::{display, Empty};
use tracing::{Instrument, Span};

use super::{Decided, Decision, Limiter, Pending};

impl Limiter {
    /// [`decide`](Self::decide) inside the decision's span.
    pub(crate) fn decide_traced<B>(self: &Arc<Self>, p: Pending, req: &Request<B>) -> Decided {
        let route = req.extensions().get::<MatchedPath>();
        let span = tracing::debug_span!(
            target: "fleetlimit",
            "fleetlimit.decide",
            route = route.map_or("-", MatchedPath::as_str),
            limit = Empty,
            key = Empty,
            outcome = Empty,
            status = Empty,
            degraded = false,
        );
        if span.is_disabled() {
            return self.decide(p);
        }
        let limits: Vec<&str> = p.policy.limits.iter().map(|l| &*l.name).collect();
        span.record("limit", limits.join(",").as_str());
        if let (Some(id), Some(k)) = (p.log_ids.first(), p.keys.first()) {
            span.record("key", display(id.of(&k.key)));
        }
        match span.in_scope(|| self.decide(p)) {
            Decided::Now(d) => {
                outcome(&span, &d);
                Decided::Now(d)
            }
            Decided::Later(f) => Decided::Later(Box::pin(async move {
                let d = f.instrument(span.clone()).await;
                outcome(&span, &d);
                d
            })),
        }
    }
}

fn outcome(span: &Span, d: &Decision) {
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
