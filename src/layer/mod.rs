//! The tower middleware: [`RateLimitLayer`] → [`RateLimit`] → [`ResponseFuture`].
//!
//! Each request is routed to its policy by axum's `MatchedPath`, keyed,
//! and decided by the store in one call before the inner service runs:
//!
//! - **admitted**: the inner service's response, plus `X-RateLimit-Limit`,
//!   `X-RateLimit-Remaining` and `X-RateLimit-Reset`;
//! - **refused**: `429 Too Many Requests` with `Retry-After`, the same
//!   headers and an `application/problem+json` body naming the limit;
//! - **missing key** (`on_missing = "reject"`): `401 Unauthorized`;
//! - **Redis failed or too slow**: the route's `on_redis_error` — `open`
//!   serves (no rate-limit headers, since nothing was counted), `closed`
//!   answers `503` with `Retry-After`, `local` decides from in-process
//!   buckets sized limit ÷ fleet size. Never a 500.
//!
//! The layer works with [`Router::layer`](axum::Router::layer) and
//! [`Router::route_layer`](axum::Router::route_layer), and with any
//! `Service<Request<B>>` whose response body yields `Bytes`.
//!
//! # Example
//!
//! ```
//! use axum::{routing::get, Router};
//! use fleetlimit::{Config, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = Config::from_toml_str(r#"
//!     [limits.per-key]
//!     key = "header:x-api-key"
//!     capacity = 2
//!     refill = "1/min"
//!
//!     [[routes]]
//!     path = "/"
//!     limits = ["per-key"]
//! "#)?;
//! // No [redis] section: in-process buckets.
//! let app = Router::new()
//!     .route("/", get(|| async { "ok" }))
//!     .layer(RateLimitLayer::new(cfg).await?);
//!
//! let req = || http::Request::get("/").header("x-api-key", "k1").body(axum::body::Body::empty()).unwrap();
//! assert_eq!(app.clone().oneshot(req()).await?.status(), 200);
//! let second = app.clone().oneshot(req()).await?;
//! assert_eq!(second.headers()["x-ratelimit-remaining"], "0");
//! let third = app.clone().oneshot(req()).await?;
//! assert_eq!(third.status(), 429);
//! assert_eq!(third.headers()["retry-after"], "60"); // one token a minute
//! # Ok(())
//! # }
//! ```

mod body;
mod future;
// tower-http's layout: the layer type lives in `layer.rs` of its module.
#[allow(clippy::module_inception)]
mod layer;
mod service;

pub use self::body::ResponseBody;
pub use self::future::ResponseFuture;
pub use self::layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use self::service::RateLimit;
