//! The other side of the contract: an HTTP client middleware that honours a
//! server's rate-limit headers, so a well-behaved client neither sees
//! avoidable `429`s nor spends round trips on refusals.
//!
//! [`HonorLimitsLayer`] wraps any `tower::Service<http::Request<B>>` that
//! returns `http::Response<_>` — hyper-util's legacy `Client`, a
//! `tower::service_fn`, another middleware stack:
//!
//! - **Refusals are waited out.** A `429` or `503` is retried after the
//!   wait the server names — `Retry-After` (seconds or an HTTP date), else
//!   the reset of a spent quota — plus jitter, if the request is safe to
//!   repeat, the wait is at most [`max_wait`](HonorLimitsLayer::max_wait),
//!   the request has retries left ([`max_retries`](HonorLimitsLayer::max_retries))
//!   and the shared [retry budget](HonorLimitsLayer::retry_budget) can pay
//!   for one. Otherwise the refusal
//!   is returned to the caller unchanged.
//! - **A spent quota paces the next requests.** When any response says
//!   remaining 0 — the IETF draft field `RateLimit: "name";r=0;t=5`, the
//!   older draft's `RateLimit: remaining=0, reset=5`, or
//!   `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset: 5` (seconds, or a
//!   Unix time) — requests to that origin (scheme and host) wait until the
//!   reset (plus jitter) before they are sent, instead of spending a round
//!   trip on a refusal. A wait longer than `max_wait` is not made: the
//!   request goes out and its answer comes back.
//! - **Safe to repeat** means an idempotent method (`GET`, `HEAD`,
//!   `OPTIONS`, `TRACE`, `PUT`, `DELETE`) or a request carrying an
//!   `Idempotency-Key` header. Other requests are paced but never retried.
//! - **Bodies are cloned** for a retry: the request body type must be
//!   `Clone` (`String`, `Bytes`, `http_body_util::Full<Bytes>`...). A
//!   streaming body can be buffered first (e.g. collected into `Full`)
//!   when it is small enough to keep.
//! - Errors of the inner client (connection refused, timeouts) are passed
//!   through, not retried: that is a retry layer's job, not a rate-limit
//!   one's.
//!
//! Waits use tokio's clock (so they follow `tokio::time::pause` in tests).
//! Services from one `layer` call, and their clones, share the pacing state
//! and the budget; the state is bounded (pacing for at most 1024 origins).
//!
//! ## Why not `tower::retry`
//!
//! tower's `Retry` asks a `Policy` after each response whether to retry,
//! which covers the refusal half. Pacing is the other half: it acts
//! *before* a request is sent, on what earlier responses (of other
//! requests) said, and that needs state shared across requests that
//! `Policy` does not see. One small service does both with one set of
//! waits and one budget (modelled on tower's retry budget: a share of the
//! traffic plus a floor), and keeps `tower` out of the library's
//! dependencies.
//!
//! ## Example
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use fleetlimit::client::HonorLimitsLayer;
//! use http::{Request, Response, StatusCode};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), std::convert::Infallible> {
//! // A stand-in server: the first request is refused for 2 s.
//! let sent = Arc::new(AtomicUsize::new(0));
//! let server = {
//!     let sent = Arc::clone(&sent);
//!     service_fn(move |_req: Request<String>| {
//!         let n = sent.fetch_add(1, Ordering::SeqCst);
//!         async move {
//!             let mut res = Response::new(String::new());
//!             if n == 0 {
//!                 *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
//!                 res.headers_mut().insert("retry-after", "2".parse().unwrap());
//!             }
//!             Ok::<_, std::convert::Infallible>(res)
//!         }
//!     })
//! };
//! let client = HonorLimitsLayer::new()
//!     .max_wait(Duration::from_secs(10))
//!     .layer(server);
//!
//! let start = tokio::time::Instant::now();
//! let res = client.oneshot(Request::new(String::new())).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(sent.load(Ordering::SeqCst), 2);
//! assert!(start.elapsed() >= Duration::from_secs(2));
//! # Ok(()) }
//! ```
//!
//! Over hyper-util's client (`B` = `Full<Bytes>`, which is `Clone`):
//!
//! ```no_run
//! use bytes::Bytes;
//! use fleetlimit::client::HonorLimitsLayer;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::{Layer, ServiceExt};
//!
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let client = HonorLimitsLayer::new().layer(http);
//! let req = http::Request::get("http://127.0.0.1:3000/")
//!     .header("x-api-key", "demo")
//!     .body(Full::new(Bytes::new()))?;
//! let res = client.clone().oneshot(req).await?;
//! println!("{}", res.status());
//! # Ok(()) }
//! ```

mod advice;
mod budget;
mod layer;
mod service;

pub use self::layer::HonorLimitsLayer;
pub use self::service::HonorLimits;
