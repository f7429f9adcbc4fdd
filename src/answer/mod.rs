//! What clients see, and nothing of how it was decided: `X-RateLimit-*` and/or `RateLimit-Policy` /
//! `RateLimit` (`[headers] style`), `Retry-After`, and problem bodies.
//!
//! Every count a client reads is in requests of the route's cost (`cost`
//! units each; one slot for a concurrency limit), rounded down: a limit
//! with 9 units left on a route of cost 2 has 4 requests left. So a
//! response that says `Remaining: N` is followed by N admitted requests of
//! that route, unless other traffic spends them first.
//!
//! Legacy fields, of the limit that refuses first ([`RateHeaders`]): on
//! admission the one with the fewest whole requests left, on refusal the
//! refusing one that makes the client wait longest:
//! - `X-RateLimit-Limit`: the requests a full bucket (or window) holds;
//! - `X-RateLimit-Remaining`: whole requests left;
//! - `X-RateLimit-Reset`: seconds until the bucket is full again, rounded up
//!   (a delay, not a timestamp: clients need no synchronised clock);
//! - `Retry-After`: on every 429 and 503, whole seconds, at least 1.
//!
//! IETF fields (draft-ietf-httpapi-ratelimit-headers), one item per limit
//! of the route, in the same unit (the draft's default quota unit, the
//! request): `q` and `w` in `RateLimit-Policy`, `r` and `t` in `RateLimit`
//! (see docs/algorithms.md for the mapping of each algorithm). A client
//! reading the smallest `r` reads what `X-RateLimit-Remaining` says.
//! A `local` decision writes the policy only: no remaining it cannot know.
//!
//! Refusals (`429`), missing keys (`401`, with `WWW-Authenticate`), costs
//! no limit can hold (`413`) and an undecidable request (`503`) carry an
//! `application/problem+json` body (RFC 9457) naming the limit, its `type`
//! one of [`RefusalReason::problem_type`]; the application's `on_refusal`
//! hook may reshape any of them.

//!
//! - `headers.rs`: the header names and [`HeaderStyle`];
//! - `rate.rs`: [`RateHeaders`], which limit a decision reports, in what
//!   numbers;
//! - `problem.rs`: problem bodies (RFC 9457), a limit's written once;
//! - `kept.rs`: a `429`'s headers and body, kept per thread;
//! - `rejection.rs`: [`Rejection`], and the refusal hook reshaping it;
//! - `refusal.rs`: [`Refusal`] and [`RefusalReason`], what the hook is told;
//! - `refusals.rs`: each refusal the layer answers, with its log line.

pub mod headers;
mod kept;
mod problem;
mod rate;
mod refusal;
mod refusals;
mod rejection;

pub(crate) use self::headers::HeaderStyle;
pub(crate) use self::problem::{RefusalBodies, decimal, json_str};
pub(crate) use self::rate::*;
pub(crate) use self::refusal::RefusalHook;
pub use self::refusal::{Refusal, RefusalReason};
pub(crate) use self::refusals::*;
pub(crate) use self::rejection::Rejection;
