//! A refusal's HTTP answer → its gRPC status.

use std::collections::HashMap;
use std::time::Duration;

use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use serde_json::Value;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::RefusalReason;

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
pub(super) fn answer<B: Default>(
    parts: http::response::Parts,
    refusal: Refusal,
    problem: Option<&[u8]>,
) -> Response<B> {
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
        Refusal::Unavailable if kind == RefusalReason::Overloaded.problem_type() => {
            (Code::Unavailable, "OVERLOADED")
        }
        Refusal::Unavailable => (Code::Unavailable, "LIMITER_UNAVAILABLE"),
        Refusal::Unauthenticated if kind == RefusalReason::ChallengeRequired.problem_type() => {
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
    Response::from_parts(new, B::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem_parts(status: u16, retry_after: Option<&str>) -> http::response::Parts {
        let mut b = Response::builder()
            .status(status)
            .header(CONTENT_TYPE, "application/problem+json")
            .header(CONTENT_LENGTH, "123");
        if let Some(r) = retry_after {
            b = b.header(RETRY_AFTER, r);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn decoded(res: &Response<String>) -> Status {
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/grpc");
        assert!(res.headers().get(CONTENT_LENGTH).is_none());
        Status::from_header_map(res.headers()).expect("a grpc-status")
    }

    #[test]
    fn only_problems_with_the_limiters_statuses_are_refusals() {
        let mut h = HeaderMap::new();
        assert_eq!(classify(StatusCode::TOO_MANY_REQUESTS, &h), None);
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert_eq!(classify(StatusCode::TOO_MANY_REQUESTS, &h), None);
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json; charset=utf-8"),
        );
        assert_eq!(
            classify(StatusCode::TOO_MANY_REQUESTS, &h),
            Some(Refusal::Exceeded)
        );
        assert_eq!(
            classify(StatusCode::PAYLOAD_TOO_LARGE, &h),
            Some(Refusal::TooCostly)
        );
        for other in [200, 400, 403, 404, 500, 502] {
            assert_eq!(classify(StatusCode::from_u16(other).unwrap(), &h), None);
        }
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+jsonx"),
        );
        assert_eq!(classify(StatusCode::TOO_MANY_REQUESTS, &h), None);
    }

    #[test]
    fn messages_are_percent_encoded_and_decode_back() {
        let detail = "limit \"caf\u{e9}\" at 100% \u{2014} retry\nlater";
        let body = serde_json::json!({"type": "about:blank", "title": "Too Many Requests",
            "status": 429, "detail": detail, "limit": "caf\u{e9}"});
        let body = serde_json::to_vec(&body).unwrap();
        let res = answer::<String>(
            problem_parts(429, Some("7")),
            Refusal::Exceeded,
            Some(&body),
        );
        let raw = res.headers()["grpc-message"].to_str().unwrap();
        assert!(
            raw.is_ascii() && raw.contains("%25") && raw.contains("%C3%A9"),
            "{raw}"
        );
        let status = decoded(&res);
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), detail);
        assert_eq!(res.headers()[&GRPC_RETRY_PUSHBACK_MS], "7000");
        let details = status.get_error_details();
        assert_eq!(
            details.retry_info().unwrap().retry_delay,
            Some(Duration::from_secs(7))
        );
        assert_eq!(details.error_info().unwrap().metadata["limit"], "caf\u{e9}");
    }

    #[test]
    fn an_unreadable_body_still_maps_by_status() {
        for body in [None, Some(&b"not json"[..]), Some(&b"[1,2]"[..])] {
            let res = answer::<String>(problem_parts(503, Some("2")), Refusal::Unavailable, body);
            let status = decoded(&res);
            assert_eq!(status.code(), Code::Unavailable);
            assert_eq!(status.message(), "Service Unavailable");
            let details = status.get_error_details();
            assert_eq!(details.error_info().unwrap().reason, "LIMITER_UNAVAILABLE");
            assert_eq!(res.headers()[&GRPC_RETRY_PUSHBACK_MS], "2000");
        }
        // A Retry-After that is not whole seconds: no retry information,
        // never a made-up one.
        let res = answer::<String>(
            problem_parts(429, Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            Refusal::Exceeded,
            None,
        );
        let status = decoded(&res);
        assert!(status.get_error_details().retry_info().is_none());
        assert!(res.headers().get(&GRPC_RETRY_PUSHBACK_MS).is_none());
        assert_eq!(
            status.metadata().get("retry-after").unwrap(),
            "Wed, 21 Oct 2015 07:28:00 GMT"
        );
    }
}
