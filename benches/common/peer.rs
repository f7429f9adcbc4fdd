//! The Redis peer measured beside fleetlimit, shared by `benches/load/`
//! (timed) and `benches/instructions.rs` (counted): `tower-rate-limit-fred`
//! (GCRA in one Lua script) on a fred pool of its own, keyed by the
//! `x-api-key` header.

use std::time::Duration;

use axum::body::Body;
use fred::clients::Pool;
use fred::interfaces::ClientLike;
use fred::types::Builder as FredBuilder;
use fred::types::config::Config as FredConfig;
use http::{Request, Response, StatusCode};

/// The peer's layer on `redis_url`: a pool of `pool_size` whose commands
/// time out after `timeout` (fred waits forever otherwise, as the peer's
/// docs warn), a burst of `capacity` refilled one per `emission`.
pub async fn layer(
    redis_url: &str,
    pool_size: usize,
    timeout: Duration,
    capacity: u16,
    emission: Duration,
    fail_open: bool,
) -> tower_rate_limit_fred::RateLimitLayer<Pool, PeerKey> {
    let config = FredConfig::from_url(redis_url).expect("a Redis URL");
    let pool = FredBuilder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = timeout)
        .build_pool(pool_size)
        .expect("a fred pool");
    pool.init().await.expect("the peer's pool connects");
    tower_rate_limit_fred::RateLimitLayer::builder()
        .conn(pool)
        .key_resolver(PeerKey)
        .capacity(capacity)
        .emission_interval(emission)
        .fail_open(fail_open)
        .build()
}

/// The peer's key: the `x-api-key` header (401 without it), prefixed like
/// fleetlimit's keys so both write keys of about the same length.
#[derive(Clone, Copy, Debug)]
pub struct PeerKey;

impl tower_rate_limit_fred::KeyResolver for PeerKey {
    type ErrorBody = Body;

    fn key<T>(
        &self,
        req: &Request<T>,
    ) -> Result<Option<tower_rate_limit_fred::Key>, Response<Body>> {
        match req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
            Some(k) => Ok(Some(format!("peer:per-key:{{{k}}}").into())),
            None => {
                let mut res = Response::new(Body::empty());
                *res.status_mut() = StatusCode::UNAUTHORIZED;
                Err(res)
            }
        }
    }
}
