//! `fleetlimit rls --config FILE --listen ADDR` (feature `rls`): Envoy's
//! rate limit service, `envoy.service.ratelimit.v3.RateLimitService`,
//! and `grpc.health.v1` beside it. See docs/rls.md.
//!
//! A new way in, not a second limiter: the server builds the layer of the
//! file ([`RateLimitLayer`]: its stores, breaker, leases, refused-key
//! cache, regions, records, metrics and reload) and asks its running
//! limiter, through the same plan → key → check → settle steps as an
//! HTTP request. Its own files only translate:
//!
//! | file | what |
//! |------|------|
//! | `descriptors.rs` | a request's bounds; a descriptor → its `[[descriptors]]` rule, the request its limits read, its cost |
//! | `answer.rs` | a descriptor's decision → its status and the layer's header fields |
//! | `service.rs` | `ShouldRateLimit`: each descriptor asked and answered |
//!
//! It stops gracefully on SIGTERM (and Ctrl-C): its health turns
//! `NOT_SERVING`, calls in flight are answered, then it exits 0. SIGHUP reloads the file as
//! [`ReloadHandle::reload_file`](crate::reload::ReloadHandle::reload_file)
//! does for the layer: a file that does not load, or that the reload
//! guard refuses, leaves the running configuration in place.

mod answer;
mod descriptors;
mod service;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::signal::unix::{SignalKind, signal};
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::reload::Live;
use crate::{Config, RateLimitLayer};
use service::RateLimiter;

/// The service on a layer's running limiter (`RateLimitLayer::rls_service`).
pub(crate) fn service(live: &Arc<Live>) -> RateLimitServiceServer<RateLimiter> {
    RateLimitServiceServer::new(RateLimiter {
        live: Arc::clone(live),
    })
}

/// Serves until SIGTERM; `Err((exit status, message))` when it cannot
/// start (2: the configuration; 1: the address).
pub(crate) async fn serve(config: &Path, listen: SocketAddr) -> Result<(), (u8, String)> {
    let cfg = Config::from_toml_file(config).map_err(|e| (2, e.to_string()))?;
    let layer = RateLimitLayer::new(cfg)
        .await
        .map_err(|e| (2, e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| (1, format!("cannot listen on {listen}: {e}")))?;
    let bound = listener.local_addr().map_err(|e| (1, e.to_string()))?;
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<RateLimiter>>()
        .await;
    let service = layer.rls_service();
    let mut hangup = signal(SignalKind::hangup()).map_err(|e| (1, e.to_string()))?;
    let mut term = signal(SignalKind::terminate()).map_err(|e| (1, e.to_string()))?;
    let reload = layer.reload_handle();
    let file = config.to_path_buf();
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            match reload.reload_file(&file).await {
                Ok(changes) => eprintln!("fleetlimit rls: reloaded {}: {changes}", file.display()),
                Err(e) => eprintln!(
                    "fleetlimit rls: reload of {} refused, the running configuration goes on: {e}",
                    file.display()
                ),
            }
        }
    });
    // Said on stdout once listening: with `--listen 127.0.0.1:0`, the port.
    println!("fleetlimit rls: listening on {bound}");
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        // Health checks that come before the listener closes send Envoy
        // elsewhere, as envoyproxy/ratelimit does on SIGTERM.
        health
            .set_not_serving::<RateLimitServiceServer<RateLimiter>>()
            .await;
        eprintln!("fleetlimit rls: stopping");
    };
    Server::builder()
        .add_service(health_service)
        .add_service(Undecodable(service))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), stop)
        .await
        .map_err(|e| (1, e.to_string()))
}

/// A request tonic cannot decode (a non-UTF-8 byte in a string field,
/// a truncated message) is the client's error: `INVALID_ARGUMENT`, not
/// the `INTERNAL` tonic answers (the service itself never answers
/// `INTERNAL`).
#[derive(Clone)]
struct Undecodable<S>(S);

impl<S: NamedService> NamedService for Undecodable<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower_service::Service<http::Request<B>> for Undecodable<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let answer = self.0.call(req);
        Box::pin(async move {
            let mut res = answer.await?;
            let internal = tonic::Code::Internal as i32;
            let status = res.headers().get("grpc-status");
            if status.is_some_and(|s| s.as_bytes() == internal.to_string().as_bytes()) {
                let invalid = tonic::Code::InvalidArgument as i32;
                res.headers_mut()
                    .insert("grpc-status", http::HeaderValue::from(invalid));
            }
            Ok(res)
        })
    }
}
