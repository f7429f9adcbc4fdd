use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a [`GrpcRefusal`](super::GrpcRefusal) response: the
    /// inner service's body, or none (a gRPC "trailers-only" answer, all of
    /// it in the headers).
    ///
    /// ```
    /// use fleetlimit::grpc::GrpcRefusalBody;
    /// use http_body::Body as _;
    ///
    /// let body = GrpcRefusalBody::new(String::from("ok"));
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    #[derive(Debug)]
    pub struct GrpcRefusalBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        // A trailers-only answer: everything is in the headers.
        Empty,
    }
}

impl<B> GrpcRefusalBody<B> {
    /// The inner service's body, passed through.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(super) fn empty() -> Self {
        Self { kind: Kind::Empty }
    }
}

impl<B: Body> Body for GrpcRefusalBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Empty => SizeHint::with_exact(0),
        }
    }
}
