//! `on_exceed = "delay"` and `"challenge"`: a limit that escalates goes to
//! the store as a soft limit (counted while it has room, never refusing,
//! like a limit in shadow mode), so the request's other limits still decide
//! all or nothing; an admitted request over a soft limit is then challenged
//! (a [`Challenge`] for the handler) or held before the handler, at most
//! `[escalation] max_delayed` at once per instance (beyond: challenged, never
//! refused, so filling the places locks nobody out).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::challenge::Challenge;
use super::{Admitted, Buckets, Decided, DecidedBy, Decision, Pending};
use crate::algorithm::LimitState;
use crate::route::OnExceed;

/// A request to hold before the handler: carried in the decision's
/// extensions from [`Limiter::escalate`] to [`held`], never to the handler.
#[derive(Clone)]
struct Delay {
    hold: Duration,
    /// Its place among the requests held at once on this instance.
    _permit: Arc<OwnedSemaphorePermit>,
}

/// The escalations of an admitted request: each limit that escalates,
/// is not in shadow mode, and had no room. Challenges go into the
/// request's extensions; the longest delay is held by [`held`], or,
/// with no place left among the held requests (`delayed`), challenged.
pub(super) fn escalate(
    delayed: &Arc<Semaphore>,
    p: &Pending,
    buckets: &Buckets,
    limits: &[LimitState],
    by: DecidedBy,
    admitted: &mut Admitted,
) {
    let mut challenged = Vec::new();
    let mut delay: Option<(Duration, usize)> = None;
    for (i, (limit, s)) in p.policy.limits.iter().zip(limits).enumerate() {
        if s.enough || !limit.escalates() || limit.shadow || p.policy.shadow {
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
        let key = p.log_id(i).of(&buckets[i].key);
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
        match Arc::clone(delayed).try_acquire_owned() {
            Ok(permit) => {
                admitted.extensions.insert(Delay {
                    hold,
                    _permit: Arc::new(permit),
                });
            }
            // Every place is taken: challenged instead. Refusing would
            // let whoever fills the places (100 requests on one account)
            // lock everyone else out, the account's owner included.
            Err(_) => challenged.push(Arc::clone(&p.policy.limits[i].name)),
        }
    }
    if !challenged.is_empty() {
        admitted.extensions.insert(Challenge::new(challenged));
    }
}

/// A decision whose request must be held first becomes one that waits
/// `delay` (keeping its place among the held requests until then).
pub(super) fn held(d: Decided) -> Decided {
    match d {
        Decided::Now(Decision::Admit(mut a)) => match a.extensions.remove::<Delay>() {
            Some(delay) => Decided::Later(Box::pin(async move {
                hold(delay).await;
                Decision::Admit(a)
            })),
            None => Decided::Now(Decision::Admit(a)),
        },
        d @ (Decided::Now(_) | Decided::Unlimited) => d,
        Decided::Later(f) => Decided::Later(Box::pin(async move {
            let mut d = f.await;
            if let Decision::Admit(a) = &mut d {
                if let Some(delay) = a.extensions.remove::<Delay>() {
                    hold(delay).await;
                }
            }
            d
        })),
    }
}

async fn hold(delay: Delay) {
    tokio::time::sleep(delay.hold).await;
    // The place is given up once the wait is over.
    drop(delay);
}
