//! # fleetlimit
//!
//! One rate limit across a whole fleet of axum/hyper servers, decided by
//! one atomic Redis script per request, that degrades precision — never
//! availability — when Redis is slow or gone.
//!
//! ## The request path
//!
//! 0. **Shed** (with `[shedding]` only): when the backend is saturated
//!    (requests in flight, queueing delay, the application's
//!    [load signal](layer::RateLimitLayerBuilder::load_signal), a fleet-wide value in Redis), routes are refused by
//!    [`Priority`](shed::Priority) with `503` before any limit is charged.
//! 1. **Route**: the route's policy is found by axum's `MatchedPath` (the
//!    template, e.g. `/users/{id}`), else the `[default]` policy, else the
//!    request is not limited.
//! 2. **Key** ([`KeySource`](configuration::KeySource)): each limit extracts its key — an API key
//!    header, an [`Account`], the client IP (from `ConnectInfo`; forwarded
//!    headers only from configured trusted proxies; IPv6 grouped by /64), IP
//!    and account, one global bucket, or a key the application computes
//!    ([`key_fn`](layer::RateLimitLayerBuilder::key_fn), e.g. a tenant). A request missing its key is
//!    counted by IP or refused with 401, as the limit says — never put in a
//!    shared "empty" bucket.
//! 3. **Check** ([`store::Store`]): every limit of the request is decided in
//!    one call — one `EVALSHA` on Redis with a hard deadline (5 ms by
//!    default), or the in-process [`store::MemoryStore`]. The scripts
//!    (`lua/`) use Redis `TIME`, refill, take `cost` from every limit or none,
//!    and write each key together with its expiry. A circuit breaker stops
//!    calling a failing Redis for a cool-off.
//! 4. **Decide**: admitted requests reach the service and get
//!    `X-RateLimit-*` headers (and/or the IETF `RateLimit-Policy` /
//!    `RateLimit`, `[headers] style`); refused ones get `429` with
//!    `Retry-After` (reshaped by `RateLimitLayerBuilder::on_refusal` if set).
//!    A limit may instead delay the request or hand the service a
//!    [`Challenge`] (`on_exceed`), count only failed answers
//!    (`count = "failures"`, given back after the handler answered), or cap
//!    requests in flight (`algorithm = "concurrency"`, a slot held until the
//!    response body ends).
//! 5. **Redis failed**: the route's `on_redis_error` — `open`, `closed`
//!    (503) or `local` (in-process buckets of limit ÷ fleet size).
//!
//! ## Example
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{routing::{get, post}, Router};
//! use fleetlimit::{Config, RateLimitLayer};
//!
//! # async fn sign_in() -> &'static str { "welcome" }
//! # async fn search() -> &'static str { "results" }
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let cfg = Config::from_toml_file("fleetlimit.toml")?;
//!     let app = Router::new()
//!         .route("/sign-in", post(sign_in))
//!         .route("/search", get(search))
//!         .layer(RateLimitLayer::new(cfg).await?);
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     // ConnectInfo gives the limiter the client address.
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//!     Ok(())
//! }
//! ```
//!
//! The source reads in the same order (`docs/architecture.md` draws it):
//! `layer/` → `pipeline/` (key, check, settle) → `route/`, `key/` →
//! `store/` → `algorithm/`, and `answer/` for what clients are sent.
//!
//! See [`configuration`] for every setting (the TOML file and the builder
//! alike), [`Config`] for the TOML schema (and [`ConfigBuilder`] for the
//! same in code), [`RateLimitLayer`] for what clients see, [`store`] to
//! bring a store of your own, and [`admin`] for the operator's tools.
//!
//! With the cargo feature `metrics`, the layer reports its decisions (per
//! route, limit and outcome), Redis call latency, script calls, breaker
//! state and cache hits through the `metrics` facade to whichever recorder
//! the application installs; `docs/metrics.md` lists every metric.
//!
//! ## Requirements
//!
//! With Redis: **Redis 7.0 or newer** (standalone, Sentinel or Cluster); the
//! scripts use `PEXPIRE … NX` and `SET … PXAT/KEEPTTL`. Without a `[redis]`
//! section nothing is needed: the buckets live in the process.

// docs.rs (nightly, `--cfg docsrs`): each item behind a cargo feature is
// badged with it. `doc_cfg` does this on its own since `doc_auto_cfg` was
// merged into it (Rust 1.92 removed `doc_auto_cfg`).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
// Without Redis, the scripts' arguments, Redis key names and the writers of
// Redis-only features are compiled but unused: dead code is checked in the
// builds with `redis` (the default), not reported here item by item.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports))]

#[cfg(feature = "redis")]
pub mod admin;
mod algorithm;
mod answer;
mod bounded;
mod breaker;
#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
mod config;
mod fleet;
#[cfg(feature = "grpc")]
pub mod grpc;
pub use answer::headers;
mod key;
pub mod layer;
mod log_throttle;
mod metrics;
mod pipeline;
pub mod plan;
mod record;
mod region;
pub mod reload;
mod request;
#[cfg(feature = "redis")]
mod reset;
#[cfg(feature = "rls")]
mod rls;
mod route;
pub mod shed;
pub mod store;
mod sync;

/// The configuration reference, `docs/configuration.md` as rendered here,
/// and the parts of a [`Config`] that code builds.
#[doc = include_str!("../docs/configuration.md")]
pub mod configuration {
    pub use crate::config::{FailurePolicy, LimitConfig, Rate, RouteConfig};
    pub use crate::key::KeySource;
    pub use crate::route::OnExceed;
}

// Each public item has one path: what an application meets first here,
// the rest in the module of its topic.
pub use answer::{Refusal, RefusalReason};
pub use config::{Config, ConfigBuilder, ConfigError, redact_url};
pub use key::{Account, KeyAnswer};
pub use layer::{error::BuildError, layer::RateLimitLayer};
pub use pipeline::Refund;
// Login defence: what a challenged request carries, and the answer for it.
pub use pipeline::{Challenge, ChallengeRequired};
pub use request::RequestRef;
pub use store::error::StoreError;
