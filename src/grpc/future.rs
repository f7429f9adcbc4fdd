use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use super::GrpcRefusalBody;
use super::refusal::{self, MAX_PROBLEM, Refusal};

/// Frames read from a refusal's body at most: fleetlimit's are one.
const MAX_FRAMES: u8 = 16;

pin_project! {
    /// Response future of [`GrpcRefusal`](super::GrpcRefusal): the inner
    /// service's answer, and for a refused gRPC request its short problem
    /// body, read to write the gRPC status.
    ///
    /// ```
    /// use fleetlimit::grpc::{GrpcRefusal, ResponseFuture};
    /// use tower::Service;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let service = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
    /// });
    /// let mut service = GrpcRefusal::new(service);
    /// let future = service.call(http::Request::new(String::new()));
    /// assert_eq!(future.await?.status(), 200);
    /// # Ok(()) }
    /// ```
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Calling {
            #[pin]
            future: F,
            grpc: bool,
        },
        Reading {
            parts: Option<http::response::Parts>,
            refusal: Refusal,
            #[pin]
            body: B,
            buf: Vec<u8>,
            frames: u8,
        },
        Done,
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(super) fn new(future: F, grpc: bool) -> Self {
        Self {
            state: State::Calling { future, grpc },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<GrpcRefusalBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Calling { future, grpc } => {
                    let res = ready!(future.poll(cx))?;
                    let refusal = match *grpc {
                        true => refusal::classify(res.status(), res.headers()),
                        false => None,
                    };
                    let Some(refusal) = refusal else {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(res.map(GrpcRefusalBody::new)));
                    };
                    let (parts, body) = res.into_parts();
                    // fleetlimit's problem bodies are small and whole; a
                    // large or unsized one is not read (the status alone
                    // then names the refusal).
                    if body.size_hint().upper().is_none_or(|n| n > MAX_PROBLEM) {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(refusal::answer(parts, refusal, None)));
                    }
                    this.state.set(State::Reading {
                        parts: Some(parts),
                        refusal,
                        body,
                        buf: Vec::new(),
                        frames: 0,
                    });
                }
                StateProj::Reading {
                    parts,
                    refusal,
                    mut body,
                    buf,
                    frames,
                } => {
                    let whole = loop {
                        match ready!(body.as_mut().poll_frame(cx)) {
                            None => break true,
                            Some(Err(_)) => break false,
                            Some(Ok(frame)) => {
                                *frames += 1;
                                if *frames > MAX_FRAMES {
                                    break false;
                                }
                                let Ok(mut data) = frame.into_data() else {
                                    continue;
                                };
                                if (buf.len() + data.remaining()) as u64 > MAX_PROBLEM {
                                    break false;
                                }
                                while data.has_remaining() {
                                    let chunk = data.chunk();
                                    buf.extend_from_slice(chunk);
                                    let n = chunk.len();
                                    data.advance(n);
                                }
                            }
                        }
                    };
                    let parts = parts.take().expect("polled after completion");
                    let problem = whole.then_some(&buf[..]);
                    let res = refusal::answer(parts, *refusal, problem);
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(res));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

impl<F, B> std::fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
