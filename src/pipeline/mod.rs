//! The request path, top to bottom. The layer's `call` hands each request
//! to [`Limiter::handle`] once, which runs these steps in order; each is a
//! function from one type to the next, and any of them may decide early
//! (a `ControlFlow::Break` of a [`Decision`]), so where a request stands
//! is always one type: [`Decided`].
//!
//! 0. [`prepare`]'s `route` and, with `[shedding]` only, `shed`: the
//!    route's policy; a request whose priority the current pressure sheds
//!    is answered `503` before anything is charged (see `shed/`); an
//!    admitted one is counted in flight until its response is over.
//! 1. [`prepare`] → [`Pending`]: each limit's key and the request's cost. A
//!    missing key, an unknown client address or a custom key its extractor
//!    rejects (or fails to compute) is answered here. A route the policy
//!    marks lone (one limit that needs nothing beside its bucket, worked
//!    out when the policy is built) on the in-process store is decided
//!    here too, in place ([`lone`]), on every log level.
//! 2. [`decide`] → [`Decided`]: the callers' plans, then each limit's rule
//!    for the cost (`413` when it can never fit), then a refusal remembered
//!    from Redis, then the store — the in-process one at once, Redis
//!    through hot-key leases ([`lease`]) and behind the circuit breaker —
//!    and the decision from its answer, with what goes along (slots,
//!    [`escalate`], [`failures`], [`refund`]).
//! 3. [`fallback`]: when Redis fails, the route's `on_redis_error`
//!    (`open`, `closed` or `local`) decides instead.
//! 4. `crate::answer`: every header and problem body a client sees; the
//!    application's refusal hook reshapes a refusal once, in `handle`.
//!
//! `Limiter`'s behaviour lives in two files, [`limiter`] (its state and the
//! spine) and [`decide`]; the other steps are functions and small types it
//! calls. Nothing here knows Redis or writes an HTTP response: the layer
//! turns a [`Decision`] into one.

mod account;
mod challenge;
mod decide;
mod escalate;
mod failures;
mod fallback;
mod headers;
mod held;
mod lease;
mod limiter;
mod lone;
mod prepare;
mod refund;
mod refused;
mod slot;
mod trace;
mod writeback;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use smallvec::SmallVec;

pub(crate) use self::challenge::Prompted;
pub use self::challenge::{Challenge, ChallengeRequired};
pub(crate) use self::limiter::{Core, Extras, Limiter};
pub(crate) use self::prepare::{CostFn, Pending};
pub use self::refund::Refund;
use crate::answer::{RateHeaders, RefusalHook, Rejection};
use crate::shed::Ticket;
use crate::store::Bucket;

/// What the layer does with the request.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Call the service (see [`Admitted`]).
    Admit(Admitted),
    /// Answer this instead of calling the service.
    Reject(Rejection),
}

impl Decision {
    /// Admitted with these headers (none: nothing was counted) and nothing
    /// else to carry.
    pub(crate) fn admit(headers: Option<RateHeaders>) -> Self {
        Self::Admit(Admitted {
            headers,
            ..Admitted::default()
        })
    }

    /// An admitted request keeps its place in flight (see `shed/`) until
    /// its response is over; a refused one gives it back at once.
    pub(crate) fn with_ticket(mut self, ticket: Option<Ticket>) -> Self {
        self.keep_ticket(ticket);
        self
    }

    /// [`with_ticket`](Self::with_ticket) in place: a decision is too
    /// large to move for nothing.
    #[inline]
    pub(crate) fn keep_ticket(&mut self, ticket: Option<Ticket>) {
        if let (Self::Admit(a), Some(t)) = (self, ticket) {
            a.hold.push(t);
        }
    }
}

/// An admitted request: what goes with it to the handler, onto its
/// response, and beyond.
#[derive(Default)]
pub(crate) struct Admitted {
    /// Added to the service's response.
    pub(crate) headers: Option<RateHeaders>,
    /// Given to the handler (routes with `refund = true`).
    pub(crate) refund: Option<Refund>,
    /// Given to the handler besides the refund handle.
    pub(crate) extensions: http::Extensions,
    /// Kept until the response body has been sent or dropped.
    pub(crate) hold: Hold,
    /// Run with the handler's status, before the response goes out.
    pub(crate) after: Option<After>,
    /// Reshapes a [`ChallengeRequired`] the handler answers.
    pub(crate) on_refusal: Option<RefusalHook>,
}

impl fmt::Debug for Admitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admitted")
            .field("headers", &self.headers)
            .field("refund", &self.refund)
            .field("hold", &self.hold)
            .field("after", &self.after.is_some())
            .finish_non_exhaustive()
    }
}

/// What an admitted request holds until its response is over: guards whose
/// `Drop` gives back what the request took (a concurrency slot, a place in
/// this instance's count of requests in flight). Dropped when the response
/// body ends or is dropped, whichever comes first — so also when the client
/// goes away, the handler panics or the service fails.
#[derive(Default)]
pub(crate) struct Hold(SmallVec<[Box<dyn std::any::Any + Send + Sync>; 1]>);

impl Hold {
    /// Keep `guard` until the response is over.
    pub(crate) fn push(&mut self, guard: impl std::any::Any + Send + Sync) {
        self.0.push(Box::new(guard));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hold({})", self.0.len())
    }
}

/// Work that depends on the handler's answer (a limit that counts only
/// failures gives its unit back for a success): given the status and the
/// response's extensions, the work to finish before the response goes
/// out, if any.
pub(crate) type After = Box<
    dyn FnOnce(
            http::StatusCode,
            &http::Extensions,
        ) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>>
        + Send,
>;

/// A decision that waits on Redis or a plan resolver.
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

/// A request's buckets: one limit per route is the common case, held
/// inline.
type Buckets = SmallVec<[Bucket; 1]>;

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
