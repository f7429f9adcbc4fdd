//! [`AcceptedLayer`]: stamps each request with when it was accepted, for
//! the queueing delay shedding measures.

use std::task::{Context, Poll};
use std::time::Instant;

use http::Request;
use tower_layer::Layer;
use tower_service::Service;

/// When the request was accepted, for the queueing delay the shedder
/// measures (`[shedding]`, CoDel: the wait from here to the rate-limit
/// layer): set it as early as possible — with [`AcceptedLayer`] outermost,
/// around the whole router, or in the accept loop. Without it the shedder
/// has no queueing-delay signal (the other signals still work). The first
/// one set is kept.
///
/// ```
/// use std::time::Instant;
/// use fleetlimit::shed::Accepted;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(Accepted(Instant::now()));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Accepted(pub Instant);

/// Stamps every request with [`Accepted`] (unless it has one), as the
/// outermost layer: around the whole `Router`, not added with
/// `Router::layer` (which runs after routing).
///
/// ```
/// use axum::{routing::get, Router};
/// use fleetlimit::shed::AcceptedLayer;
/// use fleetlimit::{Config, RateLimitLayer};
/// use tower::Layer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = Config::builder().build()?;
/// let router: Router = Router::new()
///     .route("/", get(|| async { "ok" }))
///     .layer(RateLimitLayer::new(cfg).await?);
/// // Serve this one (e.g. with `axum::serve(listener, app.into_make_service())`).
/// let app = AcceptedLayer.layer(router);
/// # let _ = app;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AcceptedLayer;

impl<S> Layer<S> for AcceptedLayer {
    type Service = StampAccepted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        StampAccepted { inner }
    }
}

/// The service [`AcceptedLayer`] wraps a service in: it stamps each request
/// with [`Accepted`] (now) before calling the inner service.
///
/// ```
/// use fleetlimit::shed::{Accepted, AcceptedLayer};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let svc = AcceptedLayer.layer(service_fn(|req: http::Request<()>| async move {
///     Ok::<_, std::convert::Infallible>(req.extensions().get::<Accepted>().is_some())
/// }));
/// assert!(svc.oneshot(http::Request::new(())).await.unwrap());
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct StampAccepted<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for StampAccepted<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if req.extensions().get::<Accepted>().is_none() {
            req.extensions_mut().insert(Accepted(Instant::now()));
        }
        self.inner.call(req)
    }
}
