//! The names of the rate-limit headers every limited response carries.
//!
//! ```
//! use fleetlimit::headers::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
//!
//! let mut response = http::Response::new(());
//! response.headers_mut().insert(&X_RATELIMIT_REMAINING, http::HeaderValue::from_static("4"));
//! assert_eq!(response.headers()["x-ratelimit-remaining"], "4");
//! assert_eq!(X_RATELIMIT_LIMIT.as_str(), "x-ratelimit-limit");
//! assert_eq!(X_RATELIMIT_RESET.as_str(), "x-ratelimit-reset");
//! ```

pub use crate::pipeline::response::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
