//! Feature `rls`: `fleetlimit rls` processes answering real
//! `ShouldRateLimit` calls (envoy-types' tonic client) on a real Redis:
//! exact over two instances, the same key as the layer, each failure
//! policy with Redis stopped, and bad input.
#![cfg(feature = "rls")]

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http::StatusCode;
use support::RedisServer;
use tonic::transport::Channel;

/// `fleetlimit rls` on a free loopback port, killed when dropped.
struct Rls {
    child: Child,
    client: RateLimitServiceClient<Channel>,
}

impl Rls {
    async fn start(config: &PathBuf) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fleetlimit"))
            .args(["rls", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let out = child.stdout.take().unwrap();
        BufReader::new(out).read_line(&mut line).unwrap();
        let addr = line.trim().rsplit(' ').next().unwrap().to_owned();
        assert!(addr.starts_with("127.0.0.1:"), "{line:?}");
        let client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        Self { child, client }
    }

    async fn ask(&self, r: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        let mut c = self.client.clone();
        c.should_rate_limit(r)
            .await
            .map(tonic::Response::into_inner)
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.into(),
        value: value.into(),
    }
}

fn request(domain: &str, entries: Vec<Entry>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries,
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// An API key's descriptor, as Envoy's `request_headers` action sends it.
fn api_key(key: &str) -> RateLimitRequest {
    request(
        "edge",
        vec![entry("generic_key", "api"), entry("api_key", key)],
    )
}

fn file(server: &RedisServer, prefix: &str, body: &str) -> PathBuf {
    let path = server.dir().join(format!("{prefix}.toml"));
    let src = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ndeadline = \"500ms\"\n\n{body}",
        server.url()
    );
    std::fs::write(&path, src).unwrap();
    path
}

/// A limit of `n` per hour by API key, for routes and descriptors alike.
fn limit(n: u32) -> String {
    format!(
        r#"
[limits.per-key]
key = "header:x-api-key"
capacity = {n}
refill = "{n}/h"

[[routes]]
path = "/"
limits = ["per-key"]

[[descriptors]]
domain = "edge"
entries = [{{ key = "generic_key", value = "api" }}, {{ key = "api_key", as = "header:x-api-key" }}]
limits = ["per-key"]
"#
    )
}

fn code(r: &RateLimitResponse) -> Code {
    Code::try_from(r.overall_code).unwrap()
}

#[tokio::test]
async fn n_plus_one_calls_over_two_instances_give_n_ok_and_one_over_limit() {
    let server = RedisServer::start();
    let path = file(&server, &support::prefix("rls-two"), &limit(5));
    let (a, b) = (Rls::start(&path).await, Rls::start(&path).await);
    let mut codes = Vec::new();
    for i in 0..6 {
        let rls = if i % 2 == 0 { &a } else { &b };
        let r = rls.ask(api_key("k1")).await.unwrap();
        codes.push(code(&r));
        let s = &r.statuses[0];
        assert_eq!(s.current_limit.as_ref().unwrap().requests_per_unit, 5);
        if i < 5 {
            assert_eq!(s.limit_remaining, 4 - i, "call {i}");
        }
    }
    assert_eq!(codes[..5], [Code::Ok; 5]);
    assert_eq!(codes[5], Code::OverLimit);
    // Another key is its own bucket.
    assert_eq!(code(&a.ask(api_key("k2")).await.unwrap()), Code::Ok);
}

#[tokio::test]
async fn the_layer_and_the_server_charge_the_same_key() {
    let server = RedisServer::start();
    let prefix = support::prefix("rls-same");
    let path = file(&server, &prefix, &limit(8));
    let rls = Rls::start(&path).await;
    let app = support::ok_app(fleetlimit::Config::from_toml_file(&path).unwrap()).await;
    let mut admitted = 0;
    for _ in 0..5 {
        let req = support::request("GET", "/", "10.0.0.1:1", &[("x-api-key", "shared")]);
        if support::send(&app, req).await.status() == StatusCode::OK {
            admitted += 1;
        }
    }
    let mut refused = 0;
    for _ in 0..5 {
        match code(&rls.ask(api_key("shared")).await.unwrap()) {
            Code::Ok => admitted += 1,
            _ => refused += 1,
        }
    }
    assert_eq!((admitted, refused), (8, 2));
    let key = support::header_key(&prefix, "per-key", "shared");
    assert!(server.get_bytes(&key).is_some(), "one key in Redis: {key}");
}

#[tokio::test]
async fn with_redis_stopped_each_rule_answers_its_failure_policy() {
    let server = RedisServer::start();
    let body = r#"
[fleet]
size = 2

[limits.per-key]
key = "header:x-api-key"
capacity = 4
refill = "4/h"

[[descriptors]]
domain = "open"
entries = [{ key = "api_key", as = "header:x-api-key" }]
limits = ["per-key"]
on_redis_error = "open"

[[descriptors]]
domain = "closed"
entries = [{ key = "api_key", as = "header:x-api-key" }]
limits = ["per-key"]
on_redis_error = "closed"

[[descriptors]]
domain = "local"
entries = [{ key = "api_key", as = "header:x-api-key" }]
limits = ["per-key"]
on_redis_error = "local"
"#;
    let path = file(&server, &support::prefix("rls-down"), body);
    let rls = Rls::start(&path).await;
    let ask = |domain: &str| request(domain, vec![entry("api_key", "k")]);
    assert_eq!(code(&rls.ask(ask("closed")).await.unwrap()), Code::Ok);
    server.kill();
    for _ in 0..5 {
        assert_eq!(code(&rls.ask(ask("open")).await.unwrap()), Code::Ok);
    }
    let e = rls.ask(ask("closed")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    // `local`: this instance's share, 4 ÷ 2.
    let codes: Vec<Code> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(code(&rls.ask(ask("local")).await.unwrap()));
        }
        v
    };
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
}

#[tokio::test]
async fn bad_input_is_invalid_argument_and_charges_nobody() {
    let server = RedisServer::start();
    let path = file(&server, &support::prefix("rls-bad"), &limit(3));
    let rls = Rls::start(&path).await;
    let invalid = |r: Result<RateLimitResponse, tonic::Status>| match r {
        Err(e) => e.code() == tonic::Code::InvalidArgument,
        Ok(_) => false,
    };
    assert!(invalid(
        rls.ask(request("", vec![entry("api_key", "k")])).await
    ));
    let none = RateLimitRequest {
        domain: "edge".into(),
        ..RateLimitRequest::default()
    };
    assert!(invalid(rls.ask(none).await));
    let long = "x".repeat(10 * 1024);
    assert!(invalid(rls.ask(api_key(&long)).await));
    let many = (0..1000).map(|i| entry("k", &i.to_string())).collect();
    assert!(invalid(rls.ask(request("edge", many)).await));
    assert!(invalid(rls.ask(api_key("")).await));
    assert!(invalid(rls.ask(api_key("a\u{1}b")).await));
    // A bad descriptor beside a good one: the call is refused whole, and
    // the good one is not charged.
    let mut two = api_key("k");
    two.descriptors.push(api_key("").descriptors.remove(0));
    assert!(invalid(rls.ask(two).await));
    // A descriptor no rule names: OK, and nothing charged.
    let other = request("edge", vec![entry("generic_key", "other")]);
    let r = rls.ask(other).await.unwrap();
    assert_eq!(code(&r), Code::Ok);
    assert!(r.statuses[0].current_limit.is_none());
    // The valid caller's bucket is whole.
    let r = rls.ask(api_key("k")).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 2);
}
