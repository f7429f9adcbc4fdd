//! Plan → protocol: a descriptor's [`Decision`] as Envoy reads it, one
//! `DescriptorStatus` (its code, the reported limit, what is left, when
//! it is full again) and the rate-limit header fields the layer would
//! write for it. A failure the rule's policy does not absorb is a gRPC
//! error for the whole call, so Envoy's `failure_mode_deny` decides.

use envoy_types::pb::envoy::config::core::v3::HeaderValue as Field;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use http::header::RETRY_AFTER;
use http::{HeaderName, HeaderValue};
use tonic::Status;

use crate::RefusalReason;
use crate::answer::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::answer::{Fields, Item, whole_secs};
use crate::config::DescriptorRule;
use crate::pipeline::Decision;

/// One descriptor's answer: its status, and the header fields the layer
/// would write for it, as Envoy's.
pub(super) struct Answer {
    pub(super) status: DescriptorStatus,
    pub(super) fields: Vec<Field>,
    /// Whole requests left of the reported limit (`None`: not known).
    pub(super) left: Option<u64>,
}

impl Answer {
    /// `OK` with no limit: no rule, or nothing to count.
    pub(super) fn unlimited() -> Self {
        Self {
            status: DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            },
            fields: Vec::new(),
            left: None,
        }
    }
}

/// The answer to `decision` of a descriptor of `rule` at `cost` (`None`:
/// the rule's own).
pub(super) fn answer(
    rule: &DescriptorRule,
    cost: Option<u32>,
    decision: Decision,
) -> Result<Answer, Status> {
    let cost = f64::from(cost.unwrap_or(rule.policy.cost).max(1));
    match decision {
        Decision::Admit(a) => {
            let Some(h) = a.headers else {
                // Admitted with nothing counted (`open` while the store
                // fails): no numbers to report.
                return Ok(Answer::unlimited());
            };
            // At most the five fields of both styles.
            let mut fields = Vec::with_capacity(5);
            h.write(&mut fields);
            let item = h.reported();
            let left = h.remaining();
            let reset = item.and_then(|it| it.state).map(|(_, t)| whole_secs(t));
            Ok(Answer {
                status: status(Code::Ok, item, left, reset),
                fields,
                left,
            })
        }
        Decision::Reject(r) => match r.reason {
            RefusalReason::LimitExceeded | RefusalReason::CostTooHigh => {
                let limit = (r.limit.as_ref())
                    .and_then(|name| rule.policy.limits.iter().find(|l| l.name == *name));
                let item = limit.map(|l| Item::new(&l.name, &l.rule, false, cost));
                let left = Some(r.remaining.unwrap_or(0));
                Ok(Answer {
                    status: status(Code::OverLimit, item.as_ref(), left, r.retry),
                    fields: rate_fields(&r.headers),
                    left,
                })
            }
            RefusalReason::Unavailable | RefusalReason::Overloaded => {
                let mut s = Status::unavailable(format!(
                    "the limiter cannot decide descriptor {}: its store failed and \
                     on_redis_error is \"closed\" (or the service sheds load)",
                    rule.describe()
                ));
                if let Some(secs) = r.retry {
                    s.metadata_mut().insert("retry-after", secs.into());
                }
                Err(s)
            }
            // Not reachable through a checked rule (each limit's key is
            // provided); refused rather than guessed.
            _ => Err(Status::invalid_argument(format!(
                "descriptor {}: its key cannot be read ({})",
                rule.describe(),
                r.reason.problem_type()
            ))),
        },
    }
}

/// A descriptor's status: `item`, the limit reported, as Envoy's
/// `current_limit`; `left` and `reset` (whole seconds) when known.
fn status(
    code: Code,
    item: Option<&Item>,
    left: Option<u64>,
    reset: Option<u64>,
) -> DescriptorStatus {
    let secs = |s: u64| envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(s).unwrap_or(i64::MAX),
        nanos: 0,
    };
    DescriptorStatus {
        code: code as i32,
        current_limit: item.map(current_limit),
        limit_remaining: left.map_or(0, |l| u32::try_from(l).unwrap_or(u32::MAX)),
        duration_until_reset: reset.map(secs),
        ..DescriptorStatus::default()
    }
}

/// A limit as Envoy's `RateLimit`: its requests per second, minute, hour
/// or day, the first unit in which that is a whole number (a token
/// bucket's refill, a window's count); a concurrency limit's slots with
/// no unit.
fn current_limit(it: &Item) -> RateLimit {
    let q = it.quota_requests();
    let (per_unit, unit) = match it.window {
        None => (q, Unit::Unknown),
        Some(w) => {
            let per_sec = q as f64 / w;
            let units = [
                (1.0, Unit::Second),
                (60.0, Unit::Minute),
                (3600.0, Unit::Hour),
                (86_400.0, Unit::Day),
            ];
            let whole = |x: f64| x >= 1.0 && (x - x.round()).abs() < 1e-6 * x;
            let found = units.iter().find(|(u, _)| whole(per_sec * u));
            match found {
                Some((u, unit)) => ((per_sec * u).round() as u64, *unit),
                None => ((per_sec * 86_400.0).floor() as u64, Unit::Day),
            }
        }
    };
    RateLimit {
        name: it.name.to_string(),
        requests_per_unit: u32::try_from(per_unit).unwrap_or(u32::MAX),
        unit: unit as i32,
    }
}

/// A refusal's rate-limit fields and `Retry-After` (not its problem
/// body's `Content-Type`), in this order.
fn rate_fields(h: &http::HeaderMap) -> Vec<Field> {
    let names: [&HeaderName; 6] = [
        &X_RATELIMIT_LIMIT,
        &X_RATELIMIT_REMAINING,
        &X_RATELIMIT_RESET,
        &RATELIMIT_POLICY,
        &RATELIMIT,
        &RETRY_AFTER,
    ];
    let mut fields = Vec::with_capacity(names.len());
    for n in names {
        if let Some(v) = h.get(n) {
            fields.put(n, v.clone());
        }
    }
    fields
}

/// The layer's fields written straight as Envoy's (a value that is not
/// visible ASCII, which the layer never writes, left out).
impl Fields for Vec<Field> {
    fn put(&mut self, name: &HeaderName, value: HeaderValue) {
        if let Ok(v) = value.to_str() {
            self.push(Field {
                key: name.as_str().to_owned(),
                value: v.to_owned(),
                ..Field::default()
            });
        }
    }

    /// Its digits, without a header value in between.
    fn put_number(&mut self, name: &HeaderName, n: u64, _: fn(u64) -> HeaderValue) {
        self.push(Field {
            key: name.as_str().to_owned(),
            value: itoa::Buffer::new().format(n).to_owned(),
            ..Field::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::algorithm::Rule;

    fn limit_of(rule: Rule) -> RateLimit {
        current_limit(&Item::new(&Arc::from("l"), &rule, false, 1.0))
    }

    #[test]
    fn a_limit_is_said_in_the_first_unit_of_a_whole_number() {
        let bucket = |capacity, refill_per_sec| Rule::TokenBucket {
            capacity,
            refill_per_sec,
        };
        let per = |n, unit: Unit| (n, unit as i32);
        let said = |r: RateLimit| (r.requests_per_unit, r.unit);
        assert_eq!(said(limit_of(bucket(5.0, 1.0))), per(1, Unit::Second));
        assert_eq!(
            said(limit_of(bucket(8.0, 8.0 / 60.0))),
            per(8, Unit::Minute)
        );
        assert_eq!(
            said(limit_of(bucket(100.0, 100.0 / 3600.0))),
            per(100, Unit::Hour)
        );
        let window = Rule::FixedWindow {
            limit: 10.0,
            window: std::time::Duration::from_secs(86_400),
        };
        assert_eq!(said(limit_of(window)), per(10, Unit::Day));
    }
}
