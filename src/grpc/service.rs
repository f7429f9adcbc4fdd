use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::header::CONTENT_TYPE;
use http::{Request, Response};
use tower_service::Service;

use super::future::respond;

/// Middleware that answers fleetlimit's refusals of gRPC requests as gRPC
/// statuses: what [`GrpcRefusalLayer`](super::GrpcRefusalLayer) wraps a
/// service in. Other requests, and admitted ones, pass through untouched.
///
/// The response body is the inner service's (a refusal's is emptied, as
/// gRPC's trailers-only answer has none: the body type's `Default`, which
/// tonic's and axum's bodies have); the response future is boxed.
///
/// ```
/// use fleetlimit::grpc::GrpcRefusal;
/// use tower::Service;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let service = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
/// });
/// let mut wrapped = GrpcRefusal::new(service);
/// let _inner = wrapped.get_ref();
/// let future = wrapped.call(http::Request::new(String::new()));
/// assert_eq!(future.await?.status(), 200);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct GrpcRefusal<S> {
    inner: S,
}

impl<S> GrpcRefusal<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for GrpcRefusal<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: http_body::Body + Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let grpc = req
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|v| is_grpc(v.as_bytes()));
        Box::pin(respond(self.inner.call(req), grpc))
    }
}

/// `application/grpc`, `application/grpc+proto`, `application/grpc;...`,
/// but not gRPC-Web (`application/grpc-web*`), whose trailers travel in the
/// body: put tonic-web's layer outside this one.
fn is_grpc(content_type: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    content_type.len() >= GRPC.len()
        && content_type[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(content_type.get(GRPC.len()), None | Some(b'+' | b';'))
}

#[cfg(test)]
mod tests {
    use http_body::Body as _;
    use tower::{ServiceExt, service_fn};

    use super::*;

    /// `GrpcRefusal` around a service that answers `status` with body "ok".
    fn wrapped(
        status: u16,
    ) -> GrpcRefusal<
        impl Service<
            Request<String>,
            Response = Response<String>,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone,
    > {
        GrpcRefusal::new(service_fn(move |_req: Request<String>| async move {
            let mut res = Response::new(String::from("ok"));
            *res.status_mut() = http::StatusCode::from_u16(status).unwrap();
            Ok::<_, std::convert::Infallible>(res)
        }))
    }

    fn grpc_request() -> Request<String> {
        let mut req = Request::new(String::new());
        req.headers_mut()
            .insert(CONTENT_TYPE, "application/grpc".parse().unwrap());
        req
    }

    // The removed `GrpcRefusalBody` example: an admitted answer's body is
    // the inner service's, its size known.
    #[tokio::test]
    async fn an_admitted_answer_keeps_the_inner_body() {
        for req in [Request::new(String::new()), grpc_request()] {
            let res = wrapped(200).oneshot(req).await.unwrap();
            assert_eq!(res.body().size_hint().exact(), Some(2));
            assert_eq!(res.body(), "ok");
        }
    }

    // The removed `ResponseFuture` example: the future answers the inner
    // service's status; a non-gRPC 429 is not rewritten either.
    #[tokio::test]
    async fn the_future_answers_the_inner_status_to_other_requests() {
        let res = wrapped(200).oneshot(grpc_request()).await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("grpc-status").is_none());
        let res = wrapped(429)
            .oneshot(Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(res.status(), 429);
        assert_eq!(res.body(), "ok");
    }

    #[test]
    fn grpc_content_types() {
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc;charset=utf-8",
            "Application/GRPC",
        ] {
            assert!(is_grpc(yes.as_bytes()), "{yes}");
        }
        for no in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpcx",
            "application/json",
            "application/grp",
            "",
        ] {
            assert!(!is_grpc(no.as_bytes()), "{no}");
        }
    }
}
