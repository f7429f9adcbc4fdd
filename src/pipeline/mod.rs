//! The request path, top to bottom. The layer's `call` hands each request
//! to [`Limiter::handle`] once, which looks up the request's route plan
//! ([`plan`], compiled once per configuration: everything about a route
//! that does not depend on the request) and runs four steps, each given
//! the part of the plan it needs, the store handle and the request:
//!
//! 0. `key::shed`, with `[shedding]` only: a request whose priority the
//!    current pressure sheds is answered `503` before anything is charged
//!    (see `shed/`); an admitted one is counted in flight until its
//!    response is over.
//! 1. [`key`]: each limit's key and the request's cost, written into the
//!    request's [`Pending`] (a per-thread buffer, so a request decided at
//!    once allocates nothing); then each limit's numbers under the
//!    caller's plan (`413` when the cost can never fit). A missing key, an
//!    unknown client address or a custom key its extractor rejects is
//!    answered here.
//! 2. [`check`]: who answers the check — a refusal remembered from Redis,
//!    a store that decides at once (the in-process one, through
//!    [`Store::decide_now`](crate::store::Store)), or later: a hot key's
//!    lease, the primary store behind its circuit breaker, and the route's
//!    failure policy when it fails. Its answer is one [`check::Answer`].
//! 3. [`settle`]: the answer → the one [`Decision`] (headers, refusal,
//!    refund handle, slots, escalation, failures-only counting). Nothing
//!    else builds a decision.
//! 4. The answer: `crate::answer` builds every header and problem body,
//!    and the layer's response future (`layer/future.rs`) writes them.
//!
//! Nothing here knows Redis or writes an HTTP response.

mod check;
mod key;
mod limiter;
mod pending;
mod plan;
mod settle;
mod trace;

use std::future::Future;
use std::pin::Pin;

pub(crate) use self::limiter::{Core, Extras, Limiter};
use self::pending::Pending;
pub(crate) use self::settle::{Admitted, After, Decision, Hold, Prompted};
pub use self::settle::{Challenge, ChallengeRequired, Refund};

/// A decision that waits on Redis, a plan resolver or a delay.
pub(crate) type DecisionFuture = Pin<Box<dyn Future<Output = Decision> + Send + 'static>>;

/// Where a request stands once the synchronous half has run: the one
/// "is it decided" type of the request path.
pub(crate) enum Decided {
    /// No limit applies and nothing is held: call the service as it is.
    Unlimited,
    /// Decided at once (in-process store, remembered refusal, missing key)
    /// without allocating.
    Now(Decision),
    /// Waits on Redis, a plan resolver or a delay.
    Later(DecisionFuture),
}

/// Which store decided a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DecidedBy {
    /// The primary store.
    Primary,
    /// The `local` failure policy's in-process buckets, the primary store
    /// having failed (logged as `degraded`).
    Fallback,
}

impl DecidedBy {
    fn degraded(self) -> bool {
        self == Self::Fallback
    }
}
