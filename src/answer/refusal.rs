//! Refusals an API can make its own: [`Refusal`], what the layer is about
//! to answer, handed to the hook of
//! [`RateLimitLayerBuilder::on_refusal`](crate::layer::RateLimitLayerBuilder::on_refusal).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

/// Why a request was refused, with the `type` URI of fleetlimit's default
/// `application/problem+json` answer (RFC 9457).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalReason {
    /// `429`: a limit of the route is exceeded
    /// (`urn:fleetlimit:rate-limited`).
    LimitExceeded,
    /// `503`: the store failed and the route's `on_redis_error` is
    /// `closed` (`urn:fleetlimit:limiter-unavailable`).
    Unavailable,
    /// `401`: the request lacks the limit's key, `on_missing = "reject"`
    /// (`urn:fleetlimit:missing-key`).
    MissingKey,
    /// `413`: the request costs more than the limit can ever hold
    /// (`urn:fleetlimit:cost-too-high`).
    CostTooHigh,
    /// `503`: a limit is keyed by client IP and the server gives none (a
    /// setup problem: see `ConnectInfo`) (`urn:fleetlimit:no-client-ip`).
    NoClientIp,
    /// `503`: shed, the service being overloaded
    /// (`urn:fleetlimit:overloaded`).
    Overloaded,
    /// `401`: the handler answered [`ChallengeRequired`](crate::ChallengeRequired)
    /// (`urn:fleetlimit:challenge-required`).
    ChallengeRequired,
    /// `400`: a limit's [custom key function](crate::layer::RateLimitLayerBuilder::key_fn) answered
    /// [`KeyAnswer::Invalid`](crate::KeyAnswer::Invalid)
    /// (`urn:fleetlimit:invalid-key`).
    InvalidKey,
    /// `503`: a limit's [custom key function](crate::layer::RateLimitLayerBuilder::key_fn)
    /// panicked (`urn:fleetlimit:key-unavailable`). A limit whose
    /// extractor is not registered never gets here: every way of making a
    /// layer refuses it ([`BuildError::Config`](crate::BuildError::Config)).
    KeyUnavailable,
}

impl RefusalReason {
    /// The `type` URI of the default problem body.
    ///
    /// ```
    /// use fleetlimit::RefusalReason;
    ///
    /// assert_eq!(RefusalReason::LimitExceeded.problem_type(), "urn:fleetlimit:rate-limited");
    /// ```
    #[must_use]
    pub const fn problem_type(self) -> &'static str {
        match self {
            Self::LimitExceeded => super::problem::RATE_LIMITED,
            Self::Unavailable => "urn:fleetlimit:limiter-unavailable",
            Self::MissingKey => "urn:fleetlimit:missing-key",
            Self::CostTooHigh => "urn:fleetlimit:cost-too-high",
            Self::NoClientIp => "urn:fleetlimit:no-client-ip",
            Self::Overloaded => "urn:fleetlimit:overloaded",
            Self::ChallengeRequired => "urn:fleetlimit:challenge-required",
            Self::InvalidKey => "urn:fleetlimit:invalid-key",
            Self::KeyUnavailable => "urn:fleetlimit:key-unavailable",
        }
    }
}

/// A refusal the layer is about to send, for the hook of
/// [`on_refusal`](crate::layer::RateLimitLayerBuilder::on_refusal) to reshape:
/// why, which limit, when to retry, what is left, and the answer
/// fleetlimit would give (status, headers — `Retry-After`, rate-limit
/// headers, `WWW-Authenticate` — and problem body).
///
/// ```
/// use fleetlimit::{Refusal, RefusalReason};
///
/// fn shape(r: Refusal) -> http::Response<bytes::Bytes> {
///     if r.reason() != RefusalReason::LimitExceeded {
///         return r.into_default_response();
///     }
///     let retry = r.retry_after().map_or(1, |d| d.as_secs());
///     let mut res = r.into_default_response();
///     *res.body_mut() = format!("{{\"error\":\"slow down\",\"retry_in\":{retry}}}").into();
///     res.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
///     res
/// }
/// # let _ = shape;
/// ```
pub struct Refusal {
    pub(crate) reason: RefusalReason,
    pub(crate) limit: Option<Arc<str>>,
    pub(crate) retry_after: Option<u64>,
    pub(crate) remaining: Option<u64>,
    pub(crate) response: Response<Bytes>,
}

impl Refusal {
    /// Why.
    #[must_use]
    pub fn reason(&self) -> RefusalReason {
        self.reason
    }

    /// The limit that refused (for a challenge, the first exceeded);
    /// `None` when shed.
    #[must_use]
    pub fn limit(&self) -> Option<&str> {
        self.limit.as_deref()
    }

    /// The default answer's `Retry-After`, when it has one.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after.map(Duration::from_secs)
    }

    /// Whole requests of this route left in the refusing limit, as
    /// `X-RateLimit-Remaining` says; `None` when not known from the fleet's count (a missing key,
    /// a `local` decision, ...).
    #[must_use]
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }

    /// The answer fleetlimit would send.
    #[must_use]
    pub fn default_response(&self) -> &Response<Bytes> {
        &self.response
    }

    /// The answer fleetlimit would send, to send or change.
    #[must_use]
    pub fn into_default_response(self) -> Response<Bytes> {
        self.response
    }
}

impl fmt::Debug for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refusal")
            .field("reason", &self.reason)
            .field("limit", &self.limit)
            .field("retry_after", &self.retry_after)
            .field("remaining", &self.remaining)
            .field("status", &self.response.status())
            .finish_non_exhaustive()
    }
}

/// The hook of [`on_refusal`](crate::layer::RateLimitLayerBuilder::on_refusal).
pub(crate) type RefusalHook = Arc<dyn Fn(Refusal) -> Response<Bytes> + Send + Sync>;
