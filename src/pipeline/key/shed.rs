//! Step 0, with `[shedding]` only: shed a request by its route's priority,
//! before any key is charged, or count it in flight.

use http::Request;
use tokio::sync::Semaphore;

use crate::answer::{self as response, Rejection};
use crate::shed::{Accepted, Priority, Shedder, Ticket};

/// The request's place in flight, or its `503`. `delayed`: the places of
/// requests held by `on_exceed = "delay"`, `max_delayed` of them.
// The refusal is rare; boxing it would cost every caller.
#[allow(clippy::result_large_err)]
pub(in crate::pipeline) fn shed<B>(
    shedder: &Shedder,
    req: &Request<B>,
    priority: Priority,
    delayed: &Semaphore,
    max_delayed: usize,
) -> Result<Ticket, Rejection> {
    let accepted = req.extensions().get::<Accepted>().map(|a| a.0);
    // Held by `on_exceed = "delay"`: parked on purpose (a login attack
    // can fill every place), not load on the handlers.
    let held = max_delayed.saturating_sub(delayed.available_permits());
    let held = u32::try_from(held).unwrap_or(u32::MAX);
    shedder.admit(priority, accepted, held).map_err(|s| {
        response::overloaded(
            s.priority.as_str(),
            s.signal.as_str(),
            s.pressure,
            s.retry_after,
        )
    })
}
