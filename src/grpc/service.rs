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
    use super::is_grpc;

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
