//! Every refusal the layer answers: `429` (a limit), `503` (the limiter
//! unavailable, the host overloaded, no client address), `401` (no key),
//! `413` (a cost no limit can hold), `Retry-After` rounded up, and the
//! throttled log line of each.

use http::StatusCode;
use http::header::{HeaderValue, WWW_AUTHENTICATE};
use std::sync::Arc;

use super::problem::{RefusalBodies, json_str};
use super::rate::RateHeaders;
use super::rate::whole_secs;
use super::refusal::RefusalReason;
use super::rejection::Rejection;
use crate::key::ShownId;
use crate::log_throttle::Throttle;

/// What the answers read of a limit (`route::Limit` is the one): a name,
/// its key's description, its cached bodies and its log throttles. The
/// answers know no route, so routes can hold what the answers cache.
pub(crate) trait Face {
    /// The limit's name, as clients read it.
    fn name(&self) -> &Arc<str>;
    /// What the key is, for a client that did not send it.
    fn key_described(&self) -> String;
    /// Its `429` bodies, each written once.
    fn bodies(&self) -> &RefusalBodies;
    /// The throttle of its refusal lines, per decision by Redis or `local`.
    fn refusal_log(&self, degraded: bool) -> &Throttle;
    /// The throttle of one kind of early answer's lines.
    fn early_log(&self, kind: usize) -> &Throttle;
}

/// Whole seconds for `Retry-After`: rounded up, and never 0 for a refusal.
#[must_use]
pub(crate) fn retry_after_secs(wait: f64) -> u64 {
    if wait.is_finite() {
        // Saturating cast: a refill so slow it overflows is "a long time".
        whole_secs(wait).max(1)
    } else {
        u64::MAX / 2
    }
}

/// `429` with `Retry-After`, the limit's headers and a problem body.
/// `degraded`: decided by the `local` policy's buckets; `cached`: a
/// refusal remembered from Redis.
pub(crate) fn refusal(
    limit: &impl Face,
    key: ShownId<'_>,
    headers: RateHeaders,
    retry: u64,
    degraded: bool,
    cached: bool,
) -> Rejection {
    // The abuse path: every refusal at DEBUG, except one INFO line a second
    // per limit (and per Redis / local decision), whose `suppressed` counts
    // the refusals since the previous one.
    let log = limit.refusal_log(degraded).event();
    macro_rules! refused_event {
        ($level:ident $(, $extra:ident)?) => {
            tracing::$level!(
                target: "fleetlimit",
                limit = %limit.name(),
                %key,
                remaining = headers.left(),
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
    let (map, body) = super::kept::refusal(limit.bodies(), limit.name(), retry, &headers);
    let mut r = Rejection::with_parts(StatusCode::TOO_MANY_REQUESTS, map, body);
    r.limit = Some(Arc::clone(limit.name()));
    r.retry = Some(retry);
    r.remaining = headers.remaining();
    r
}

/// `503` of the `closed` failure policy: the store failed.
pub(crate) fn unavailable(limit: &Arc<str>, retry: u64) -> Rejection {
    Rejection::problem(
        RefusalReason::Unavailable,
        StatusCode::SERVICE_UNAVAILABLE,
        limit,
        "the rate limiter cannot decide right now; retry shortly",
        &[("limit", json_str(limit))],
    )
    .retry_after(retry)
}

/// `503`: shed, the backend being saturated (no limit was exceeded, so not
/// 429); logged by the shedder, one line a second.
pub(crate) fn overloaded(priority: &str, signal: &str, pressure: f64, retry: u64) -> Rejection {
    let mut r = Rejection::typed_problem(
        StatusCode::SERVICE_UNAVAILABLE,
        RefusalReason::Overloaded.problem_type(),
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
    );
    r.reason = RefusalReason::Overloaded;
    r.retry_after(retry)
}

/// Which of a limit's `early_log` throttles a line uses.
const MISSING_KEY: usize = 0;
const TOO_COSTLY: usize = 1;
const NO_CLIENT_IP: usize = 2;
const INVALID_KEY: usize = 3;
const KEY_UNAVAILABLE: usize = 4;

/// Writes `$line` at `$level` once a second per limit and kind (with
/// `suppressed`, the lines held back since), at DEBUG otherwise: a client
/// that keeps omitting its key, or a server without `ConnectInfo`, must not
/// flood the logs with one line per request.
macro_rules! throttled {
    ($limit:expr, $kind:expr, $level:ident, $($field:tt)*) => {
        match $limit.early_log($kind).event() {
            Some(suppressed) => tracing::$level!(target: "fleetlimit", suppressed, $($field)*),
            None => tracing::debug!(target: "fleetlimit", $($field)*),
        }
    };
}

/// `401`: the request lacks the limit's key (`on_missing = "reject"`).
pub(crate) fn missing_key(limit: &impl Face, challenge: &HeaderValue) -> Rejection {
    throttled!(
        limit,
        MISSING_KEY,
        info,
        limit = %limit.name(),
        reason = "missing-key",
        "refused: the request does not carry {}",
        limit.key_described()
    );
    let mut r = Rejection::problem(
        RefusalReason::MissingKey,
        StatusCode::UNAUTHORIZED,
        limit.name(),
        &format!(
            "this endpoint is rate limited by {}, which the request does not carry",
            limit.key_described()
        ),
        &[("limit", json_str(limit.name()))],
    );
    // RFC 9110 §15.5.2: a 401 carries at least one challenge.
    r.headers.insert(WWW_AUTHENTICATE, challenge.clone());
    r
}

/// `400`: the limit's custom key extractor found the request's key
/// invalid (a malformed tenant id): a client error, not a missing key.
pub(crate) fn invalid_key(limit: &impl Face) -> Rejection {
    throttled!(
        limit,
        INVALID_KEY,
        info,
        limit = %limit.name(),
        reason = "invalid-key",
        "refused: the request's {} is invalid",
        limit.key_described()
    );
    Rejection::problem(
        RefusalReason::InvalidKey,
        StatusCode::BAD_REQUEST,
        limit.name(),
        &format!(
            "this endpoint is rate limited by {}, which is invalid in this request",
            limit.key_described()
        ),
        &[("limit", json_str(limit.name()))],
    )
}

/// `503`: the limit's custom key extractor panicked. A bug of the server,
/// not the client's doing: never admitted uncounted, never a 500.
pub(crate) fn key_unavailable(limit: &impl Face) -> Rejection {
    throttled!(
        limit,
        KEY_UNAVAILABLE,
        error,
        limit = %limit.name(),
        reason = "key-unavailable",
        "refused: cannot compute {}: its extractor panicked",
        limit.key_described()
    );
    Rejection::problem(
        RefusalReason::KeyUnavailable,
        StatusCode::SERVICE_UNAVAILABLE,
        limit.name(),
        "the rate limiter cannot identify the client",
        &[("limit", json_str(limit.name()))],
    )
    .retry_after(1)
}

/// `413`: a cost no bucket of this limit can ever hold. Refused at once,
/// without touching the store (so it drains nothing), and not with 429 —
/// waiting would not help.
pub(crate) fn too_costly(l: &impl Face, cost: u32, capacity: f64) -> Rejection {
    let limit = &**l.name();
    throttled!(l, TOO_COSTLY, info, %limit, cost, capacity, reason = "cost-exceeds-capacity", "refused");
    Rejection::problem(
        RefusalReason::CostTooHigh,
        StatusCode::PAYLOAD_TOO_LARGE,
        l.name(),
        &format!(
            "this request costs {cost}, more than limit {limit:?} can ever allow ({capacity}); it can never be admitted"
        ),
        &[("limit", json_str(limit)), ("cost", cost.to_string())],
    )
}

/// `503`: no client address for a limit keyed by it.
pub(crate) fn no_client_ip(l: &impl Face) -> Rejection {
    let limit = &**l.name();
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
        RefusalReason::NoClientIp,
        StatusCode::SERVICE_UNAVAILABLE,
        l.name(),
        "the rate limiter cannot identify the client",
        &[("limit", json_str(limit))],
    )
    .retry_after(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_never_zero() {
        assert_eq!(retry_after_secs(0.0), 1);
        assert_eq!(retry_after_secs(0.06), 1);
        assert_eq!(retry_after_secs(1.0), 1);
        assert_eq!(retry_after_secs(1.01), 2);
    }
}
