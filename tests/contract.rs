//! The contract a client reads: exact rate-limit fields (legacy and IETF),
//! refunds reflected in the response that made them, what degraded
//! decisions claim, and refusals reshaped by the application's hook — on
//! Redis and in-process alike.
//!
//! Refills are slow (per hour), so a few seconds of a busy machine between
//! two requests cannot change a rounded value: remaining is floored
//! (a fraction of a token refilled stays under the next whole one for
//! 3600 s) and the reset is rounded up (it moves by less than 1 s).
// Its Redis tests need the `redis` feature; their helpers are unused without it.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports))]

use crate::support;

use std::sync::Arc;

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use fleetlimit::layer::RateLimitLayerBuilder;
use fleetlimit::{Config, RateLimitLayer, Refund, RefusalReason};
use http::{Response, StatusCode};
use support::*;

/// Routes of every test: limits on `/`, several limits on `/many`, a
/// refund on `/refund`, the failure policies, a cost no bucket holds, a
/// key that must be there, a challenge, a shed route.
const LIMITS: &str = r#"
[headers]
style = "both"

[fleet]
size = 2

[limits.per-key]
key = "header:x-api-key"
on_missing = "ip"
capacity = 5
refill = "1/h"

[limits."9.odd_Name-x"]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 100
window = "1m"

[limits.slots]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = 3

[limits.per-ip]
key = "ip"
capacity = 10
refill = "10/h"

[limits.spend]
key = "header:x-api-key"
capacity = 10
refill = "1/h"

[limits.account]
key = "header:x-account"
on_missing = "reject"
capacity = 5
refill = "1/h"

[limits.login]
key = "header:x-account"
count = "failures"
on_exceed = "challenge"
capacity = 1
refill = "1/h"

[[routes]]
path = "/"
limits = ["per-key"]

[[routes]]
path = "/many"
limits = ["per-key", "9.odd_Name-x", "slots", "per-ip"]

[[routes]]
path = "/refund"
limits = ["spend"]
cost = 5
refund = true

[[routes]]
path = "/local"
limits = ["per-key"]
on_redis_error = "local"

[[routes]]
path = "/open"
limits = ["per-key"]
on_redis_error = "open"

[[routes]]
path = "/closed"
limits = ["per-key"]
on_redis_error = "closed"

[[routes]]
path = "/costly"
limits = ["per-key"]

[[routes]]
path = "/account"
limits = ["account"]

[[routes]]
path = "/ip"
limits = ["per-ip"]

[[routes]]
path = "/login"
methods = ["POST"]
limits = ["login"]
"#;

/// Where the buckets are.
#[derive(Clone, Copy, Debug)]
enum Store {
    InProcess,
    Redis,
}

fn config(store: Store, server: Option<&RedisServer>, test: &str, extra: &str) -> Config {
    let body = format!("{extra}\n{LIMITS}");
    match store {
        Store::InProcess => Config::from_toml_str(&body).unwrap_or_else(|e| panic!("{e}")),
        // A generous deadline: these tests are about the answers, not speed.
        Store::Redis => redis_config(server.unwrap(), &prefix(test), "2s", &body),
    }
}

/// Gives 4 of the request's 5 units back before answering.
async fn refunding(Extension(refund): Extension<Refund>) -> Result<&'static str, String> {
    refund.give_back(4).await.map_err(|e| e.to_string())?;
    Ok("refunded")
}

/// Fails every attempt; asks for the challenge when the limit says so.
async fn login(challenge: Option<Extension<fleetlimit::Challenge>>) -> Response<Body> {
    use axum::response::IntoResponse;
    match challenge {
        Some(Extension(c)) => c.required().into_response(),
        None => (StatusCode::UNAUTHORIZED, "wrong password").into_response(),
    }
}

fn router(layer: RateLimitLayer) -> Router {
    let ok = || async { "ok" };
    Router::new()
        .route("/", get(ok))
        .route("/many", get(ok))
        .route("/refund", get(refunding))
        .route("/local", get(ok))
        .route("/open", get(ok))
        .route("/closed", get(ok))
        .route("/costly", get(ok))
        .route("/account", get(ok))
        .route("/ip", get(ok))
        .route("/login", post(login))
        .layer(layer)
}

async fn app_with(
    cfg: Config,
    shape: impl FnOnce(RateLimitLayerBuilder) -> RateLimitLayerBuilder,
) -> Router {
    // A cost no bucket of 5 holds (the configuration refuses a static one).
    let b = RateLimitLayer::new(cfg).cost_fn("/costly", |_| 6);
    router(shape(b).await.unwrap())
}

async fn app(cfg: Config) -> Router {
    app_with(cfg, |b| b).await
}

async fn get_as(app: &Router, path: &str, key: &str) -> Response<Body> {
    send(
        app,
        request("GET", path, "10.0.0.1:1000", &[("x-api-key", key)]),
    )
    .await
}

/// The rate-limit fields of a response, by name (absent: `None`).
fn fields(res: &Response<Body>) -> [Option<String>; 5] {
    [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit-policy",
        "ratelimit",
    ]
    .map(|n| header(res, n))
}

fn some(v: [&str; 5]) -> [Option<String>; 5] {
    v.map(|s| Some(s.to_owned()))
}

async fn one_limit(store: Store, server: Option<&RedisServer>) {
    let app = app(config(store, server, "one", "")).await;
    let res = get_as(&app, "/", "alice").await;
    assert_eq!(res.status(), 200);
    // q = B = 5, w = B / r = 5 / (1/3600 s) = 18000 s.
    assert_eq!(
        fields(&res),
        some([
            "5",
            "4",
            "3600",
            r#""per-key";q=5;w=18000"#,
            r#""per-key";r=4;t=3600"#
        ]),
        "{store:?}"
    );
    let res = get_as(&app, "/", "alice").await;
    assert_eq!(
        fields(&res),
        some([
            "5",
            "3",
            "7200",
            r#""per-key";q=5;w=18000"#,
            r#""per-key";r=3;t=7200"#
        ]),
        "{store:?}"
    );
}

#[tokio::test]
async fn one_limit_in_process() {
    one_limit(Store::InProcess, None).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn one_limit_on_redis() {
    let server = RedisServer::start();
    one_limit(Store::Redis, Some(&server)).await;
    server.assert_every_key_expires(&prefix("one"));
}

async fn several_limits(store: Store, server: Option<&RedisServer>) {
    let app = app(config(store, server, "many", "")).await;
    let res = get_as(&app, "/many", "bob").await;
    assert_eq!(res.status(), 200);
    // Every limit of the route, in its order, named by sf-strings (a name
    // starting with a digit is no sf-token); the legacy fields report the
    // limit with the least room: the slots, 2 of 3 free while the response
    // is sent (its slot is given back once it is over), the reset being
    // `max_hold` (60 s by default), the longest a slot is held.
    assert_eq!(
        fields(&res),
        some([
            "3",
            "2",
            "60",
            r#""per-key";q=5;w=18000, "9.odd_Name-x";q=100;w=60, "slots";q=3, "per-ip";q=10;w=3600"#,
            r#""per-key";r=4;t=3600, "9.odd_Name-x";r=99;t=60, "slots";r=2;t=60, "per-ip";r=9;t=360"#,
        ]),
        "{store:?}"
    );
}

#[tokio::test]
async fn several_limits_in_process() {
    several_limits(Store::InProcess, None).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn several_limits_on_redis() {
    let server = RedisServer::start();
    several_limits(Store::Redis, Some(&server)).await;
}

async fn refused(store: Store, server: Option<&RedisServer>) {
    let app = app(config(store, server, "refused", "")).await;
    for _ in 0..5 {
        assert_eq!(get_as(&app, "/", "carol").await.status(), 200);
    }
    // Twice: decided by the store, then (on Redis) remembered.
    for i in 0..2 {
        let res = get_as(&app, "/", "carol").await;
        assert_eq!(res.status(), 429, "{store:?} {i}");
        assert_eq!(header(&res, "retry-after").as_deref(), Some("3600"));
        assert_eq!(
            fields(&res),
            some([
                "5",
                "0",
                "18000",
                r#""per-key";q=5;w=18000"#,
                r#""per-key";r=0;t=18000"#
            ]),
            "{store:?} {i}"
        );
        let body = body_text(res).await;
        assert!(
            body.starts_with(
                r#"{"type":"urn:fleetlimit:rate-limited","title":"Too Many Requests","status":429,"#
            ),
            "{body}"
        );
    }
}

#[tokio::test]
async fn refused_in_process() {
    refused(Store::InProcess, None).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn refused_on_redis() {
    let server = RedisServer::start();
    refused(Store::Redis, Some(&server)).await;
}

async fn refund_reflected(store: Store, server: Option<&RedisServer>) {
    let app = app(config(store, server, "refund", "")).await;
    // Charged 5 of 10, 4 given back before the answer: 9 left, one
    // request of 5 (a full bucket holds 2), and a reset of one token
    // (3600 s), not of five.
    let res = get_as(&app, "/refund", "dave").await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        fields(&res),
        some([
            "2",
            "1",
            "3600",
            r#""spend";q=2;w=36000"#,
            r#""spend";r=1;t=3600"#
        ]),
        "{store:?}"
    );
    // The store agrees: the next request (5 more, 4 back) leaves 8, still
    // one request, full in two tokens' time.
    let res = get_as(&app, "/refund", "dave").await;
    assert_eq!(header(&res, "x-ratelimit-remaining").as_deref(), Some("1"));
    assert_eq!(
        header(&res, "ratelimit").as_deref(),
        Some(r#""spend";r=1;t=7200"#)
    );
}

#[tokio::test]
async fn refund_reflected_in_process() {
    refund_reflected(Store::InProcess, None).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn refund_reflected_on_redis() {
    let server = RedisServer::start();
    refund_reflected(Store::Redis, Some(&server)).await;
    server.assert_every_key_expires(&prefix("refund"));
}

#[cfg(feature = "redis")]
/// Redis is gone: `local` answers from this instance's share and claims no
/// remaining (the fleet's count is unknown); `open` counts nothing and
/// says nothing; `closed` is a 503 of its own type.
#[tokio::test]
async fn degraded_decisions_say_nothing_false() {
    let server = RedisServer::start();
    let app = app(config(Store::Redis, Some(&server), "degraded", "")).await;
    assert_eq!(get_as(&app, "/local", "erin").await.status(), 200);
    server.kill();

    // Share: 5 ÷ fleet size 2 = 2.5, so 2 admitted, then refused.
    let policy = r#""per-key";q=5;w=18000"#;
    for i in 0..2 {
        let res = get_as(&app, "/local", "erin").await;
        assert_eq!(res.status(), 200, "local {i}");
        assert_eq!(
            fields(&res),
            [Some("5".into()), None, None, Some(policy.into()), None],
            "local {i}: the policy, no remaining"
        );
    }
    let res = get_as(&app, "/local", "erin").await;
    assert_eq!(res.status(), 429);
    assert!(header(&res, "retry-after").is_some(), "a 429 says when");
    assert_eq!(
        fields(&res),
        [Some("5".into()), None, None, Some(policy.into()), None]
    );

    let res = get_as(&app, "/open", "erin").await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        fields(&res),
        [None, None, None, None, None],
        "open: nothing counted"
    );

    let res = get_as(&app, "/closed", "erin").await;
    assert_eq!(res.status(), 503);
    assert_eq!(header(&res, "retry-after").as_deref(), Some("1"));
    let body = body_text(res).await;
    assert!(
        body.contains(r#""type":"urn:fleetlimit:limiter-unavailable""#),
        "{body}"
    );
}

/// The 401 of a missing key names a challenge (RFC 9110 §15.5.2): `ApiKey`
/// unless configured.
#[tokio::test]
async fn a_missing_key_is_a_401_with_www_authenticate() {
    let app1 = app(config(Store::InProcess, None, "", "")).await;
    let res = send(&app1, request("GET", "/account", "10.0.0.1:1", &[])).await;
    assert_eq!(res.status(), 401);
    assert_eq!(header(&res, "www-authenticate").as_deref(), Some("ApiKey"));
    let body = body_text(res).await;
    assert!(
        body.contains(r#""type":"urn:fleetlimit:missing-key""#),
        "{body}"
    );

    let keys = "[keys]\nwww_authenticate = 'Bearer realm=\"api\"'\n";
    let app2 = app(config(Store::InProcess, None, "", keys)).await;
    let res = send(&app2, request("GET", "/account", "10.0.0.1:1", &[])).await;
    assert_eq!(
        header(&res, "www-authenticate").as_deref(),
        Some(r#"Bearer realm="api""#)
    );

    let cfg = Config::builder()
        .www_authenticate("Basic realm=\"x\"")
        .build()
        .unwrap();
    assert_eq!(cfg.www_authenticate(), r#"Basic realm="x""#);
}

#[test]
fn a_bad_challenge_fails_at_start_up_where_it_is_written() {
    let e = Config::from_toml_str("[keys]\nwww_authenticate = \"Bad scheme\\u0001\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("line 2, column 20:"), "{e}");
    assert!(e.contains("www_authenticate"), "{e}");
    let e = Config::from_toml_str("[keys]\nwww_authenticate = \"\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("auth-scheme"), "{e}");
    let e = Config::from_toml_str("[headers]\nstyle = \"modern\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("line 2, column 9"), "{e}");
    assert!(e.contains("modern"), "{e}");
    assert!(Config::builder().www_authenticate("").build().is_err());
}

/// What the hook was told, as headers of its answer.
fn tell(r: fleetlimit::Refusal) -> Response<Bytes> {
    let default = r.default_response();
    let mut res = Response::builder()
        .status(StatusCode::IM_A_TEAPOT)
        .header("x-reason", format!("{:?}", r.reason()))
        .header("x-limit", r.limit().unwrap_or("-"))
        .header(
            "x-retry",
            r.retry_after()
                .map_or("-".into(), |d| d.as_secs().to_string()),
        )
        .header(
            "x-remaining",
            r.remaining().map_or("-".into(), |n| n.to_string()),
        )
        .header("x-default-status", default.status().as_str())
        .header("x-type", problem_type(default.body()))
        .body(Bytes::from_static(b"shaped"))
        .unwrap();
    // The default's own headers ride along (rate limit, WWW-Authenticate).
    for (k, v) in default.headers() {
        res.headers_mut().entry(k).or_insert_with(|| v.clone());
    }
    res
}

fn problem_type(body: &Bytes) -> String {
    let s = std::str::from_utf8(body).unwrap();
    let start = s.find(r#""type":""#).map(|i| i + 8).unwrap_or(0);
    s[start..].split('"').next().unwrap_or("").to_owned()
}

/// `(reason, limit, retry, remaining, default status, default type)`.
fn told(res: &Response<Body>) -> [String; 6] {
    [
        "x-reason",
        "x-limit",
        "x-retry",
        "x-remaining",
        "x-default-status",
        "x-type",
    ]
    .map(|n| header(res, n).unwrap_or_else(|| panic!("no {n}")))
}

fn expect(v: [&str; 6]) -> [String; 6] {
    v.map(str::to_owned)
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn the_hook_reshapes_every_refusal() {
    let server = RedisServer::start();
    let app = app_with(config(Store::Redis, Some(&server), "hook", ""), |b| {
        b.on_refusal(tell)
    })
    .await;

    // Limit exceeded, by Redis then remembered.
    for _ in 0..5 {
        assert_eq!(get_as(&app, "/", "frank").await.status(), 200);
    }
    for _ in 0..2 {
        let res = get_as(&app, "/", "frank").await;
        assert_eq!(res.status(), 418);
        assert_eq!(
            told(&res),
            expect([
                "LimitExceeded",
                "per-key",
                "3600",
                "0",
                "429",
                "urn:fleetlimit:rate-limited"
            ])
        );
        assert_eq!(
            header(&res, "ratelimit").as_deref(),
            Some(r#""per-key";r=0;t=18000"#)
        );
        assert_eq!(body_text(res).await, "shaped");
    }

    // Cost too high: 6 on a bucket of 5.
    let res = get_as(&app, "/costly", "frank").await;
    assert_eq!(
        told(&res),
        expect([
            "CostTooHigh",
            "per-key",
            "-",
            "-",
            "413",
            "urn:fleetlimit:cost-too-high"
        ])
    );

    // Missing key: the default's WWW-Authenticate is there to keep.
    let res = send(&app, request("GET", "/account", "10.0.0.1:1", &[])).await;
    assert_eq!(
        told(&res),
        expect([
            "MissingKey",
            "account",
            "-",
            "-",
            "401",
            "urn:fleetlimit:missing-key"
        ])
    );
    assert_eq!(header(&res, "www-authenticate").as_deref(), Some("ApiKey"));

    // No client address (no ConnectInfo).
    let req = http::Request::get("/ip").body(Body::empty()).unwrap();
    let res = send(&app, req).await;
    assert_eq!(
        told(&res),
        expect([
            "NoClientIp",
            "per-ip",
            "1",
            "-",
            "503",
            "urn:fleetlimit:no-client-ip"
        ])
    );

    // Challenge: the handler's ChallengeRequired, after a failed attempt.
    let login = || request("POST", "/login", "10.0.0.1:1", &[("x-account", "grace")]);
    let res = send(&app, login()).await;
    assert_eq!(
        res.status(),
        401,
        "the first failure is the handler's own answer"
    );
    assert!(header(&res, "x-reason").is_none());
    let res = send(&app, login()).await;
    assert_eq!(
        told(&res),
        expect([
            "ChallengeRequired",
            "login",
            "-",
            "-",
            "401",
            "urn:fleetlimit:challenge-required"
        ])
    );
    assert_eq!(body_text(res).await, "shaped");

    // Limiter unavailable (closed policy).
    server.kill();
    // (Not frank: his refusal is remembered, and answered first.)
    let res = get_as(&app, "/closed", "judy").await;
    assert_eq!(
        told(&res),
        expect([
            "Unavailable",
            "per-key",
            "1",
            "-",
            "503",
            "urn:fleetlimit:limiter-unavailable"
        ])
    );
    // A local refusal: no remaining claimed.
    let first = std::time::Instant::now();
    for _ in 0..2 {
        assert_eq!(get_as(&app, "/local", "heidi").await.status(), 200);
    }
    let res = get_as(&app, "/local", "heidi").await;
    let mut told = told(&res);
    // A token an hour: its refill counted from the first admission, so a
    // busy host's seconds between the requests come off the hour.
    let retry: u64 = told[2].parse().unwrap();
    let waited = first.elapsed().as_secs();
    assert!(
        (3600 - waited - 1..=3600).contains(&retry),
        "Retry-After {retry}, {waited} s after the first admission"
    );
    told[2] = "3600".into();
    assert_eq!(
        told,
        expect([
            "LimitExceeded",
            "per-key",
            "3600",
            "-",
            "429",
            "urn:fleetlimit:rate-limited"
        ]),
        "a local refusal claims no remaining"
    );
}

#[tokio::test]
async fn the_hook_reshapes_a_shed_request() {
    let cfg = Config::from_toml_str(
        "[shedding]\nretry_after = \"2s\"\n\n[[routes]]\npath = \"/\"\nlimits = []\npriority = \"sheddable\"\n",
    )
    .unwrap();
    let layer = RateLimitLayer::new(cfg)
        .load_signal(|| 5.0)
        .on_refusal(tell)
        .await
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let res = send(&app, request("GET", "/", "10.0.0.1:1", &[])).await;
    assert_eq!(res.status(), 418);
    assert_eq!(
        told(&res),
        expect([
            "Overloaded",
            "-",
            "2",
            "-",
            "503",
            "urn:fleetlimit:overloaded"
        ])
    );
}

/// A hook that panics: the default answer goes out, not a 500 nor a
/// dropped connection.
#[tokio::test]
async fn a_panicking_hook_sends_the_default_refusal() {
    let app = app_with(config(Store::InProcess, None, "", ""), |b| {
        b.on_refusal(|r| {
            if r.reason() == RefusalReason::LimitExceeded {
                panic!("a bug in the application's hook");
            }
            r.into_default_response()
        })
    })
    .await;
    for _ in 0..5 {
        assert_eq!(get_as(&app, "/", "ivan").await.status(), 200);
    }
    let res = get_as(&app, "/", "ivan").await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after").as_deref(), Some("3600"));
    assert_eq!(header(&res, "x-ratelimit-remaining").as_deref(), Some("0"));
    let body = body_text(res).await;
    assert!(body.contains("urn:fleetlimit:rate-limited"), "{body}");
}

/// `legacy` (the default) and `ietf` each write their own set only.
#[tokio::test]
async fn the_style_chooses_the_fields() {
    let legacy = LIMITS.replace("style = \"both\"", "style = \"legacy\"");
    let app1 = app(Config::from_toml_str(&legacy).unwrap()).await;
    let res = get_as(&app1, "/", "judy").await;
    assert_eq!(
        fields(&res),
        [
            Some("5".into()),
            Some("4".into()),
            Some("3600".into()),
            None,
            None
        ]
    );
    let unset = LIMITS.replace("style = \"both\"", "");
    let app2 = app(Config::from_toml_str(&unset).unwrap()).await;
    assert_eq!(
        fields(&get_as(&app2, "/", "judy").await),
        fields(&res),
        "legacy by default"
    );

    let ietf = LIMITS.replace("style = \"both\"", "style = \"ietf\"");
    let app3 = app(Config::from_toml_str(&ietf).unwrap()).await;
    let res = get_as(&app3, "/", "judy").await;
    assert_eq!(
        fields(&res),
        [
            None,
            None,
            None,
            Some(r#""per-key";q=5;w=18000"#.into()),
            Some(r#""per-key";r=4;t=3600"#.into())
        ]
    );
}

#[cfg(feature = "redis")]
/// Redis dies between the decision and the handler's refund: the refund
/// fails, and the headers say what the store last said (5 units left: one
/// request), not a refund that did not happen.
#[tokio::test]
async fn a_failed_refund_is_not_reported() {
    let server = RedisServer::start();
    let cfg = config(Store::Redis, Some(&server), "refund-fails", "");
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = Arc::clone(&gate);
    let handler = move |Extension(refund): Extension<Refund>| {
        let g = Arc::clone(&g);
        async move {
            g.acquire().await.unwrap().forget();
            match refund.give_back(4).await {
                Ok(()) => "refunded".to_owned(),
                Err(e) => format!("refund failed: {e}"),
            }
        }
    };
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    let app = Router::new().route("/refund", get(handler)).layer(layer);
    let call = tokio::spawn({
        let app = app.clone();
        async move { get_as(&app, "/refund", "mallory").await }
    });
    // Admitted (charged 5: the key is in Redis) and waiting in the
    // handler: kill Redis now. Bounded: 10 s at most.
    for _ in 0..1000 {
        if server.cli(&["DBSIZE"]).is_some_and(|n| n.trim() != "0") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!call.is_finished(), "the handler waits for the gate");
    server.kill();
    gate.add_permits(1);
    let res = call.await.unwrap();
    assert_eq!(res.status(), 200);
    // 5 of 10 left: one request of 5.
    assert_eq!(
        fields(&res),
        some([
            "2",
            "1",
            "18000",
            r#""spend";q=2;w=36000"#,
            r#""spend";r=1;t=18000"#
        ])
    );
    assert!(body_text(res).await.starts_with("refund failed"));
}
