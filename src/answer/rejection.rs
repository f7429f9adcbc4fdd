//! [`Rejection`]: an answer the layer gives without calling the service,
//! and the application's refusal hook reshaping it (under `catch_unwind`:
//! a hook that panics sends the default).

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
use std::sync::Arc;

use super::problem::{PROBLEM_JSON, problem_body};
use super::rate::number;
use super::refusal::{Refusal, RefusalHook, RefusalReason};

/// A complete answer the layer gives without calling the service.
#[derive(Debug)]
pub(crate) struct Rejection {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// Kept from a hook's answer.
    pub(crate) extensions: http::Extensions,
    /// What the refusal hook is told.
    pub(crate) reason: RefusalReason,
    pub(crate) limit: Option<Arc<str>>,
    pub(crate) retry: Option<u64>,
    pub(crate) remaining: Option<u64>,
}

impl Rejection {
    /// An `application/problem+json` answer (RFC 9457) of `reason`'s type,
    /// titled by the status, naming `limit`.
    pub(crate) fn problem(
        reason: RefusalReason,
        status: StatusCode,
        limit: &Arc<str>,
        detail: &str,
        extra: &[(&str, String)],
    ) -> Self {
        let title = status.canonical_reason().unwrap_or("");
        let mut r = Self::typed_problem(status, reason.problem_type(), title, detail, extra);
        r.reason = reason;
        r.limit = Some(Arc::clone(limit));
        r
    }

    /// A problem of its own `type` (a URI) and `title`.
    pub(crate) fn typed_problem(
        status: StatusCode,
        kind: &str,
        title: &str,
        detail: &str,
        extra: &[(&str, String)],
    ) -> Self {
        Self::with_body(status, problem_body(status, kind, title, detail, extra))
    }

    /// An `application/problem+json` answer with this body.
    #[inline]
    pub(super) fn with_body(status: StatusCode, body: Bytes) -> Self {
        // Room for a refusal's headers, `[headers] style = "both"` included.
        let mut headers = HeaderMap::with_capacity(8);
        headers.insert(CONTENT_TYPE, PROBLEM_JSON.clone());
        Self::with_parts(status, headers, body)
    }

    /// An answer with these headers and body.
    #[inline]
    pub(super) fn with_parts(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self {
            status,
            headers,
            body,
            extensions: http::Extensions::new(),
            reason: RefusalReason::LimitExceeded,
            limit: None,
            retry: None,
            remaining: None,
        }
    }

    pub(crate) fn retry_after(mut self, secs: u64) -> Self {
        self.headers.insert(RETRY_AFTER, number(secs));
        self.retry = Some(secs);
        self
    }

    /// The answer as an HTTP response.
    pub(crate) fn into_response(self) -> http::Response<Bytes> {
        let mut res = http::Response::new(self.body);
        *res.status_mut() = self.status;
        // `Response::new`'s map is empty and owns no allocation ("will not
        // allocate", `HeaderMap::new`): forgotten, not run through drop
        // glue on every refusal.
        std::mem::forget(std::mem::replace(res.headers_mut(), self.headers));
        *res.extensions_mut() = self.extensions;
        res
    }

    /// The application's hook reshapes this answer. A hook that panics
    /// gets the default answer sent instead (and an ERROR line, one a
    /// second): never a dropped connection or a bare 500.
    pub(crate) fn shape(mut self, hook: &RefusalHook) -> Self {
        // A kept refusal's length (see `answer/kept.rs`) would be stale for
        // a body the hook writes: the hook gets the map without it, and the
        // server writes the length of what it sends.
        self.headers.remove(CONTENT_LENGTH);
        let (reason, limit, retry, remaining) =
            (self.reason, self.limit.clone(), self.retry, self.remaining);
        let default = (self.status, self.headers.clone(), self.body.clone());
        let refusal = Refusal {
            reason,
            limit: limit.clone(),
            retry_after: retry,
            remaining,
            response: self.into_response(),
        };
        let res = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(refusal))) {
            Ok(res) => res,
            Err(_) => {
                static PANICS: crate::log_throttle::Throttle = crate::log_throttle::Throttle::new();
                if let Some(suppressed) = PANICS.event() {
                    tracing::error!(target: "fleetlimit", ?reason, suppressed, "the on_refusal hook panicked; sent the default refusal");
                }
                let (status, headers, body) = default;
                let mut res = http::Response::new(body);
                *res.status_mut() = status;
                *res.headers_mut() = headers;
                res
            }
        };
        let (parts, body) = res.into_parts();
        Self {
            status: parts.status,
            headers: parts.headers,
            body,
            extensions: parts.extensions,
            reason,
            limit,
            retry,
            remaining,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_hook_sends_the_default() {
        let r = Rejection::problem(
            RefusalReason::CostTooHigh,
            StatusCode::PAYLOAD_TOO_LARGE,
            &Arc::from("a"),
            "too much",
            &[],
        );
        let body = r.body.clone();
        let hook: RefusalHook = Arc::new(|_| panic!("the hook's own bug"));
        let shaped = r.shape(&hook);
        assert_eq!(shaped.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(shaped.body, body);
        assert_eq!(shaped.headers[CONTENT_TYPE], "application/problem+json");
    }
}
