use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::ResponseBody;
use crate::answer::{RateHeaders, RefusalHook, Rejection};
use crate::pipeline::{Admitted, After, Decision, DecisionFuture, Hold, Prompted, Refund};

/// Work to finish before an admitted response goes out (see [`After`]).
type Finish = Pin<Box<dyn Future<Output = ()> + Send>>;

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit): first the
    /// decision, then (if admitted) the inner service.
    ///
    /// ```
    /// use axum::{body::Body, routing::get, Router};
    /// use fleetlimit::layer::ResponseFuture;
    /// use fleetlimit::{Config, RateLimitLayer};
    /// use tower::{Layer, Service};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::new(Config::builder().build()?).await?;
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
    /// is boxed.
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
            // Units the handler gives back show in the headers.
            refund: Option<Refund>,
            // Reshapes a `ChallengeRequired` the handler answers.
            on_refusal: Option<RefusalHook>,
            // What the response body keeps until it is over.
            hold: Hold,
            after: Option<After>,
        },
        // The handler answered; `After`'s work runs before the response
        // goes out.
        Finishing {
            work: Finish,
            response: Option<(S::Response, Hold, Option<Box<Rejection>>)>,
        },
        // Built at once: not larger than `Serving`, so not boxed.
        Rejected {
            response: Option<Response<Bytes>>,
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

    /// A refusal decided already: its answer.
    #[inline]
    pub(crate) fn rejected(r: Rejection) -> Self {
        Self {
            state: State::Rejected {
                response: Some(r.into_response()),
            },
        }
    }

    /// An admission: calls the service now, giving the handler its refund
    /// handle and extensions.
    // Inlined, its parts taken one by one: the request, the admission and
    // the future are large, and each move copied them.
    #[inline]
    pub(crate) fn admitted(service: &mut S, mut req: Request<ReqBody>, a: Admitted) -> Self {
        let Admitted {
            headers,
            refund,
            extensions,
            hold,
            after,
            on_refusal,
        } = a;
        let mut kept = None;
        if let Some(refund) = refund {
            if headers.is_some() {
                kept = Some(refund.clone());
            }
            req.extensions_mut().insert(refund);
        }
        if !extensions.is_empty() {
            req.extensions_mut().extend(extensions);
        }
        Self {
            state: State::Serving {
                future: service.call(req),
                headers,
                refund: kept,
                on_refusal,
                hold,
                after,
            },
        }
    }

    /// Not limited: the service's own answer, no headers.
    pub(crate) fn serving(future: S::Future) -> Self {
        Self {
            state: State::Serving {
                future,
                headers: None,
                refund: None,
                on_refusal: None,
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
                            self.set(Self::admitted(&mut service, req, a));
                        }
                        Decision::Reject(r) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(rejected(r)));
                        }
                    }
                }
                StateProj::Rejected { response } => {
                    // Left as it is (emptied): setting `Done` would run the
                    // state's drop glue for nothing, on every refusal.
                    let res = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(res.map(ResponseBody::full)));
                }
                StateProj::Serving {
                    future,
                    headers,
                    refund,
                    on_refusal,
                    hold,
                    after,
                } => {
                    let mut res = ready!(future.poll(cx))?;
                    // Written where they are: the state is dropped below.
                    if let Some(h) = headers {
                        if let Some(r) = refund.take() {
                            r.patch(h);
                        }
                        h.write(res.headers_mut());
                    }
                    let shaped = on_refusal.take().and_then(|hook| challenged(&res, &hook));
                    let hold = std::mem::take(hold);
                    if let Some(work) = after
                        .take()
                        .and_then(|after| after(res.status(), res.extensions()))
                    {
                        let response = Some((res, hold, shaped));
                        this.state.set(State::Finishing { work, response });
                        continue;
                    }
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(respond(res, hold, shaped)));
                }
                StateProj::Finishing { work, response } => {
                    ready!(work.as_mut().poll(cx));
                    let (res, hold, shaped) = response.take().expect("polled after completion");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(respond(res, hold, shaped)));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// The handler's response, or the refusal hook's answer in its place.
fn respond<B>(
    res: Response<B>,
    hold: Hold,
    shaped: Option<Box<Rejection>>,
) -> Response<ResponseBody<B>> {
    match shaped {
        None => res.map(|b| ResponseBody::inner(b, hold)),
        // The handler's body is dropped unsent: its response is over.
        Some(r) => rejected(*r),
    }
}

/// A [`ChallengeRequired`](crate::ChallengeRequired) the handler answered,
/// reshaped by the refusal hook: its default keeps the handler's headers
/// (the rate-limit ones among them).
fn challenged<B>(res: &Response<B>, hook: &RefusalHook) -> Option<Box<Rejection>> {
    let Prompted(c) = res.extensions().get::<Prompted>()?;
    let mut r = c.rejection();
    r.status = res.status();
    r.headers = res.headers().clone();
    Some(Box::new(r.shape(hook)))
}

fn rejected<B>(r: Rejection) -> Response<ResponseBody<B>> {
    r.into_response().map(ResponseBody::full)
}

impl<S, ReqBody> std::fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
