//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: each
//! descriptor asked of the running limiter (`descriptors.rs`), decided
//! by the layer's own steps, answered (`answer.rs`).

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
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
        let mut answers = Vec::with_capacity(asked.len());
        for a in asked {
            let Some(Asked {
                rule,
                of,
                req,
                cost,
            }) = a
            else {
                answers.push(Answer::unlimited());
                continue;
            };
            let decision = match limiter.handle_descriptor(rule, &req, cost) {
                Decided::Unlimited => {
                    answers.push(Answer::unlimited());
                    continue;
                }
                Decided::Now(d) => d,
                Decided::Later(f) => f.await,
            };
            answers.push(answer(of, cost, decision)?);
        }
        Ok(Response::new(respond(answers)))
    }
}

/// The call's answer: `OVER_LIMIT` when a descriptor is, and the header
/// fields of the descriptor a client must heed: the first one over its
/// limit, else the one with the fewest requests left.
fn respond(mut answers: Vec<Answer>) -> RateLimitResponse {
    let over = answers.iter().position(Answer::over_limit);
    let shown = over.or_else(|| {
        let known = answers.iter().enumerate();
        let known = known.filter_map(|(i, a)| Some((a.left?, i)));
        known.min().map(|(_, i)| i)
    });
    let fields = shown
        .map(|i| std::mem::take(&mut answers[i].fields))
        .unwrap_or_default();
    let code = if over.is_some() {
        Code::OverLimit
    } else {
        Code::Ok
    };
    RateLimitResponse {
        overall_code: code as i32,
        statuses: answers.into_iter().map(|a| a.status).collect(),
        request_headers_to_add: fields.clone(),
        response_headers_to_add: fields,
        ..RateLimitResponse::default()
    }
}
