//! The names of the rate-limit headers limited responses carry: the legacy
//! `X-RateLimit-*` and the IETF `RateLimit-Policy` / `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers), and which of them a
//! configuration writes ([`HeaderStyle`], `[headers] style`).
//!
//! ```
//! use fleetlimit::headers::{RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
//!
//! let mut response = http::Response::new(());
//! response.headers_mut().insert(&X_RATELIMIT_REMAINING, http::HeaderValue::from_static("4"));
//! assert_eq!(response.headers()["x-ratelimit-remaining"], "4");
//! assert_eq!(X_RATELIMIT_LIMIT.as_str(), "x-ratelimit-limit");
//! assert_eq!(X_RATELIMIT_RESET.as_str(), "x-ratelimit-reset");
//! assert_eq!(RATELIMIT_POLICY.as_str(), "ratelimit-policy");
//! assert_eq!(RATELIMIT.as_str(), "ratelimit");
//! ```

use http::header::HeaderName;

/// `X-RateLimit-Limit`
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers): each limit's
/// quota `q` and window `w`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers): each limit's
/// remaining `r` and reset `t`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which rate-limit fields responses carry (`[headers] style`).
///
/// - `Legacy` (the default, as before): `X-RateLimit-Limit`,
///   `X-RateLimit-Remaining`, `X-RateLimit-Reset`, of the route's most
///   restrictive limit;
/// - `Ietf`: `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers),
///   one item per limit of the route;
/// - `Both`: all of them.
///
/// ```
/// use fleetlimit::headers::HeaderStyle;
/// use fleetlimit::Config;
///
/// let cfg = Config::from_toml_str("[headers]\nstyle = \"both\"")?;
/// assert_eq!(cfg.header_style(), HeaderStyle::Both);
/// assert_eq!(Config::builder().build()?.header_style(), HeaderStyle::Legacy);
/// # Ok::<(), fleetlimit::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderStyle {
    /// `X-RateLimit-*` only.
    #[default]
    Legacy,
    /// `RateLimit-Policy` and `RateLimit` only.
    Ietf,
    /// Both sets.
    Both,
}

impl HeaderStyle {
    pub(super) fn legacy(self) -> bool {
        self != Self::Ietf
    }

    pub(crate) fn ietf(self) -> bool {
        self != Self::Legacy
    }
}
