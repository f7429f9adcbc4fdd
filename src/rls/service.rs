//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: each
//! descriptor asked of the running limiter (`descriptors.rs`), decided
//! by the layer's own steps, answered (`answer.rs`).

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use super::answer::{Answer, answer};
use super::descriptors::{self, Asked};
use crate::pipeline::Decided;
use crate::reload::Live;

/// The service: the layer's running limiter, reloaded as the layer's is.
pub(crate) struct RateLimiter {
    pub(super) live: Arc<Live>,
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let r = request.into_inner();
        descriptors::check(&r)?;
        // One configuration for the whole call, as a layer's request.
        let limiter = Arc::clone(&*self.live.load());
        // Every descriptor made ready before any is charged: a bad one
        // refuses the call with nothing spent.
        let asked = (r.descriptors.iter())
            .map(|d| descriptors::ask(limiter.descriptor_rules(), &r.domain, d, r.hits_addend))
            .collect::<Result<Vec<_>, _>>()?;
        let mut statuses = Vec::with_capacity(asked.len());
        let mut shown: Option<(bool, Answer)> = None;
        for a in asked {
            let mut answer = match a {
                None => Answer::unlimited(),
                Some(Asked {
                    rule,
                    of,
                    req,
                    cost,
                }) => match limiter.handle_descriptor(rule, &req, cost) {
                    Decided::Unlimited => Answer::unlimited(),
                    Decided::Now(d) => answer(of, cost, d)?,
                    Decided::Later(f) => answer(of, cost, f.await)?,
                },
            };
            let over = answer.status.code == Code::OverLimit as i32;
            statuses.push(std::mem::take(&mut answer.status));
            if heeded(over, answer.left, shown.as_ref()) {
                shown = Some((over, answer));
            }
        }
        Ok(Response::new(respond(statuses, shown)))
    }
}

/// Whether a client must heed an answer (`over` its limit, `left`
/// requests left) rather than `shown`, the one shown so far: the first
/// descriptor over its limit, else the first with the fewest left.
fn heeded(over: bool, left: Option<u64>, shown: Option<&(bool, Answer)>) -> bool {
    match shown {
        None => over || left.is_some(),
        Some((true, _)) => false,
        Some((false, s)) => over || matches!((left, s.left), (Some(l), Some(m)) if l < m),
    }
}

/// The call's answer: `OVER_LIMIT` when the descriptor shown is (the
/// first over its limit is), and its header fields.
fn respond(statuses: Vec<DescriptorStatus>, shown: Option<(bool, Answer)>) -> RateLimitResponse {
    let (over, fields) = shown.map_or((false, Vec::new()), |(over, a)| (over, a.fields));
    let code = if over { Code::OverLimit } else { Code::Ok };
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        request_headers_to_add: fields.clone(),
        response_headers_to_add: fields,
        ..RateLimitResponse::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The descriptor whose fields are shown, of answers (over its limit,
    /// requests left) in order.
    fn shown(answers: &[(bool, Option<u64>)]) -> Option<usize> {
        let mut shown: Option<(bool, Answer)> = None;
        let mut at = None;
        for (i, &(over, left)) in answers.iter().enumerate() {
            if heeded(over, left, shown.as_ref()) {
                let mut a = Answer::unlimited();
                a.left = left;
                shown = Some((over, a));
                at = Some(i);
            }
        }
        at
    }

    #[test]
    fn the_first_over_its_limit_is_shown_else_the_first_with_fewest_left() {
        assert_eq!(shown(&[(false, None), (false, None)]), None);
        assert_eq!(
            shown(&[(false, Some(5)), (false, Some(2)), (false, Some(2))]),
            Some(1)
        );
        assert_eq!(
            shown(&[(false, Some(0)), (true, Some(0)), (true, Some(0))]),
            Some(1)
        );
        assert_eq!(shown(&[(true, Some(3)), (false, Some(0))]), Some(0));
        assert_eq!(shown(&[(false, None), (false, Some(9))]), Some(1));
    }
}
