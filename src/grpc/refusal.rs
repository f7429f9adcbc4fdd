//! A refusal's HTTP answer → its gRPC status.

use std::collections::HashMap;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use serde_json::Value;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::GrpcRefusalBody;
use crate::pipeline::response::OVERLOADED_TYPE;
use crate::pipeline::CHALLENGE_REQUIRED;

/// The largest problem body read (fleetlimit's are a few hundred bytes).
pub(super) const MAX_PROBLEM: u64 = 8 * 1024;

/// `google.rpc.ErrorInfo.domain` of every refusal.
pub const ERROR_DOMAIN: &str = "fleetlimit";

/// gRPC's retry pushback (gRFC A6): milliseconds to wait before a retry; a
/// negative value tells a client with a retry policy not to retry.
pub static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// Which of the limiter's answers a response is, by its status and its
/// `application/problem+json` body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// 429: a limit was exceeded.
    Exceeded,
    /// 503: the limiter could not decide (`closed`), or shed the request.
    Unavailable,
    /// 401: the request lacks its key, or must answer a challenge.
    Unauthenticated,
    /// 413: a cost no bucket of the limit can hold.
    TooCostly,
}

/// The refusal a response is, if it is one of the limiter's: a problem
/// body (RFC 9457) with one of the statuses it answers with.
pub(super) fn classify(status: StatusCode, headers: &HeaderMap) -> Option<Refusal> {
    let problem = headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        const PROBLEM: &[u8] = b"application/problem+json";
        v.len() >= PROBLEM.len()
            && v[..PROBLEM.len()].eq_ignore_ascii_case(PROBLEM)
            && matches!(v.get(PROBLEM.len()), None | Some(b';' | b' '))
    });
    if !problem {
        return None;
    }
    match status {
        StatusCode::TOO_MANY_REQUESTS => Some(Refusal::Exceeded),
        StatusCode::SERVICE_UNAVAILABLE => Some(Refusal::Unavailable),
        StatusCode::UNAUTHORIZED => Some(Refusal::Unauthenticated),
        StatusCode::PAYLOAD_TOO_LARGE => Some(Refusal::TooCostly),
        _ => None,
    }
}

/// The trailers-only gRPC answer for a refusal: HTTP 200 with
/// `grpc-status`, `grpc-message`, `grpc-status-details-bin`, the retry
/// pushback, and the refusal's own headers (`retry-after`,
/// `x-ratelimit-*`) as metadata. `problem`: the body, when it was read
/// whole.
pub(super) fn answer<B>(
    parts: http::response::Parts,
    refusal: Refusal,
    problem: Option<&[u8]>,
) -> Response<GrpcRefusalBody<B>> {
    let problem = problem.and_then(|b| serde_json::from_slice::<Value>(b).ok());
    let field = |name: &str| {
        problem
            .as_ref()
            .and_then(|p| p.get(name))
            .and_then(Value::as_str)
    };
    let kind = field("type").unwrap_or("about:blank");
    let (code, reason) = match refusal {
        Refusal::Exceeded => (Code::ResourceExhausted, "RATE_LIMIT_EXCEEDED"),
        Refusal::Unavailable if kind == OVERLOADED_TYPE => (Code::Unavailable, "OVERLOADED"),
        Refusal::Unavailable => (Code::Unavailable, "LIMITER_UNAVAILABLE"),
        Refusal::Unauthenticated if kind == CHALLENGE_REQUIRED => {
            (Code::Unauthenticated, "CHALLENGE_REQUIRED")
        }
        Refusal::Unauthenticated => (Code::Unauthenticated, "KEY_MISSING"),
        Refusal::TooCostly => (Code::ResourceExhausted, "COST_EXCEEDS_CAPACITY"),
    };
    let message = field("detail")
        .or_else(|| field("title"))
        .or_else(|| parts.status.canonical_reason())
        .unwrap_or("refused by the rate limiter")
        .to_owned();
    // Whole seconds, as fleetlimit writes it (an HTTP date is not its).
    let retry = parts
        .headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());

    let mut info = HashMap::with_capacity(3);
    info.insert("http_status".to_owned(), parts.status.as_str().to_owned());
    if let Some(limit) = field("limit") {
        info.insert("limit".to_owned(), limit.to_owned());
    }
    if kind != "about:blank" {
        info.insert("problem_type".to_owned(), kind.to_owned());
    }
    let mut details = ErrorDetails::new();
    details.set_error_info(reason, ERROR_DOMAIN, info);
    // A cost over the limit's capacity is refused whatever the wait: no
    // RetryInfo, a negative pushback (do not retry), and the quota named.
    let pushback = match (refusal, retry) {
        (Refusal::TooCostly, _) => {
            details.add_quota_failure_violation(field("limit").unwrap_or(""), &message);
            Some(HeaderValue::from_static("-1"))
        }
        (Refusal::Unauthenticated, _) | (_, None) => None,
        (_, Some(secs)) => {
            details.set_retry_info(Some(Duration::from_secs(secs)));
            Some(HeaderValue::from(secs.saturating_mul(1000)))
        }
    };

    let mut headers = parts.headers;
    headers.remove(CONTENT_TYPE);
    headers.remove(CONTENT_LENGTH);
    let metadata = MetadataMap::from_headers(headers);
    let status = Status::with_error_details_and_metadata(code, message, details, metadata);
    let mut res = status.into_http::<()>();
    if let Some(v) = pushback {
        res.headers_mut().insert(GRPC_RETRY_PUSHBACK_MS.clone(), v);
    }
    let (mut new, ()) = res.into_parts();
    // The inner response's extensions stay (with tonic's `Status`).
    let mut extensions = parts.extensions;
    extensions.extend(new.extensions);
    new.extensions = extensions;
    Response::from_parts(new, GrpcRefusalBody::empty())
}
