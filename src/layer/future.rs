use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::ResponseBody;
use crate::pipeline::response::{RateHeaders, Rejection};
use crate::pipeline::{Admitted, After, Decision, DecisionFuture, Hold};

/// Work to finish before an admitted response goes out (see [`After`]).
type Finish = Pin<Box<dyn Future<Output = ()> + Send>>;

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit): first the
    /// decision, then (if admitted) the inner service.
    ///
    /// ```
    /// use axum::{body::Body, routing::get, Router};
    /// use fleetlimit::{Config, RateLimitLayer, ResponseFuture};
    /// use tower::{Layer, Service};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::in_memory(&Config::builder().build()?);
    /// let mut service = layer.layer(Router::new().route("/", get(|| async { "ok" })));
    /// let future: ResponseFuture<Router, Body> = service.call(http::Request::new(Body::empty()));
    /// assert_eq!(future.await?.status(), 200);
    /// # Ok(()) }
    /// ```
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
    }
}

pin_project! {
    /// Small on purpose: the future is moved (and boxed by axum) on every
    /// request, so what waits on the store (the service and the request)
    /// is boxed, and so is a refusal.
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Deciding {
            decision: DecisionFuture,
            call: Option<Box<(S, Request<ReqBody>)>>,
        },
        Serving {
            #[pin]
            future: S::Future,
            headers: Option<RateHeaders>,
            // What the response body keeps until it is over.
            hold: Hold,
            after: Option<After>,
        },
        // The handler answered; `After`'s work runs before the response
        // goes out.
        Finishing {
            work: Finish,
            response: Option<(S::Response, Hold)>,
        },
        Rejected {
            rejection: Option<Box<Rejection>>,
        },
        Done,
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn deciding(decision: DecisionFuture, service: S, req: Request<ReqBody>) -> Self {
        Self {
            state: State::Deciding {
                decision,
                call: Some(Box::new((service, req))),
            },
        }
    }

    /// A decision made already: call the service now (or refuse).
    pub(crate) fn decided(decision: Decision, service: &mut S, req: Request<ReqBody>) -> Self {
        let state = match decision {
            Decision::Admit(a) => serving(service, req, a),
            Decision::Reject(r) => State::Rejected {
                rejection: Some(Box::new(r)),
            },
        };
        Self { state }
    }

    /// Not limited: the service's own answer, no headers.
    pub(crate) fn serving(future: S::Future) -> Self {
        Self {
            state: State::Serving {
                future,
                headers: None,
                hold: Hold::default(),
                after: None,
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Deciding { decision, call } => {
                    let decision = ready!(decision.as_mut().poll(cx));
                    let (mut service, req) = *call.take().expect("polled after completion");
                    match decision {
                        Decision::Admit(a) => {
                            this.state.set(serving(&mut service, req, a));
                        }
                        Decision::Reject(r) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(rejected(r)));
                        }
                    }
                }
                StateProj::Rejected { rejection } => {
                    let r = rejection.take().expect("polled after completion");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(rejected(*r)));
                }
                StateProj::Serving {
                    future,
                    headers,
                    hold,
                    after,
                } => {
                    let mut res = ready!(future.poll(cx))?;
                    if let Some(h) = headers.take() {
                        h.write(res.headers_mut());
                    }
                    let hold = std::mem::take(hold);
                    if let Some(work) = after
                        .take()
                        .and_then(|after| after(res.status(), res.extensions()))
                    {
                        let response = Some((res, hold));
                        this.state.set(State::Finishing { work, response });
                        continue;
                    }
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(res.map(|b| ResponseBody::inner(b, hold))));
                }
                StateProj::Finishing { work, response } => {
                    ready!(work.as_mut().poll(cx));
                    let (res, hold) = response.take().expect("polled after completion");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(res.map(|b| ResponseBody::inner(b, hold))));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// Calls the service, giving the handler its refund handle and extensions.
fn serving<S, ReqBody>(service: &mut S, mut req: Request<ReqBody>, a: Admitted) -> State<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    if let Some(refund) = a.refund {
        req.extensions_mut().insert(refund);
    }
    if !a.extensions.is_empty() {
        req.extensions_mut().extend(a.extensions);
    }
    State::Serving {
        future: service.call(req),
        headers: a.headers,
        hold: a.hold,
        after: a.after,
    }
}

fn rejected<B>(r: Rejection) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full(r.body));
    *res.status_mut() = r.status;
    *res.headers_mut() = r.headers;
    res
}

impl<S, ReqBody> std::fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
