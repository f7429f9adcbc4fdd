//! `on_exceed = "delay"` and `"challenge"`: a limit that escalates goes to
//! the store as a soft limit (counted while it has room, never refusing,
//! like a limit in shadow mode), so the request's other limits still decide
//! all or nothing; an admitted request over a soft limit is then challenged
//! (a [`Challenge`] for the handler) or held before the handler, at most
//! `[escalation] max_delayed` at once per instance (beyond: challenged, never
//! refused, so filling the places locks nobody out).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::super::plan::RoutePlan;
use super::super::{Decided, DecidedBy, Pending};
use super::challenge::Challenge;
use super::decision::{Admitted, Decision};
use crate::algorithm::LimitState;
use crate::route::OnExceed;

/// A request to hold before the handler: carried in the decision's
/// extensions from [`escalate`] to [`held`], never to the handler.
#[derive(Clone)]
struct Delay {
    hold: Duration,
    /// Its place among the requests held at once on this instance.
    _permit: Arc<OwnedSemaphorePermit>,
}

/// The escalations of an admitted request: each limit that escalates,
/// is not in shadow mode, and had no room. Challenges go into the
/// request's extensions; the longest delay is held by [`held`], or,
/// with no place left among the held requests (the plan's `delayed`),
/// challenged.
pub(super) fn escalate(
    plan: &RoutePlan,
    p: &Pending,
    limits: &[LimitState],
    by: DecidedBy,
    admitted: &mut Admitted,
) {
    let mut challenged = Vec::new();
    let mut delay: Option<(Duration, usize)> = None;
    for (i, (limit, s)) in plan.limits().iter().zip(limits).enumerate() {
        if s.enough || !limit.escalates() || plan.in_shadow_mode(i) {
            continue;
        }
        let what = match limit.on_exceed {
            OnExceed::Challenge => {
                challenged.push(Arc::clone(&limit.name));
                "challenged"
            }
            OnExceed::Delay(d) => {
                if delay.is_none_or(|(longest, _)| d > longest) {
                    delay = Some((d, i));
                }
                "delayed"
            }
            OnExceed::Refuse => continue,
        };
        let key = p.shown_id(i);
        let degraded = by.degraded();
        match limit.escalation_log[0].event() {
            Some(suppressed) => tracing::info!(
                target: "fleetlimit", limit = %limit.name, %key, reason = "limit-exceeded",
                degraded, suppressed, "{what}"
            ),
            None => tracing::debug!(
                target: "fleetlimit", limit = %limit.name, %key, reason = "limit-exceeded",
                degraded, "{what}"
            ),
        }
    }
    if let Some((hold, i)) = delay {
        let place = plan
            .delayed
            .as_ref()
            .map(|d| Arc::clone(d).try_acquire_owned());
        match place.unwrap_or(Err(tokio::sync::TryAcquireError::NoPermits)) {
            Ok(permit) => {
                admitted.extensions.insert(Delay {
                    hold,
                    _permit: Arc::new(permit),
                });
            }
            // Every place is taken: challenged instead. Refusing would
            // let whoever fills the places (100 requests on one account)
            // lock everyone else out, the account's owner included.
            Err(_) => challenged.push(Arc::clone(&plan.limits()[i].name)),
        }
    }
    if !challenged.is_empty() {
        admitted.extensions.insert(Challenge::new(challenged));
    }
}

/// A decision whose request must be held first becomes one that waits
/// `delay` (keeping its place among the held requests until then).
pub(in crate::pipeline) fn held(d: Decided) -> Decided {
    match d {
        Decided::Now(mut d) => match take_delay(&mut d) {
            Some(delay) => Decided::Later(Box::pin(async move {
                hold(delay).await;
                d
            })),
            None => Decided::Now(d),
        },
        Decided::Unlimited => Decided::Unlimited,
        Decided::Later(f) => Decided::Later(Box::pin(async move {
            let mut d = f.await;
            if let Some(delay) = take_delay(&mut d) {
                hold(delay).await;
            }
            d
        })),
    }
}

/// The hold an admitted request waits out, taken from its extensions.
fn take_delay(d: &mut Decision) -> Option<Delay> {
    d.admitted_mut()?.extensions.remove::<Delay>()
}

async fn hold(delay: Delay) {
    tokio::time::sleep(delay.hold).await;
    // The place is given up once the wait is over.
    drop(delay);
}
