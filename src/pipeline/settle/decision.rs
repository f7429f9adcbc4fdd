//! What the layer does with a request: the [`Decision`], and what goes
//! with an admitted request to its handler and response.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use smallvec::SmallVec;

use super::refund::Refund;
use crate::answer::{RateHeaders, RefusalHook, Rejection};
use crate::shed::Ticket;

/// What the layer does with the request.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Call the service (see [`Admitted`]).
    Admit(Admitted),
    /// Answer this instead of calling the service.
    Reject(Rejection),
}

impl Decision {
    /// Admitted with nothing counted (a route without limits that sheds).
    pub(in crate::pipeline) fn unlimited() -> Self {
        Self::Admit(Admitted::default())
    }

    /// Answered before any check (shed, a missing key, a cost too high).
    pub(in crate::pipeline) fn early(r: Rejection) -> Self {
        Self::Reject(r)
    }

    /// An admitted request keeps its place in flight (see `shed/`) until
    /// its response is over; a refused one gives it back at once.
    pub(in crate::pipeline) fn with_ticket(mut self, ticket: Option<Ticket>) -> Self {
        self.keep_ticket(ticket);
        self
    }

    /// [`with_ticket`](Self::with_ticket) in place: a decision is too
    /// large to move for nothing.
    #[inline]
    pub(in crate::pipeline) fn keep_ticket(&mut self, ticket: Option<Ticket>) {
        if let (Self::Admit(a), Some(t)) = (self, ticket) {
            a.hold.push(t);
        }
    }

    /// The application's refusal hook reshapes a refusal.
    #[inline]
    pub(in crate::pipeline) fn shaped(self, hook: Option<&RefusalHook>) -> Self {
        match (self, hook) {
            (Self::Reject(r), Some(hook)) => Self::Reject(r.shape(hook)),
            (d, _) => d,
        }
    }

    /// What goes with an admitted request; `None` for a refusal.
    pub(in crate::pipeline) fn admitted_mut(&mut self) -> Option<&mut Admitted> {
        match self {
            Self::Admit(a) => Some(a),
            Self::Reject(_) => None,
        }
    }

    /// The refusal's status; `None` for an admission.
    pub(in crate::pipeline) fn refused_status(&self) -> Option<http::StatusCode> {
        match self {
            Self::Admit(_) => None,
            Self::Reject(r) => Some(r.status),
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
