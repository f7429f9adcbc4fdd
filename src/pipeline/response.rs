//! What clients see: `X-RateLimit-*`, `Retry-After`, and problem bodies.
//!
//! - `X-RateLimit-Limit`: the bucket's capacity (its burst);
//! - `X-RateLimit-Remaining`: whole tokens left, rounded down, so a client
//!   told `5` can spend 5 (unless someone else sharing the key does first);
//! - `X-RateLimit-Reset`: seconds until the bucket is full again, rounded up
//!   (a delay, not a timestamp: clients need no synchronised clock);
//! - `Retry-After`: on every 429 and 503, whole seconds, at least 1.
//!
//! Refusals (`429`), missing keys (`401`), costs no limit can hold (`413`)
//! and an undecidable request (`503`) carry an `application/problem+json`
//! body (RFC 9457) naming the limit.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
use std::fmt::Write as _;

use crate::algorithm::LimitState;
use crate::key::ShownId;
use crate::route::Limit;

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
            reset: whole_secs(reset),
        }
    }

    /// A token bucket holding `remaining` of `capacity` (a hot key's
    /// lease): full again once the rest has refilled.
    pub(crate) fn token_bucket(capacity: f64, refill_per_sec: f64, remaining: f64) -> Self {
        Self::new(capacity, remaining, (capacity - remaining) / refill_per_sec)
    }

    /// The same headers, full again in `secs` (a remembered refusal,
    /// counted down).
    pub(crate) fn reset_in(self, secs: f64) -> Self {
        Self {
            reset: whole_secs(secs),
            ..self
        }
    }

    pub(crate) fn write(&self, h: &mut HeaderMap) {
        h.insert(X_RATELIMIT_LIMIT.clone(), limit_value(self.limit));
        h.insert(X_RATELIMIT_REMAINING.clone(), number(self.remaining));
        h.insert(X_RATELIMIT_RESET.clone(), number(self.reset));
    }
}

/// `X-RateLimit-Reset`: rounded up, so a client waiting that long finds
/// the bucket full.
fn whole_secs(secs: f64) -> u64 {
    secs.ceil().max(0.0) as u64
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
        let title = status.canonical_reason().unwrap_or("");
        Self::typed_problem(status, "about:blank", title, detail, extra)
    }

    /// A problem of its own `type` (a URI) and `title`.
    pub(crate) fn typed_problem(
        status: StatusCode,
        kind: &str,
        title: &str,
        detail: &str,
        extra: &[(&str, String)],
    ) -> Self {
        // One buffer for the whole body: refusals are the abuse path, where
        // the layer answers by itself, so they are built without waste.
        let mut body = String::with_capacity(96 + detail.len());
        body.push_str("{\"type\":");
        push_json_str(&mut body, kind);
        body.push_str(",\"title\":");
        push_json_str(&mut body, title);
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

/// The bucket to report in headers: on refusal the refusing limit that
/// makes the client wait longest, on admission the one with the least room
/// left relative to its capacity. Limits for which `shadow(i)` is true
/// never decide a refusal's `Retry-After`.
pub(crate) fn reported(
    allowed: bool,
    ls: &[LimitState],
    shadow: impl Fn(usize) -> bool,
) -> Option<usize> {
    let room = |i: usize| ls[i].remaining / ls[i].capacity;
    if allowed {
        (0..ls.len()).min_by(|&a, &b| room(a).total_cmp(&room(b)))
    } else {
        (0..ls.len())
            .filter(|&i| !ls[i].enough && !shadow(i))
            .max_by(|&a, &b| ls[a].wait.total_cmp(&ls[b].wait))
    }
}

/// Whole seconds for `Retry-After`: rounded up, and never 0 for a refusal.
#[must_use]
pub(crate) fn retry_after_secs(wait: f64) -> u64 {
    if wait.is_finite() {
        // Saturating cast: a refill so slow it overflows is "a long time".
        (wait.ceil() as u64).max(1)
    } else {
        u64::MAX / 2
    }
}

/// `429` with `Retry-After`, the limit's headers and a problem body.
/// `degraded`: decided by the `local` policy's buckets; `cached`: a
/// refusal remembered from Redis.
pub(crate) fn refusal(
    limit: &Limit,
    key: ShownId<'_>,
    headers: RateHeaders,
    retry: u64,
    degraded: bool,
    cached: bool,
) -> Rejection {
    // The abuse path: every refusal at DEBUG, except one INFO line a second
    // per limit (and per Redis / local decision), whose `suppressed` counts
    // the refusals since the previous one.
    let log = limit.refusal_log[usize::from(degraded)].event();
    macro_rules! refused_event {
        ($level:ident $(, $extra:ident)?) => {
            tracing::$level!(
                target: "fleetlimit",
                limit = %limit.name,
                %key,
                remaining = headers.remaining,
                retry_after = retry,
                reason = "limit-exceeded",
                degraded,
                cached,
                $($extra,)?
                "refused"
            )
        };
    }
    match log {
        Some(suppressed) => refused_event!(info, suppressed),
        None => refused_event!(debug),
    }
    let limit = &*limit.name;
    Rejection::problem(
        StatusCode::TOO_MANY_REQUESTS,
        &format!("rate limit {limit:?} exceeded; retry in {retry} s"),
        &[
            ("limit", json_str(limit)),
            ("retry_after", retry.to_string()),
        ],
    )
    .retry_after(retry)
    .rate_headers(&headers)
}

/// `503` of the `closed` failure policy: the store failed.
pub(crate) fn unavailable(limit: &str, retry: u64) -> Rejection {
    Rejection::problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "the rate limiter cannot decide right now; retry shortly",
        &[("limit", json_str(limit))],
    )
    .retry_after(retry)
}

/// The problem `type` of a shed request.
pub(crate) const OVERLOADED_TYPE: &str = "urn:fleetlimit:overloaded";

/// `503`: shed, the backend being saturated (no limit was exceeded, so not
/// 429); logged by the shedder, one line a second.
pub(crate) fn overloaded(priority: &str, signal: &str, pressure: f64, retry: u64) -> Rejection {
    Rejection::typed_problem(
        StatusCode::SERVICE_UNAVAILABLE,
        OVERLOADED_TYPE,
        "Service Unavailable",
        &format!(
            "the service is overloaded and sheds {priority} requests first; retry in {retry} s"
        ),
        &[
            ("priority", json_str(priority)),
            ("signal", json_str(signal)),
            // Rounded: a pressure, not a measurement to the last digit.
            ("pressure", format!("{:.2}", pressure.min(1e9))),
            ("retry_after", retry.to_string()),
        ],
    )
    .retry_after(retry)
}

/// Which of a limit's `early_log` throttles a line uses.
const MISSING_KEY: usize = 0;
const TOO_COSTLY: usize = 1;
const NO_CLIENT_IP: usize = 2;

/// Writes `$line` at `$level` once a second per limit and kind (with
/// `suppressed`, the lines held back since), at DEBUG otherwise: a client
/// that keeps omitting its key, or a server without `ConnectInfo`, must not
/// flood the logs with one line per request.
macro_rules! throttled {
    ($limit:expr, $kind:expr, $level:ident, $($field:tt)*) => {
        match $limit.early_log[$kind].event() {
            Some(suppressed) => tracing::$level!(target: "fleetlimit", suppressed, $($field)*),
            None => tracing::debug!(target: "fleetlimit", $($field)*),
        }
    };
}

/// `401`: the request lacks the limit's key (`on_missing = "reject"`).
pub(crate) fn missing_key(limit: &Limit) -> Rejection {
    throttled!(
        limit,
        MISSING_KEY,
        info,
        limit = %limit.name,
        reason = "missing-key",
        "refused: the request does not carry {}",
        limit.key.describe()
    );
    Rejection::problem(
        StatusCode::UNAUTHORIZED,
        &format!(
            "this endpoint is rate limited by {}, which the request does not carry",
            limit.key.describe()
        ),
        &[("limit", json_str(&limit.name))],
    )
}

/// `413`: a cost no bucket of this limit can ever hold. Refused at once,
/// without touching the store (so it drains nothing), and not with 429 —
/// waiting would not help.
pub(crate) fn too_costly(l: &Limit, cost: u32, capacity: f64) -> Rejection {
    let limit = &*l.name;
    throttled!(l, TOO_COSTLY, info, %limit, cost, capacity, reason = "cost-exceeds-capacity", "refused");
    Rejection::problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("this request costs {cost}, more than limit {limit:?} can ever allow ({capacity}); it can never be admitted"),
        &[("limit", json_str(limit)), ("cost", cost.to_string())],
    )
}

/// `503`: no client address for a limit keyed by it.
pub(crate) fn no_client_ip(l: &Limit) -> Rejection {
    let limit = &*l.name;
    // A server setup problem (no ConnectInfo), not the client's doing; never
    // a shared "unknown" bucket.
    throttled!(
        l,
        NO_CLIENT_IP,
        error,
        %limit,
        reason = "no-client-ip",
        "cannot find the client address: serve with `into_make_service_with_connect_info::<SocketAddr>()` \
         or insert a `SocketAddr` extension"
    );
    Rejection::problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "the rate limiter cannot identify the client",
        &[("limit", json_str(limit))],
    )
    .retry_after(1)
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

    #[test]
    fn retry_after_is_never_zero() {
        assert_eq!(retry_after_secs(0.0), 1);
        assert_eq!(retry_after_secs(0.06), 1);
        assert_eq!(retry_after_secs(1.0), 1);
        assert_eq!(retry_after_secs(1.01), 2);
    }

    #[test]
    fn reports_the_most_restrictive_bucket() {
        let s = |remaining, wait| LimitState {
            enough: wait == 0.0,
            remaining,
            wait,
            reset: 0.0,
            capacity: 10.0,
        };
        let admitted = [s(5.0, 0.0), s(2.0, 0.0)];
        assert_eq!(reported(true, &admitted, |_| false), Some(1));
        let refused = [s(0.0, 9.0), s(0.5, 3.0)];
        assert_eq!(reported(false, &refused, |_| false), Some(0));
        assert_eq!(
            reported(false, &refused, |i| i == 0),
            Some(1),
            "a shadow limit never sets Retry-After"
        );
    }
}
