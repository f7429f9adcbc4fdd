//! [`StampAccepted`]: stamps each request with when it was accepted, for
//! the queueing delay shedding measures.

use std::task::{Context, Poll};
use std::time::Instant;

use http::Request;
use tower_service::Service;

/// When the request was accepted, for the queueing delay the shedder
/// measures (`[shedding]`, CoDel: the wait from here to the rate-limit
/// layer): set it as early as possible — with [`StampAccepted`] outermost,
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

/// Stamps every request with [`Accepted`] (now, unless it has one) before
/// calling the inner service: wrap the outermost service in it, the whole
/// `Router`, not with `Router::layer` (which runs after routing). In a
/// `tower::ServiceBuilder`, `layer_fn(StampAccepted::new)`.
///
/// ```
/// use axum::{routing::get, Router};
/// use fleetlimit::shed::{Accepted, StampAccepted};
/// use fleetlimit::{Config, RateLimitLayer};
/// use tower::{service_fn, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = Config::builder().build()?;
/// let router: Router = Router::new()
///     .route("/", get(|| async { "ok" }))
///     .layer(RateLimitLayer::new(cfg).await?);
/// // Serve this one (e.g. with `axum::serve(listener, app.into_make_service())`).
/// let app = StampAccepted::new(router);
/// # let _ = app;
///
/// let svc = StampAccepted::new(service_fn(|req: http::Request<()>| async move {
///     Ok::<_, std::convert::Infallible>(req.extensions().get::<Accepted>().is_some())
/// }));
/// assert!(svc.oneshot(http::Request::new(())).await.unwrap());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct StampAccepted<S> {
    inner: S,
}

impl<S> StampAccepted<S> {
    /// `inner`, its requests stamped.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tower::{ServiceExt, service_fn};

    use super::*;

    async fn stamped(req: Request<()>) -> Option<Instant> {
        let svc = StampAccepted::new(service_fn(|req: Request<()>| async move {
            Ok::<_, std::convert::Infallible>(req.extensions().get::<Accepted>().map(|a| a.0))
        }));
        svc.oneshot(req).await.unwrap()
    }

    // The removed `StampAccepted` example: a request reaches the inner
    // service stamped; and, as documented, a stamp already there is kept.
    #[tokio::test]
    async fn requests_are_stamped_once_the_first_stamp_kept() {
        let before = Instant::now();
        let at = stamped(Request::new(())).await.expect("stamped");
        assert!(at >= before);
        let earlier = before.checked_sub(Duration::from_secs(1)).unwrap_or(before);
        let mut req = Request::new(());
        req.extensions_mut().insert(Accepted(earlier));
        assert_eq!(stamped(req).await, Some(earlier));
    }
}
