//! Instructions per request through the layer, counted rather than timed:
//! a loop of `oneshot` requests on an axum `Router` (route `/`, handler
//! `"ok"`), keyed by `header:x-api-key`, in one of these modes:
//!
//! - `bare`: without the layer (the baseline);
//! - `layer`: `RateLimitLayer::new` in process, one token-bucket limit so large
//!   that every request is admitted, 10,000 keys cycled;
//! - `refused`: the same on the in-process store with a burst of 1 refilled
//!   1/h, 50 keys cycled: every request after each key's first is refused
//!   (the abuse path);
//! - `remembered`: `RateLimitLayer::with_store` on a store that refuses
//!   everything for an hour, 50 keys cycled: after each key's first
//!   refusal, the refused-key cache answers (the abuse path on Redis,
//!   without Redis);
//! - `two`, `shadow`, `refund`, `failures`, `lease`: the other route
//!   shapes on the in-process store, every request admitted, 10,000 keys
//!   cycled (`lease`: 10 keys, each hot): two huge limits; a huge limit
//!   beside a huge `mode = "shadow"` one; `refund = true` (the handle
//!   carried, not used); `count = "failures"` (the handler answers 200, so
//!   each success is given back); `lease_batch = 100`, `lease_above = 1`;
//! - `governor`: the peer of `benches/hot_path.rs`, a minimal middleware
//!   around governor's keyed limiter (`benches/common/governor_layer.rs`)
//!   with the same huge limit, 10,000 keys cycled;
//! - `redis` and `peer` (feature `redis`): the Redis path, client side,
//!   against a `redis-server` this binary starts on a free loopback port
//!   (`FLEETLIMIT_REDIS_SERVER` to run another, e.g. valkey-server):
//!   `RateLimitLayer::new` with the same huge token bucket, and
//!   `tower-rate-limit-fred` (GCRA, its fred pool of the same size), 10,000
//!   keys cycled, one request at a time; the deadline is 10 s, since valgrind
//!   runs the client some fifty times slower than Redis answers. Only this
//!   process is counted (the kernel's and Redis's work are not);
//! - `global` (feature `redis`): `redis` with the limit global
//!   (`scope = "global"`, `[regions]` of two, this one on that Redis, the
//!   other's link unreachable, interval 60 s): a region's share looked up
//!   and its demand counted per request, beside the same script call;
//! - `echo`, `echo-bare` and `rls` (feature `rls`): `ShouldRateLimit`
//!   calls over loopback from envoy-types' tonic client, one at a time, to
//!   a tonic server in this process: `echo`, a service answering a clone
//!   of one prebuilt answer of the same shape and sizes as `rls`'s (a
//!   status with the limit, what is left and the reset; three header
//!   fields for the response and the request); `echo-bare`, one answering
//!   `OK` and an empty status; `rls`, `RateLimitLayer::rls_service` on the
//!   in-process store with the `layer` mode's huge limit as a
//!   `[[descriptors]]` entry keyed by the descriptor's `api_key`, 10,000
//!   keys cycled. `rls − echo` is a decision through the server (the
//!   adapter and the layer's steps; the protocol's own work on the answer
//!   is in both), to compare with `layer − bare`. Counted as the Redis modes are (the whole
//!   process: client and server are tasks of one runtime).
//!
//! Run under valgrind, the count does not depend on what else the machine
//! is doing:
//!
//! ```sh
//! cargo bench --bench instructions --no-run      # prints the binary's path
//! B=target/release/deps/instructions-<hash>
//! # in-process modes: the request loop alone
//! for mode in bare layer governor refused remembered two shadow refund failures lease; do for n in 10000 30000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='instructions::requests*' $B $mode $n 2>&1 | grep Collected
//! done; done
//! # Redis and gRPC modes: the whole process (its other threads work too)
//! for mode in redis peer global echo echo-bare rls; do for n in 10000 30000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null $B $mode $n 2>&1 | grep Collected
//! done; done
//! ```
//!
//! (instructions at 30,000 − at 10,000) ÷ 20,000 is one request's, set-up
//! and first inserts cancelled; `layer − bare` is the layer's, to compare
//! with `governor − bare`. Counting the loop alone leaves out set-up work
//! whose cost differs from one process to the next (quanta's clock
//! calibration, in `governor` mode: ±6 million instructions a process,
//! ±300 a request in the difference). Only public
//! API that has not changed in a long time is used, so this file can be
//! copied into an older checkout to compare (`refused` and `remembered`
//! need `with_store` and the public `store` types). `cargo bench --bench
//! instructions` alone just runs the loop once.

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use fleetlimit::store::{Check, LimitState, Outcome, Store, StoreFuture};
use fleetlimit::{Config, RateLimitLayer};
use http::{Request, StatusCode};
use std::num::NonZeroU32;
use std::sync::Arc;
use tower::ServiceExt;

#[allow(dead_code)]
#[path = "common/governor_layer.rs"]
mod governor_layer;

#[cfg(feature = "redis")]
#[path = "common/peer.rs"]
mod peer;
#[cfg(feature = "redis")]
#[allow(dead_code)]
#[path = "load/redis.rs"]
mod redis;

/// A store that refuses every request for an hour.
#[derive(Debug)]
struct Refusing;

impl Store for Refusing {
    fn check(&self, check: &Check) -> StoreFuture {
        let refused = LimitState {
            enough: false,
            remaining: 0.0,
            wait: 3600.0,
            reset: 3600.0,
            capacity: 1.0,
        };
        let limits = vec![refused; check.buckets.len()];
        Box::pin(async move {
            Ok(Outcome {
                allowed: false,
                limits,
            })
        })
    }
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mode = args.next().unwrap_or_else(|| "layer".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let limit = |numbers: &str| {
        Config::from_toml_str(&format!(
            "[limits.k]\nkey = \"header:x-api-key\"\n{numbers}\n[default]\nlimits = [\"k\"]\n"
        ))
        .expect("a valid configuration")
    };
    let huge = "capacity = 1000000000\nrefill = \"1000000/s\"";
    // Two limits `k` and `k2` (the second's extra lines in `second`), and
    // the default route's settings in `route`.
    let shape = |second: &str, route: &str| {
        Config::from_toml_str(&format!(
            "[limits.k]\nkey = \"header:x-api-key\"\n{huge}\n\
             [limits.k2]\nkey = \"header:x-api-key\"\n{huge}\n{second}\n\
             [default]\nlimits = [\"k\", \"k2\"]\n{route}\n"
        ))
        .expect("a valid configuration")
    };
    let one = |route: &str| {
        Config::from_toml_str(&format!(
            "[limits.k]\nkey = \"header:x-api-key\"\n{huge}\n[default]\nlimits = [\"k\"]\n{route}\n"
        ))
        .expect("a valid configuration")
    };
    let tight = "capacity = 1\nrefill = \"1/h\"";
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    #[cfg(feature = "rls")]
    if matches!(mode.as_str(), "echo" | "echo-bare" | "rls") {
        rt.block_on(over_grpc(&mode, huge, n));
        return;
    }
    #[cfg(feature = "redis")]
    let server =
        matches!(mode.as_str(), "redis" | "peer" | "global").then(redis::RedisServer::start);
    rt.block_on(async {
        let mut app = Router::new().route("/", get(|| async { "ok" }));
        // After the loop: what says each request was decided by Redis.
        #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
        let mut decided_by_redis: Option<Box<dyn Fn()>> = None;
        let (keys, expect) = match mode.as_str() {
            "bare" => (10_000, StatusCode::OK),
            "layer" => {
                app = app.layer(RateLimitLayer::new(limit(huge)).await.expect("the layer"));
                (10_000, StatusCode::OK)
            }
            "governor" => {
                let per_second = NonZeroU32::new(1_000_000_000).expect("non-zero");
                let quota = governor::Quota::per_second(per_second);
                app = app.layer(governor_layer::GovernorLayer::new(quota));
                (10_000, StatusCode::OK)
            }
            "refused" => {
                app = app.layer(RateLimitLayer::new(limit(tight)).await.expect("the layer"));
                (50, StatusCode::TOO_MANY_REQUESTS)
            }
            "remembered" => {
                app = app.layer(
                    RateLimitLayer::with_store(limit(tight), Arc::new(Refusing))
                        .await
                        .expect("the layer"),
                );
                (50, StatusCode::TOO_MANY_REQUESTS)
            }
            "two" => {
                app = app.layer(RateLimitLayer::new(shape("", "")).await.expect("the layer"));
                (10_000, StatusCode::OK)
            }
            "shadow" => {
                app = app.layer(
                    RateLimitLayer::new(shape("mode = \"shadow\"", ""))
                        .await
                        .expect("the layer"),
                );
                (10_000, StatusCode::OK)
            }
            "refund" => {
                app = app.layer(
                    RateLimitLayer::new(one("refund = true"))
                        .await
                        .expect("the layer"),
                );
                (10_000, StatusCode::OK)
            }
            "failures" => {
                let cfg = limit(&format!("{huge}\ncount = \"failures\""));
                app = app.layer(RateLimitLayer::new(cfg).await.expect("the layer"));
                (10_000, StatusCode::OK)
            }
            "lease" => {
                let cfg = limit(&format!("{huge}\nlease_batch = 100\nlease_above = 1"));
                app = app.layer(RateLimitLayer::new(cfg).await.expect("the layer"));
                (10, StatusCode::OK)
            }
            #[cfg(feature = "redis")]
            "redis" | "global" => {
                let port = server.as_ref().map(|s| s.port).unwrap_or_default();
                let global = if mode == "global" {
                    format!(
                        "scope = \"global\"\n[regions]\nthis = \"a\"\ninterval = \"60s\"\n\
                         [regions.exchange]\na = \"redis://127.0.0.1:{port}\"\n\
                         b = \"redis://127.0.0.1:1\"\n"
                    )
                } else {
                    String::new()
                };
                // A share not known would be a 503, not a 200 unlimited.
                let closed = if mode == "global" {
                    "on_redis_error = \"closed\"\n"
                } else {
                    ""
                };
                let cfg = Config::from_toml_str(&format!(
                    "[redis]\nurl = \"redis://127.0.0.1:{port}\"\npool_size = {POOL}\n\
                     deadline = \"10s\"\n[limits.k]\nkey = \"header:x-api-key\"\n{huge}\n\
                     {global}[default]\nlimits = [\"k\"]\n{closed}"
                ))
                .expect("a valid configuration");
                let layer = RateLimitLayer::new(cfg).await.expect("the Redis layer");
                let probe = layer.clone();
                decided_by_redis = Some(Box::new(move || {
                    let b = probe.stats();
                    let failures = b.breaker_failures().expect("a breaker in front of Redis");
                    assert_eq!(
                        (failures, b.breaker_short_circuited().unwrap()),
                        (0, 0),
                        "{b:?}"
                    );
                }));
                app = app.layer(layer);
                (10_000, StatusCode::OK)
            }
            #[cfg(feature = "redis")]
            "peer" => {
                let port = server.as_ref().map(|s| s.port).unwrap_or_default();
                let url = format!("redis://127.0.0.1:{port}");
                let timeout = std::time::Duration::from_secs(10);
                let emission = std::time::Duration::from_millis(1);
                // Fail closed: a request Redis did not decide is not
                // counted as one it did.
                let layer = peer::layer(&url, POOL, timeout, u16::MAX, emission, false).await;
                app = app.layer(layer);
                (10_000, StatusCode::OK)
            }
            other => panic!(
                "unknown mode {other:?}: bare, layer, governor, refused, remembered, \
                 two, shadow, refund, failures, lease, redis, peer, global, echo, echo-bare or rls"
            ),
        };
        let keys: Vec<String> = (0..keys).map(|i| format!("key-{i}")).collect();
        // Boxed, so its poll stays a function of its own for callgrind.
        let run: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> =
            Box::pin(requests(app, keys, n, expect));
        run.await;
        if let Some(check) = decided_by_redis {
            check();
        }
    });
    // Every key has its bucket in Redis: it decided them. (The peer's
    // buckets expire within a millisecond; it fails closed instead.)
    #[cfg(feature = "redis")]
    if let Some(server) = server
        .as_ref()
        .filter(|_| mode == "redis" || mode == "global")
    {
        let keys = match server.cmd(&["DBSIZE"]) {
            Ok(redis::Reply::Int(n)) => n,
            other => panic!("DBSIZE: {other:?}"),
        };
        assert!(keys >= 10_000.min(n as i64), "{keys} keys in Redis");
    }
}

/// The request loop: `n` requests to `app`, keys cycled, each answered
/// `expect` (but each key's first, in the refusing modes). A function of its
/// own (its future is boxed, so its poll is not inlined) so that callgrind
/// can count it alone, `--toggle-collect='instructions::requests*'`,
/// leaving out set-up work that differs between processes (quanta's clock
/// calibration, in `governor` mode). In-process modes only: it counts this
/// thread alone, and the Redis modes work on others too.
async fn requests(app: Router, keys: Vec<String>, n: usize, expect: StatusCode) {
    for i in 0..n {
        let req = Request::get("/")
            .header("x-api-key", &keys[i % keys.len()])
            .body(Body::empty())
            .expect("a request");
        let res = app.clone().oneshot(req).await.expect("a response");
        // Each key's first request is admitted (by the in-process store
        // in the refusing modes).
        if i >= keys.len() || expect == StatusCode::OK {
            assert_eq!(res.status(), expect);
        }
        // The body is read, as a server would send it.
        let body = axum::body::to_bytes(res.into_body(), usize::MAX).await;
        std::hint::black_box(body.expect("a body"));
    }
}

/// The Redis modes' pool size (fleetlimit's and the peer's).
#[cfg(feature = "redis")]
const POOL: usize = 4;

/// A `ShouldRateLimit` that decides nothing: it answers a clone of one
/// prebuilt response, whatever is asked.
#[cfg(feature = "rls")]
struct Echo(envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse);

#[cfg(feature = "rls")]
#[tonic::async_trait]
impl envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService
    for Echo
{
    async fn should_rate_limit(
        &self,
        _: tonic::Request<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest>,
    ) -> Result<
        tonic::Response<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse>,
        tonic::Status,
    > {
        Ok(tonic::Response::new(self.0.clone()))
    }
}

/// What `Echo` answers to one descriptor: `OK` and one status, bare
/// (`full` false), or (`full`) of the same shape and sizes as the `rls`
/// mode's answer: the limit, what is left, the reset, and the three
/// `X-RateLimit-*` fields as response and request headers.
#[cfg(feature = "rls")]
fn echoed(full: bool) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse {
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        Code, DescriptorStatus, RateLimit,
    };
    use envoy_types::pb::google::protobuf::Duration;
    let mut status = DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    };
    let mut headers = Vec::new();
    if full {
        status.current_limit = Some(RateLimit {
            name: "k".into(),
            requests_per_unit: 1_000_000,
            unit: Unit::Second as i32,
        });
        status.limit_remaining = 999_999_999;
        status.duration_until_reset = Some(Duration {
            seconds: 1,
            nanos: 0,
        });
        let field = |key: &str, value: &str| HeaderValue {
            key: key.into(),
            value: value.into(),
            ..HeaderValue::default()
        };
        headers = vec![
            field("x-ratelimit-limit", "1000000000"),
            field("x-ratelimit-remaining", "999999999"),
            field("x-ratelimit-reset", "1"),
        ];
    }
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![status],
        response_headers_to_add: headers.clone(),
        request_headers_to_add: headers,
        ..RateLimitResponse::default()
    }
}

/// `n` calls over loopback to `Echo` (`echo`: the full answer;
/// `echo-bare`: the bare one), or (`rls`) to the layer's service with the
/// limit `numbers` on each descriptor's `api_key`, keys cycled.
#[cfg(feature = "rls")]
async fn over_grpc(mode: &str, numbers: &str, n: usize) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
    use tonic::transport::Server;
    use tonic::transport::server::TcpIncoming;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    let incoming = TcpIncoming::from(listener);
    if mode == "rls" {
        let cfg = Config::from_toml_str(&format!(
            "[limits.k]\nkey = \"header:x-api-key\"\n{numbers}\n[[descriptors]]\n\
             domain = \"edge\"\nentries = [{{ key = \"api_key\", as = \"header:x-api-key\" }}]\n\
             limits = [\"k\"]\n"
        ))
        .expect("a valid configuration");
        let layer = RateLimitLayer::new(cfg).await.expect("the layer");
        let server = Server::builder().add_service(layer.rls_service());
        tokio::spawn(server.serve_with_incoming(incoming));
    } else {
        let echo = RateLimitServiceServer::new(Echo(echoed(mode == "echo")));
        let server = Server::builder().add_service(echo);
        tokio::spawn(server.serve_with_incoming(incoming));
    }
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connected");
    let expected = echoed(mode != "echo-bare");
    let keys: Vec<String> = (0..10_000).map(|i| format!("key-{i}")).collect();
    for i in 0..n {
        let req = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "api_key".into(),
                    value: keys[i % keys.len()].clone(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        };
        let res = client.should_rate_limit(req).await.expect("an answer");
        let res = res.into_inner();
        // `rls` answers what `echo` does: the same shape and sizes.
        assert_eq!(res, expected);
    }
}
