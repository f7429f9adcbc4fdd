//! What clients see: `X-RateLimit-*`, `Retry-After`, and problem bodies.
//!
//! - `X-RateLimit-Limit`: the bucket's capacity (its burst);
//! - `X-RateLimit-Remaining`: whole tokens left, rounded down, so a client
//!   told `5` can spend 5 (unless someone else sharing the key does first);
//! - `X-RateLimit-Reset`: seconds until the bucket is full again, rounded up
//!   (a delay, not a timestamp: clients need no synchronised clock);
//! - `Retry-After`: on every 429 and 503, whole seconds, at least 1.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
use std::fmt::Write as _;

/// `X-RateLimit-Limit`
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The rate-limit headers of one response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RateHeaders {
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset: u64,
}

impl RateHeaders {
    pub(crate) fn new(capacity: f64, remaining: f64, reset: f64) -> Self {
        Self {
            limit: capacity.floor() as u64,
            // Rounded down: a hair under a whole token is not a token, so
            // the header never promises a request that would be refused.
            remaining: remaining.floor().max(0.0) as u64,
            reset: reset.ceil().max(0.0) as u64,
        }
    }

    pub(crate) fn write(&self, h: &mut HeaderMap) {
        h.insert(X_RATELIMIT_LIMIT.clone(), limit_value(self.limit));
        h.insert(X_RATELIMIT_REMAINING.clone(), number(self.remaining));
        h.insert(X_RATELIMIT_RESET.clone(), number(self.reset));
    }
}

/// Header values of small numbers are built once and shared (a clone is a
/// reference count, not an allocation); larger ones are formatted.
fn number(n: u64) -> HeaderValue {
    const CACHED: u64 = 1024;
    static VALUES: std::sync::OnceLock<Vec<HeaderValue>> = std::sync::OnceLock::new();
    if n < CACHED {
        let values = VALUES.get_or_init(|| (0..CACHED).map(HeaderValue::from).collect());
        values[n as usize].clone()
    } else {
        HeaderValue::from(n)
    }
}

/// `X-RateLimit-Limit`: a limit's capacity, one of the few the
/// configuration holds, so large ones are remembered too (per thread, a
/// handful) instead of formatted for every response.
fn limit_value(n: u64) -> HeaderValue {
    const SLOTS: usize = 8;
    thread_local! {
        static RECENT: std::cell::RefCell<[Option<(u64, HeaderValue)>; SLOTS]> =
            const { std::cell::RefCell::new([const { None }; SLOTS]) };
    }
    if n < 1024 {
        return number(n);
    }
    RECENT.with(|recent| {
        let slot = &mut recent.borrow_mut()[(n % SLOTS as u64) as usize];
        match slot {
            Some((m, v)) if *m == n => v.clone(),
            _ => slot.insert((n, HeaderValue::from(n))).1.clone(),
        }
    })
}

/// A complete answer the layer gives without calling the service.
#[derive(Debug)]
pub(crate) struct Rejection {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Rejection {
    /// An `application/problem+json` answer (RFC 9457).
    pub(crate) fn problem(status: StatusCode, detail: &str, extra: &[(&str, String)]) -> Self {
        // One buffer for the whole body: refusals are the abuse path, where
        // the layer answers by itself, so they are built without waste.
        let mut body = String::with_capacity(96 + detail.len());
        body.push_str("{\"type\":\"about:blank\",\"title\":");
        push_json_str(&mut body, status.canonical_reason().unwrap_or(""));
        body.push_str(",\"status\":");
        body.push_str(status.as_str());
        body.push_str(",\"detail\":");
        push_json_str(&mut body, detail);
        for (k, v) in extra {
            body.push(',');
            push_json_str(&mut body, k);
            body.push(':');
            body.push_str(v);
        }
        body.push('}');
        let mut headers = HeaderMap::with_capacity(6);
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        Self {
            status,
            headers,
            body: Bytes::from(body),
        }
    }

    pub(crate) fn retry_after(mut self, secs: u64) -> Self {
        self.headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        self
    }

    pub(crate) fn rate_headers(mut self, h: &RateHeaders) -> Self {
        h.write(&mut self.headers);
        self
    }
}

/// A JSON string literal.
pub(crate) fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_json_str(&mut out, s);
    out
}

/// Appends `s` as a JSON string literal.
fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_round_honestly() {
        let h = RateHeaders::new(5.0, 3.9999999999, 1.2);
        assert_eq!((h.limit, h.remaining, h.reset), (5, 3, 2));
        let h = RateHeaders::new(5.0, 3.5, 0.0);
        assert_eq!(h.remaining, 3);
    }

    #[test]
    fn problem_bodies_are_json() {
        let r = Rejection::problem(
            StatusCode::TOO_MANY_REQUESTS,
            "say \"hi\"\n",
            &[("limit", json_str("a"))],
        );
        let body = std::str::from_utf8(&r.body).unwrap();
        assert_eq!(
            body,
            r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"say \"hi\"\u000a","limit":"a"}"#
        );
    }
}
