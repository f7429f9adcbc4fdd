//! What a [`GrpcRefusal`](super::GrpcRefusal) call does after the inner
//! service answered: a refused gRPC request's short problem body read, and
//! the gRPC status written from it.

use std::future::{Future, poll_fn};
use std::pin::pin;

use bytes::Buf;
use http::Response;
use http_body::Body;

use super::refusal::{self, MAX_PROBLEM};

/// Frames read from a refusal's body at most: fleetlimit's are one.
const MAX_FRAMES: u8 = 16;

/// The inner service's answer, or for a refused gRPC request (`grpc`) the
/// trailers-only gRPC answer, its body empty (`B::default()`).
pub(super) async fn respond<F, B, E>(future: F, grpc: bool) -> Result<Response<B>, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body + Default,
{
    let res = future.await?;
    let refusal = match grpc {
        true => refusal::classify(res.status(), res.headers()),
        false => None,
    };
    let Some(refusal) = refusal else {
        return Ok(res);
    };
    let (parts, body) = res.into_parts();
    // fleetlimit's problem bodies are small and whole; a large or unsized
    // one is not read (the status alone then names the refusal).
    if body.size_hint().upper().is_none_or(|n| n > MAX_PROBLEM) {
        return Ok(refusal::answer(parts, refusal, None));
    }
    let mut body = pin!(body);
    let mut buf = Vec::new();
    let mut frames = 0u8;
    let whole = loop {
        match poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break true,
            Some(Err(_)) => break false,
            Some(Ok(frame)) => {
                frames += 1;
                if frames > MAX_FRAMES {
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
    let problem = whole.then_some(&buf[..]);
    Ok(refusal::answer(parts, refusal, problem))
}
