use std::sync::Arc;

use tower_layer::Layer;

use super::{RateLimit, Stats};
use crate::reload::{Live, ReloadHandle};
use crate::store::Store;

/// Applies [`RateLimit`] to a service. Cheap to clone: every clone shares
/// one store and one set of local buckets.
///
/// Each request is routed to its policy by axum's `MatchedPath`, keyed,
/// and decided by the store in one call before the inner service runs:
///
/// - **admitted**: the inner service's response, plus `X-RateLimit-Limit`,
///   `X-RateLimit-Remaining` and `X-RateLimit-Reset` of the limit that
///   refuses first, in whole requests of the route's cost (a response that
///   says `Remaining: N` is followed by N admitted requests of the route,
///   unless other traffic spends them);
/// - **refused**: `429 Too Many Requests` with `Retry-After`, the same
///   headers and an `application/problem+json` body naming the limit;
/// - **missing key** (`on_missing = "reject"`): `401 Unauthorized`;
/// - **Redis failed or too slow**: the route's `on_redis_error` — `open`
///   serves (no rate-limit headers, since nothing was counted), `closed`
///   answers `503` with `Retry-After`, `local` decides from in-process
///   buckets sized limit ÷ fleet size. Never a 500.
///
/// The layer works with [`Router::layer`](axum::Router::layer) and
/// [`Router::route_layer`](axum::Router::route_layer), and with any
/// `Service<Request<B>>` whose response body yields `Bytes`.
///
/// # Example
///
/// ```
/// use axum::{routing::get, Router};
/// use fleetlimit::{Config, RateLimitLayer};
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = Config::from_toml_str(r#"
///     [limits.per-key]
///     key = "header:x-api-key"
///     capacity = 2
///     refill = "1/min"
///
///     [[routes]]
///     path = "/"
///     limits = ["per-key"]
/// "#)?;
/// // No [redis] section: in-process buckets.
/// let app = Router::new()
///     .route("/", get(|| async { "ok" }))
///     .layer(RateLimitLayer::new(cfg).await?);
///
/// let req = || http::Request::get("/").header("x-api-key", "k1").body(axum::body::Body::empty()).unwrap();
/// assert_eq!(app.clone().oneshot(req()).await?.status(), 200);
/// let second = app.clone().oneshot(req()).await?;
/// assert_eq!(second.headers()["x-ratelimit-remaining"], "0");
/// let third = app.clone().oneshot(req()).await?;
/// assert_eq!(third.status(), 429);
/// assert_eq!(third.headers()["retry-after"], "60"); // one token a minute
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    pub(super) live: Arc<Live>,
}

impl RateLimitLayer {
    /// A handle that changes this layer's configuration while it serves
    /// (see [`ReloadHandle`]).
    #[must_use]
    pub fn reload_handle(&self) -> ReloadHandle {
        ReloadHandle::new(&self.live)
    }

    /// Envoy's rate limit service (`envoy.service.ratelimit.v3`, feature
    /// `rls`) deciding `[[descriptors]]` on this layer: its store, buckets,
    /// policies and reloads, so a limit a route and a descriptor share is
    /// charged on one key. `fleetlimit rls` serves it (docs/rls.md); this
    /// is the way to serve it from a tonic server of one's own:
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use fleetlimit::{Config, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new(Config::from_toml_file("fleetlimit.toml")?).await?;
    /// tonic::transport::Server::builder()
    ///     .add_service(layer.rls_service())
    ///     .serve("0.0.0.0:8081".parse()?)
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// (A message tonic cannot decode, such as a non-UTF-8 byte in a
    /// string, is tonic's `INTERNAL` here; `fleetlimit rls` answers it
    /// `INVALID_ARGUMENT`.)
    #[cfg(feature = "rls")]
    #[must_use]
    pub fn rls_service(
        &self,
    ) -> envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<
        impl envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService,
    >{
        crate::rls::service(&self.live)
    }

    /// The store deciding requests.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn Store> {
        self.live.core().store()
    }

    /// What the layer has counted: its circuit breaker (on a Redis
    /// Cluster every node's added up, with the worst state), its decision
    /// recorder and its part of the regional quota exchange (see
    /// [`Stats`]).
    #[must_use]
    pub fn stats(&self) -> Stats {
        let core = self.live.core();
        Stats::new(
            core.breaker_stats(),
            core.record_stats(),
            core.regions.as_ref().map(|rt| rt.stats()),
        )
    }

    /// On a Redis Cluster, each primary's own breaker by `host:port` (made
    /// when a check first goes to it; only the `breaker_*` part of each
    /// [`Stats`] is there); empty otherwise.
    #[must_use]
    pub fn node_breakers(&self) -> Vec<(String, Stats)> {
        self.live
            .core()
            .node_breaker_stats()
            .into_iter()
            .map(|(node, b)| (node, Stats::new(Some(b), None, None)))
            .collect()
    }

    /// Requests in flight through this layer (counted with `[shedding]`
    /// only; `None` without it), those held by `on_exceed = "delay"`
    /// included (which shedding does not count as pressure).
    #[must_use]
    pub fn in_flight(&self) -> Option<u32> {
        self.live.core().shedder().map(|s| s.in_flight())
    }

    /// N, the fleet size the `local` fallback divides limits by now.
    #[must_use]
    pub fn fleet_size(&self) -> u32 {
        self.live.core().fleet_size()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.live))
    }
}
