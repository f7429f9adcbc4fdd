use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::pipeline::Hold;

pin_project! {
    /// The body of a [`RateLimit`](super::RateLimit) response: the inner
    /// service's body, or the layer's own short answer (429, 503, 401).
    ///
    /// ```
    /// use axum::{body::Body, routing::get, Router};
    /// use fleetlimit::layer::ResponseBody;
    /// use fleetlimit::{Config, RateLimitLayer};
    /// use http_body_util::BodyExt;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::new(Config::builder().build()?).await?;
    /// let service = layer.layer(Router::new().route("/", get(|| async { "ok" })));
    /// let response: http::Response<ResponseBody<Body>> =
    ///     service.oneshot(http::Request::new(Body::empty())).await?;
    /// assert_eq!(response.into_body().collect().await?.to_bytes(), "ok");
    /// # Ok(()) }
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        // Nothing to give back at the end: every call passes through.
        Inner { #[pin] body: B },
        // Given back when the body ends (or is dropped, with it).
        Held { #[pin] body: B, hold: Hold },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The service's body, keeping `hold` until it ends.
    #[inline]
    pub(crate) fn inner(body: B, hold: Hold) -> Self {
        let kind = if hold.is_empty() {
            Kind::Inner { body }
        } else {
            Kind::Held { body, hold }
        };
        Self { kind }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full { data: Some(data) },
        }
    }
}

/// An empty body (what `grpc::GrpcRefusal` answers
/// a refused gRPC request with: everything is in its headers).
impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        Self {
            kind: Kind::Full { data: None },
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } | Kind::Held { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { data } => f.debug_tuple("ResponseBody::Full").field(data).finish(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Held { body, hold } => {
                let frame = body.poll_frame(cx);
                // The last frame was sent (or the body failed): what the
                // request held is given back now, not when hyper drops it.
                if matches!(frame, Poll::Ready(None | Some(Err(_)))) && !hold.is_empty() {
                    *hold = Hold::default();
                }
                frame
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } | Kind::Held { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::Held { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use http_body_util::{BodyExt, Full};

    use super::*;

    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn held() -> (Hold, Arc<AtomicBool>) {
        let released = Arc::new(AtomicBool::new(false));
        let mut hold = Hold::default();
        hold.push(Flag(Arc::clone(&released)));
        (hold, released)
    }

    #[tokio::test]
    async fn the_hold_is_given_back_when_the_body_ends_not_later() {
        let (hold, released) = held();
        let mut body = ResponseBody::inner(Full::new(Bytes::from_static(b"ok")), hold);
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "ok");
        assert!(!released.load(Ordering::SeqCst), "held while sending");
        assert!(body.frame().await.is_none());
        assert!(released.load(Ordering::SeqCst), "given back at the end");
        drop(body);
    }

    #[test]
    fn the_hold_is_given_back_when_the_body_is_dropped() {
        let (hold, released) = held();
        let body = ResponseBody::inner(Full::new(Bytes::from_static(b"ok")), hold);
        assert!(!released.load(Ordering::SeqCst));
        drop(body);
        assert!(released.load(Ordering::SeqCst));
    }
}
