//! fleetlimit's refusals for gRPC clients (feature `grpc`).
//!
//! [`RateLimitLayer`](crate::RateLimitLayer) answers a refused request in
//! HTTP: `429` with `Retry-After` and an `application/problem+json` body. A
//! gRPC client reads none of that: it expects HTTP 200 and a `grpc-status`.
//! [`GrpcRefusalLayer`], placed around the rate-limit layer, rewrites the
//! limiter's answers to requests whose `content-type` is
//! `application/grpc[+…]` into gRPC "trailers-only" responses:
//!
//! | limiter's answer | `grpc-status` | `ErrorInfo.reason` | retry information |
//! |---|---|---|---|
//! | `429` limit exceeded | `RESOURCE_EXHAUSTED` (8) | `RATE_LIMIT_EXCEEDED` | `RetryInfo`, pushback = `Retry-After` |
//! | `503` limiter unavailable (`on_redis_error = "closed"`, no client address, a custom key that cannot be computed) | `UNAVAILABLE` (14) | `LIMITER_UNAVAILABLE` | `RetryInfo`, pushback |
//! | `503` shed (`[shedding]`) | `UNAVAILABLE` (14) | `OVERLOADED` | `RetryInfo`, pushback |
//! | `401` missing key (`on_missing = "reject"`) | `UNAUTHENTICATED` (16) | `KEY_MISSING` | none |
//! | `401` [`ChallengeRequired`](crate::ChallengeRequired) | `UNAUTHENTICATED` (16) | `CHALLENGE_REQUIRED` | none |
//! | `413` cost above the limit's capacity | `RESOURCE_EXHAUSTED` (8) | `COST_EXCEEDS_CAPACITY` | `QuotaFailure`; pushback `-1` (never retry) |
//!
//! Each answer carries:
//!
//! - `grpc-message`: the problem's `detail` (else its `title`),
//!   percent-encoded as the gRPC spec asks;
//! - `grpc-status-details-bin`: a `google.rpc.Status` with an `ErrorInfo`
//!   (domain [`ERROR_DOMAIN`], the reason above, metadata `limit`,
//!   `http_status` and `problem_type`) and, as the table says, a
//!   `RetryInfo` (`retry_delay` = `Retry-After`) or a `QuotaFailure`.
//!   Clients decode it with `tonic_types::StatusExt::get_error_details`
//!   (or any gRPC library's rich error model);
//! - [`grpc-retry-pushback-ms`](GRPC_RETRY_PUSHBACK_MS) (gRFC A6): gRPC's
//!   own retry policy waits that long before retrying, or never retries on
//!   a negative value;
//! - the limiter's headers as metadata: `retry-after`, `x-ratelimit-*`.
//!
//! Why a 413 is `RESOURCE_EXHAUSTED` and not `FAILED_PRECONDITION`: the
//! exhausted resource is the limit's capacity, which is what a client's
//! error handling for quotas looks at; the negative pushback and the
//! absence of `RetryInfo` say waiting will not help.
//!
//! Left alone: a custom key's `400` (`urn:fleetlimit:invalid-key`; a
//! service's own `400` problems are too common to rewrite by status),
//! requests that are not gRPC (a browser still gets the 429
//! problem), gRPC-Web (put tonic-web's layer outside this one, so this one
//! sees `application/grpc`), admitted requests, and any response that is
//! not an `application/problem+json` with one of the statuses above (the
//! service's own answers, which for gRPC are HTTP 200 anyway).
//!
//! # Where the layers go
//!
//! On a tonic server, layers added first are outermost, so this one comes
//! before the rate-limit layer:
//!
//! ```no_run
//! use fleetlimit::grpc::GrpcRefusalLayer;
//! use fleetlimit::{Config, RateLimitLayer};
//! use tonic::transport::Server;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = Config::from_toml_str(r#"
//!     [limits.per-key]
//!     key = "header:x-api-key"     # gRPC metadata are HTTP/2 headers
//!     on_missing = "reject"
//!     capacity = 20
//!     refill = "10/s"
//!
//!     [default]                    # a bare tonic server has no MatchedPath
//!     limits = ["per-key"]
//! "#)?;
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! Server::builder()
//!     .layer(GrpcRefusalLayer::new())
//!     .layer(RateLimitLayer::new(cfg).await?)
//!     .add_service(health)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! A bare tonic server routes outside axum's `Router`, so requests carry
//! no `MatchedPath` and only the `[default]` policy applies. For a policy
//! per gRPC service, host the services in an axum `Router` (tonic's
//! `Routes::into_axum_router`, whose route for a service is
//! `/package.Service/{*rest}`, or `route_service` for one method) and add
//! both layers with `Router::layer`, this one last (outermost):
//!
//! ```no_run
//! use fleetlimit::grpc::GrpcRefusalLayer;
//! use fleetlimit::{Config, RateLimitLayer};
//! use tonic::service::Routes;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = Config::from_toml_str(r#"
//!     [limits.per-key]
//!     key = "header:x-api-key"
//!     capacity = 20
//!     refill = "10/s"
//!
//!     [[routes]]
//!     path = "/grpc.health.v1.Health/{*rest}"
//!     limits = ["per-key"]
//! "#)?;
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! let router = Routes::new(health)
//!     .into_axum_router()
//!     .layer(RateLimitLayer::new(cfg).await?)
//!     .layer(GrpcRefusalLayer::new());
//! tonic::transport::Server::builder()
//!     .add_routes(router.into())
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Limits keyed by client IP need the peer's address. tonic's server keeps
//! it in its own `TcpConnectInfo` extension, which fleetlimit does not
//! read (without it an IP-keyed limit answers `503`, here `UNAVAILABLE`):
//! copy it into a `SocketAddr` extension in a layer outside the rate-limit
//! layer.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use fleetlimit::grpc::GrpcRefusalLayer;
//! use fleetlimit::{Config, RateLimitLayer};
//! use tonic::transport::server::TcpConnectInfo;
//! use tower::util::MapRequestLayer;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let cfg = Config::builder().build()?;
//! let peer_addr = MapRequestLayer::new(|mut req: http::Request<tonic::body::Body>| {
//!     let peer = req.extensions().get::<TcpConnectInfo>().and_then(TcpConnectInfo::remote_addr);
//!     if let Some(addr) = peer {
//!         req.extensions_mut().insert::<SocketAddr>(addr);
//!     }
//!     req
//! });
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! tonic::transport::Server::builder()
//!     .layer(GrpcRefusalLayer::new())
//!     .layer(peer_addr)
//!     .layer(RateLimitLayer::new(cfg).await?)
//!     .add_service(health)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```

mod future;
mod layer;
mod refusal;
mod service;

pub use self::layer::GrpcRefusalLayer;
pub use self::refusal::{ERROR_DOMAIN, GRPC_RETRY_PUSHBACK_MS};
pub use self::service::GrpcRefusal;
