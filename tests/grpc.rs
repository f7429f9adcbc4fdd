//! Feature `grpc`: a real tonic server (the generated Health service)
//! behind `RateLimitLayer` and `GrpcRefusalLayer`, a real tonic client over
//! loopback, on a real Redis and on the in-process store.
#![cfg(feature = "grpc")]

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use fleetlimit::grpc::{ERROR_DOMAIN, GrpcRefusalLayer};
use fleetlimit::{ChallengeRequired, Config, RateLimitLayer};
use support::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Channel, Server, server::TcpIncoming};
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;
use tower::{Layer, ServiceExt};

/// One key, two requests, then one a minute: the third is refused with
/// `Retry-After: 60`.
const LIMITS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
on_missing = "reject"
capacity = 2
refill = "1/min"
"#;

/// A bare tonic server: the layers around every service, so `[default]`.
fn bare_config(redis: Option<(&RedisServer, &str)>) -> Config {
    let body =
        format!("{LIMITS}\n[default]\nlimits = [\"per-key\"]\non_redis_error = \"closed\"\n");
    match redis {
        // A deadline a busy machine meets: admitted calls must not fall to
        // the `closed` policy by accident.
        Some((server, prefix)) => support::redis_config(server, prefix, "500ms", &body),
        None => Config::from_toml_str(&body).unwrap(),
    }
}

/// Serves `Health` on a loopback port with the layers the module guide
/// shows (HTTP/1 accepted too, for the plain request); stops when the
/// test's runtime ends.
async fn serve_bare(layer: RateLimitLayer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = Server::builder()
        .accept_http1(true)
        .layer(GrpcRefusalLayer::new())
        .layer(layer)
        .add_service(health);
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
    addr
}

/// Serves an axum `Router` hosting tonic services.
async fn serve_router(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::builder().add_routes(router.into());
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
    addr
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

/// One `Health/Check` with `x-api-key: key` (none for `None`) and
/// `x-cost: cost` metadata.
async fn check(
    client: &mut HealthClient<Channel>,
    key: Option<&str>,
    cost: Option<u32>,
) -> Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, Status> {
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    if let Some(key) = key {
        req.metadata_mut().insert("x-api-key", key.parse().unwrap());
    }
    if let Some(cost) = cost {
        req.metadata_mut()
            .insert("x-cost", cost.to_string().parse().unwrap());
    }
    client.check(req).await
}

fn meta<'a>(status: &'a Status, name: &str) -> &'a str {
    status
        .metadata()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {status:?}"))
        .to_str()
        .unwrap()
}

/// The reason and domain of the status's `ErrorInfo`.
fn reason(status: &Status) -> String {
    let details = status.get_error_details();
    let info = details.error_info().expect("an ErrorInfo");
    assert_eq!(info.domain, ERROR_DOMAIN);
    info.reason.clone()
}

/// Two admitted calls (untouched, with the limiter's headers as
/// metadata), then the refusal as a gRPC status.
async fn admits_two_then_exhausted(client: &mut HealthClient<Channel>, key: &str) -> Status {
    for left in ["1", "0"] {
        let res = check(client, Some(key), None).await.expect("admitted");
        assert_eq!(
            res.get_ref().status,
            ServingStatus::Serving as i32,
            "the service answered"
        );
        assert_eq!(res.metadata().get("x-ratelimit-remaining").unwrap(), left);
        assert!(res.metadata().get("grpc-retry-pushback-ms").is_none());
    }
    let refused = check(client, Some(key), None).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(reason(&refused), "RATE_LIMIT_EXCEEDED");
    assert!(
        refused.message().contains("per-key") && refused.message().contains("retry in 60 s"),
        "the problem's detail: {:?}",
        refused.message()
    );
    // One token a minute: Retry-After 60, in every form.
    assert_eq!(meta(&refused, "retry-after"), "60");
    assert_eq!(meta(&refused, "grpc-retry-pushback-ms"), "60000");
    assert_eq!(meta(&refused, "x-ratelimit-remaining"), "0");
    assert_eq!(meta(&refused, "x-ratelimit-limit"), "2");
    let details = refused.get_error_details();
    assert_eq!(
        details.retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(60))
    );
    let info = details.error_info().unwrap();
    assert_eq!(info.metadata["limit"], "per-key");
    assert_eq!(info.metadata["http_status"], "429");
    refused
}

/// A plain HTTP/1.1 request to the same server: not gRPC, so the limiter's
/// own answer.
async fn plain_http(addr: SocketAddr, key: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /grpc.health.v1.Health/Check HTTP/1.1\r\nhost: {addr}\r\nx-api-key: {key}\r\n\
         content-length: 0\r\nconnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the server answers and closes")
        .unwrap();
    String::from_utf8(out).unwrap().to_ascii_lowercase()
}

#[tokio::test]
async fn redis_refusals_are_grpc_statuses() {
    let redis = RedisServer::start();
    let prefix = support::prefix("grpc-redis");
    let cfg = bare_config(Some((&redis, &prefix)));
    let addr = serve_bare(RateLimitLayer::new(cfg).await.unwrap()).await;
    let mut c = client(addr).await;

    admits_two_then_exhausted(&mut c, "k1").await;
    // Another key is its own bucket.
    check(&mut c, Some("k2"), None).await.expect("k2 admitted");

    // Without the key: UNAUTHENTICATED, nothing to wait for.
    let missing = check(&mut c, None, None).await.unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated, "{missing:?}");
    assert_eq!(reason(&missing), "KEY_MISSING");
    assert!(missing.message().contains("x-api-key"), "{missing:?}");
    assert!(missing.metadata().get("grpc-retry-pushback-ms").is_none());
    assert!(missing.get_error_details().retry_info().is_none());

    // The same server, a plain HTTP request for the exhausted key: the
    // limiter's 429 problem, untouched.
    let http = plain_http(addr, "k1").await;
    assert!(http.starts_with("http/1.1 429"), "{http}");
    assert!(
        http.contains("content-type: application/problem+json"),
        "{http}"
    );
    assert!(http.contains("retry-after: 60"), "{http}");
    assert!(!http.contains("grpc-status"), "{http}");
    assert!(http.contains("\"status\":429"), "{http}");

    redis.assert_every_key_expires(&prefix);

    // Redis frozen (slow): the `closed` policy's 503 → UNAVAILABLE, within
    // the deadline's bound.
    redis.freeze();
    let started = Instant::now();
    let slow = check(&mut c, Some("k3"), None).await.unwrap_err();
    redis.thaw();
    assert_eq!(slow.code(), Code::Unavailable, "{slow:?}");
    assert_eq!(reason(&slow), "LIMITER_UNAVAILABLE");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Redis gone: UNAVAILABLE with the retry information of the 503.
    redis.kill();
    let down = check(&mut c, Some("k3"), None).await.unwrap_err();
    assert_eq!(down.code(), Code::Unavailable, "{down:?}");
    assert_eq!(reason(&down), "LIMITER_UNAVAILABLE");
    let retry: u64 = meta(&down, "retry-after").parse().unwrap();
    assert!(retry >= 1);
    assert_eq!(
        meta(&down, "grpc-retry-pushback-ms"),
        (retry * 1000).to_string()
    );
    assert_eq!(
        down.get_error_details().retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(retry))
    );
    assert_eq!(
        down.get_error_details().error_info().unwrap().metadata["http_status"],
        "503"
    );
    // Not a rate-limit refusal: no limit's headers.
    assert!(down.metadata().get("x-ratelimit-remaining").is_none());

    // Restarted (empty, script cache gone): once fred has reconnected
    // (bounded wait), calls are decided by Redis again, and the mapping
    // with them: a fresh key admits exactly its capacity.
    redis.restart();
    let give_up = Instant::now() + Duration::from_secs(15);
    loop {
        match check(&mut c, Some("probe"), None).await {
            Ok(_) => break,
            Err(s) => assert_eq!(s.code(), Code::Unavailable, "{s:?}"),
        }
        assert!(Instant::now() < give_up, "Redis never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admits_two_then_exhausted(&mut c, "fresh").await;
    redis.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn in_process_refusals_are_grpc_statuses() {
    let layer = RateLimitLayer::new(bare_config(None)).await.unwrap();
    let addr = serve_bare(layer).await;
    let mut c = client(addr).await;
    admits_two_then_exhausted(&mut c, "k1").await;
    // Still refused (no token back for a minute), and the other key is not.
    assert_eq!(
        check(&mut c, Some("k1"), None).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    check(&mut c, Some("k2"), None).await.expect("k2 admitted");
    let http = plain_http(addr, "k1").await;
    assert!(http.starts_with("http/1.1 429"), "{http}");
}

/// tonic services hosted in an axum `Router`: `MatchedPath` is the
/// service's route, so a route entry (and its cost function) applies.
#[tokio::test]
async fn router_hosted_services_get_route_policies() {
    let cfg = Config::from_toml_str(&format!(
        "{LIMITS}\n[[routes]]\npath = \"/grpc.health.v1.Health/{{*rest}}\"\nlimits = [\"per-key\"]\n"
    ))
    .unwrap();
    let layer = RateLimitLayer::new(cfg)
        .cost_fn("/grpc.health.v1.Health/{*rest}", |req| {
            req.headers()
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .await
        .unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let router = tonic::service::Routes::new(health)
        .into_axum_router()
        .layer(layer)
        .layer(GrpcRefusalLayer::new());
    let addr = serve_router(router).await;
    let mut c = client(addr).await;

    // A cost no bucket of capacity 2 can hold: RESOURCE_EXHAUSTED, told
    // never to retry, and nothing charged.
    let costly = check(&mut c, Some("k1"), Some(3)).await.unwrap_err();
    assert_eq!(costly.code(), Code::ResourceExhausted, "{costly:?}");
    assert_eq!(reason(&costly), "COST_EXCEEDS_CAPACITY");
    assert_eq!(meta(&costly, "grpc-retry-pushback-ms"), "-1");
    let details = costly.get_error_details();
    assert!(details.retry_info().is_none());
    let quota = details.quota_failure().expect("a QuotaFailure");
    assert_eq!(quota.violations.len(), 1);
    assert_eq!(quota.violations[0].subject, "per-key");
    assert!(costly.message().contains("costs 3"), "{costly:?}");

    admits_two_then_exhausted(&mut c, "k1").await;
}

/// The service's own gRPC answers, and gRPC-Web, are never rewritten; a
/// handler's `ChallengeRequired` is UNAUTHENTICATED with its own reason.
#[tokio::test]
async fn only_the_limiters_answers_to_grpc_requests_change() {
    let svc = tower::service_fn(|req: http::Request<String>| async move {
        let res = match req.uri().path() {
            "/challenge" => ChallengeRequired::default().into_response(),
            "/large" => (
                http::StatusCode::TOO_MANY_REQUESTS,
                [
                    ("content-type", "application/problem+json"),
                    ("retry-after", "5"),
                ],
                format!("{{\"detail\":\"{}\"}}", "x".repeat(64 * 1024)),
            )
                .into_response(),
            "/grpc-error" => Status::not_found("no such thing")
                .into_http::<axum::body::Body>()
                .into_response(),
            // Not the limiter's: a 429 without a problem body.
            _ => (http::StatusCode::TOO_MANY_REQUESTS, "slow down").into_response(),
        };
        Ok::<_, std::convert::Infallible>(res)
    });
    let svc = GrpcRefusalLayer::new().layer(svc);
    let send = |path: &str, content_type: &str| {
        let req = http::Request::post(path)
            .header("content-type", content_type)
            .body(String::new())
            .unwrap();
        svc.clone().oneshot(req)
    };

    let res = send("/challenge", "application/grpc").await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/grpc");
    let status = Status::from_header_map(res.headers()).unwrap();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(reason(&status), "CHALLENGE_REQUIRED");
    assert_eq!(
        status.message(),
        "too many failed attempts; complete the challenge and retry"
    );

    // gRPC-Web and plain requests: the problem as it was.
    for ct in ["application/grpc-web", "application/json"] {
        let res = send("/challenge", ct).await.unwrap();
        assert_eq!(res.status(), 401, "{ct}");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
    }
    let res = send("/grpc-error", "application/grpc").await.unwrap();
    assert_eq!(
        Status::from_header_map(res.headers()).unwrap().code(),
        Code::NotFound
    );
    let res = send("/other", "application/grpc").await.unwrap();
    assert_eq!(res.status(), 429);
    assert!(res.headers().get("grpc-status").is_none());

    // A problem body too large to be one of the limiter's is not read: the
    // status alone names the refusal.
    let res = send("/large", "application/grpc").await.unwrap();
    let status = Status::from_header_map(res.headers()).unwrap();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "Too Many Requests");
    assert_eq!(res.headers()["grpc-retry-pushback-ms"], "5000");
}

/// `[shedding]`: a shed gRPC request is UNAVAILABLE (`OVERLOADED`), with
/// the shedder's Retry-After as pushback.
#[tokio::test]
async fn shed_requests_are_unavailable() {
    let cfg = Config::from_toml_str(&format!(
        "{LIMITS}\n[shedding]\nretry_after = \"3s\"\n\n[default]\nlimits = [\"per-key\"]\n"
    ))
    .unwrap();
    let layer = RateLimitLayer::new(cfg)
        // Saturated: every normal-priority request is shed.
        .load_signal(|| 2.0)
        .await
        .unwrap();
    let addr = serve_bare(layer).await;
    let mut c = client(addr).await;
    let shed = check(&mut c, Some("k1"), None).await.unwrap_err();
    assert_eq!(shed.code(), Code::Unavailable, "{shed:?}");
    assert_eq!(reason(&shed), "OVERLOADED");
    assert_eq!(meta(&shed, "grpc-retry-pushback-ms"), "3000");
    assert_eq!(
        shed.get_error_details().retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(3))
    );
    assert!(shed.message().contains("overloaded"), "{shed:?}");
}

/// An IP-keyed limit on a bare tonic server, with the peer address copied
/// from tonic's `TcpConnectInfo` as the module guide shows: counted per
/// client address (loopback here), refused with RESOURCE_EXHAUSTED.
#[tokio::test]
async fn ip_keyed_limits_on_a_bare_tonic_server() {
    use tonic::transport::server::TcpConnectInfo;
    let cfg = Config::from_toml_str(
        "[limits.per-ip]\nkey = \"ip\"\ncapacity = 1\nrefill = \"1/min\"\n\n[default]\nlimits = [\"per-ip\"]\n",
    )
    .unwrap();
    let peer_addr =
        tower::util::MapRequestLayer::new(|mut req: http::Request<tonic::body::Body>| {
            let peer = req
                .extensions()
                .get::<TcpConnectInfo>()
                .and_then(TcpConnectInfo::remote_addr);
            if let Some(addr) = peer {
                req.extensions_mut().insert::<SocketAddr>(addr);
            }
            req
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = Server::builder()
        .layer(GrpcRefusalLayer::new())
        .layer(peer_addr)
        .layer(RateLimitLayer::new(cfg).await.unwrap())
        .add_service(health);
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
    let mut c = client(addr).await;
    let first = check(&mut c, None, None).await.expect("admitted");
    assert_eq!(first.metadata().get("x-ratelimit-remaining").unwrap(), "0");
    let refused = check(&mut c, None, None).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(reason(&refused), "RATE_LIMIT_EXCEEDED");
}
