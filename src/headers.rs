//! The names of the rate-limit headers limited responses carry: the legacy
//! `X-RateLimit-*` and the IETF `RateLimit-Policy` / `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers), chosen by `[headers] style`
//! ([`HeaderStyle`](crate::HeaderStyle)).
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

pub use crate::pipeline::response::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
