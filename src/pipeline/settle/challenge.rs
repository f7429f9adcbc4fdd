//! What a handler gets from a limit with `on_exceed = "challenge"`: the
//! [`Challenge`] extension, and [`ChallengeRequired`], a ready answer.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use http::StatusCode;

use crate::answer::RefusalReason;
use crate::answer::{Rejection, json_str};

/// The problem `type` of a [`ChallengeRequired`] answer.
pub(crate) const CHALLENGE_REQUIRED: &str = RefusalReason::ChallengeRequired.problem_type();

/// In the extensions of a request that exceeded a limit with
/// `on_exceed = "challenge"` (and was refused by no other limit): the
/// handler should ask for proof of a human or of the account's owner (a
/// CAPTCHA, an e-mailed code) before it does what was asked. Take it as
/// `Option<Extension<Challenge>>`: requests within every limit carry none.
///
/// ```
/// use axum::{http::HeaderMap, response::{IntoResponse, Response}, Extension};
/// use fleetlimit::Challenge;
///
/// async fn login(challenge: Option<Extension<Challenge>>, headers: HeaderMap) -> Response {
///     if let Some(Extension(challenge)) = challenge {
///         let solved = headers.get("x-captcha").is_some_and(|v| v == "solved");
///         if !solved {
///             // 401 application/problem+json, type urn:fleetlimit:challenge-required
///             return challenge.required().into_response();
///         }
///     }
///     "signed in".into_response()
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    limits: Vec<Arc<str>>,
}

impl Challenge {
    pub(super) fn new(limits: Vec<Arc<str>>) -> Self {
        Self { limits }
    }

    /// The limits exceeded, by name, in the route's order.
    pub fn limits(&self) -> impl Iterator<Item = &str> + '_ {
        self.limits.iter().map(|l| &**l)
    }

    /// The ready answer naming these limits: `401` with a
    /// `challenge-required` problem body.
    #[must_use]
    pub fn required(&self) -> ChallengeRequired {
        ChallengeRequired {
            limits: self.limits.clone(),
        }
    }
}

/// A ready answer for a handler that asks the client to complete a
/// challenge first: `401 Unauthorized`, `application/problem+json` with
/// `"type": "urn:fleetlimit:challenge-required"` and the limits exceeded.
/// Limits with `count = "failures"` do not count it as a failure: the
/// client was asked a question, it tried nothing.
///
/// ```
/// use axum::response::IntoResponse;
/// use fleetlimit::ChallengeRequired;
///
/// let res = ChallengeRequired::default().into_response();
/// assert_eq!(res.status(), 401);
/// assert_eq!(res.headers()["content-type"], "application/problem+json");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChallengeRequired {
    limits: Vec<Arc<str>>,
}

impl ChallengeRequired {
    /// The answer's status, headers and body.
    pub(crate) fn rejection(&self) -> Rejection {
        let names: Vec<String> = self.limits.iter().map(|l| json_str(l)).collect();
        let mut r = Rejection::typed_problem(
            StatusCode::UNAUTHORIZED,
            CHALLENGE_REQUIRED,
            "Challenge Required",
            "too many failed attempts; complete the challenge and retry",
            &[("limits", format!("[{}]", names.join(",")))],
        );
        r.reason = RefusalReason::ChallengeRequired;
        r.limit = self.limits.first().cloned();
        r
    }
}

impl IntoResponse for ChallengeRequired {
    fn into_response(self) -> Response {
        let r = self.rejection();
        let mut res = Response::new(axum::body::Body::from(r.body));
        *res.status_mut() = r.status;
        *res.headers_mut() = r.headers;
        // Its 401 is a question, not a failed attempt (see `failures.rs`).
        res.extensions_mut().insert(Prompted(self));
        res
    }
}

/// On a [`ChallengeRequired`] answer: limits that count failures do not
/// count it, and the refusal hook may reshape it.
#[derive(Clone, Debug)]
pub(crate) struct Prompted(pub(crate) ChallengeRequired);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_names_the_limits() {
        let c = Challenge::new(vec!["per-account".into(), "global".into()]);
        let r = c.required().rejection();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            std::str::from_utf8(&r.body).unwrap(),
            r#"{"type":"urn:fleetlimit:challenge-required","title":"Challenge Required","status":401,"detail":"too many failed attempts; complete the challenge and retry","limits":["per-account","global"]}"#
        );
    }
}
