use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use super::{ResponseBody, ResponseFuture};
use crate::pipeline::{Decided, Decision};
use crate::reload::Live;

/// Middleware that rate limits requests: what [`RateLimitLayer`](crate::RateLimitLayer) wraps a
/// service in (see it for what clients see).
///
/// ```
/// use axum::{routing::get, Router};
/// use fleetlimit::layer::RateLimit;
/// use fleetlimit::{Config, RateLimitLayer};
/// use tower::Layer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::new(Config::builder().build()?).await?;
/// let service: RateLimit<Router> = layer.layer(Router::new().route("/", get(|| async { "ok" })));
/// let _router: &Router = service.get_ref();
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RateLimit<S> {
    inner: S,
    live: Arc<Live>,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, live: Arc<Live>) -> Self {
        Self { inner, live }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Consumes `self`, returning the wrapped service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: http_body::Body<Data = Bytes>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The running configuration, loaded once: this request is decided
        // under it even if a reload swaps another in meanwhile.
        let limiter = self.live.load();
        match limiter.handle(&req) {
            Decided::Unlimited => ResponseFuture::serving(self.inner.call(req)),
            // Decided already (in-process store, remembered refusal): call
            // the ready service now, keeping the request out of the future.
            Decided::Now(Decision::Admit(a)) => ResponseFuture::admitted(&mut self.inner, req, a),
            Decided::Now(Decision::Reject(r)) => ResponseFuture::rejected(r),
            Decided::Later(decision) => {
                // The service is called later: take the one that was driven
                // to ready and leave a fresh clone behind (calling an
                // unready clone breaks backpressure).
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::deciding(decision, inner, req)
            }
        }
    }
}
