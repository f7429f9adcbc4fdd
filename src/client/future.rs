use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

type Boxed<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

/// Response future of [`HonorLimits`](super::HonorLimits): the attempts,
/// the waits between them, and the final response.
///
/// Boxed: it holds the inner client's futures of several attempts and
/// the sleeps in between, which is an `async` block's job.
pub struct ResponseFuture<B, E> {
    inner: Boxed<B, E>,
}

impl<B, E> ResponseFuture<B, E> {
    pub(super) fn new(f: impl Future<Output = Result<Response<B>, E>> + Send + 'static) -> Self {
        Self { inner: Box::pin(f) }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<B>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
