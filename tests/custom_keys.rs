//! Keys the application computes (`key = "custom:<name>"`, `key_fn`): one
//! bucket per value, in process and on a real Redis; no key → the limit's
//! `on_missing`; an invalid key → 400; a panicking extractor → 503, never
//! admitted uncounted; long values bounded; never the bucket of another
//! source's equal value; an unregistered name fails the build.
// Its Redis tests need the `redis` feature; their helpers are unused without it.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports))]

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use fleetlimit::configuration::{KeySource, LimitConfig, Rate, RouteConfig};
use fleetlimit::store::MemoryStore;
use fleetlimit::{BuildError, Config, KeyAnswer, RateLimitLayer, RefusalReason, RequestRef};
use support::*;

const PER_TENANT: &str = r#"
[limits.per-tenant]
key = "custom:tenant"
capacity = 2
refill = "1/d"

[[routes]]
path = "/"
limits = ["per-tenant"]
"#;

/// The tenant in `x-tenant`; `invalid` is invalid, `boom` a bug.
fn tenant<'r>(req: &RequestRef<'r>) -> KeyAnswer<'r> {
    match req.headers().get("x-tenant").map(|v| v.as_bytes()) {
        Some(b"invalid") => KeyAnswer::Invalid,
        Some(b"boom") => panic!("a bug in the extractor"),
        v => v.into(),
    }
}

/// `/` answering "ok" and counting the calls that reached it.
/// Held by every test that makes an extractor fail. tracing caches, per log
/// line, whether any subscriber wants it: a test hitting the "extractor
/// panicked" line on another thread, with no subscriber of its own, while
/// the log-counting test installs its subscriber can leave that cache saying
/// "nobody", and the counted test then misses its first line.
static FAILING_EXTRACTOR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn app_with(cfg: Config) -> (Router, Arc<AtomicU32>) {
    let layer = RateLimitLayer::new(cfg)
        .key_fn("tenant", tenant)
        .await
        .unwrap();
    let served = Arc::new(AtomicU32::new(0));
    let count = Arc::clone(&served);
    let app = Router::new()
        .route(
            "/",
            get(move || {
                count.fetch_add(1, Ordering::Relaxed);
                async { "ok" }
            }),
        )
        .layer(layer);
    (app, served)
}

async fn status(app: &Router, headers: &[(&str, &str)]) -> u16 {
    send(app, request("GET", "/", "127.0.0.1:1", headers))
        .await
        .status()
        .as_u16()
}

async fn statuses(app: &Router, tenant: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(status(app, &[("x-tenant", tenant)]).await);
    }
    out
}

/// Two tenants, two buckets of 2.
async fn drive_two_tenants(app: &Router) {
    let res = send(
        app,
        request("GET", "/", "127.0.0.1:1", &[("x-tenant", "acme")]),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 1);
    assert_eq!(statuses(app, "acme", 2).await, [200, 429]);
    assert_eq!(statuses(app, "globex", 3).await, [200, 200, 429]);
}

#[tokio::test]
async fn each_custom_value_has_its_bucket_in_process() {
    let (app, served) = app_with(Config::from_toml_str(PER_TENANT).unwrap()).await;
    drive_two_tenants(&app).await;
    assert_eq!(served.load(Ordering::Relaxed), 4);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn each_custom_value_has_its_bucket_on_redis_under_a_keyed_digest() {
    let server = RedisServer::start();
    let p = prefix("custom-buckets");
    let (app, _) = app_with(redis_config(&server, &p, "500ms", PER_TENANT)).await;
    drive_two_tenants(&app).await;
    let keys = server.keys_with_pttl(&p);
    assert_eq!(keys.len(), 2, "{keys:?}");
    for (k, _) in &keys {
        // A reader of Redis can neither read nor confirm a tenant.
        let tag = k.strip_prefix(&format!("{p}:per-tenant:{{c#"));
        assert!(
            tag.is_some_and(|t| t.len() == 33 && t.ends_with('}')),
            "{k}"
        );
    }
    server.assert_every_key_expires(&p);
    // The admin tools reach a tenant's bucket by its value.
    let cfg = redis_config(&server, &p, "500ms", PER_TENANT);
    let acme = fleetlimit::admin::Admin::redis_key(&cfg, "per-tenant", "acme").unwrap();
    assert!(keys.iter().any(|(k, _)| *k == acme), "{acme} in {keys:?}");
    let admin = fleetlimit::admin::Admin::connect(&cfg).await.unwrap();
    assert_eq!(admin.reset("acme", Some("per-tenant")).await.unwrap(), 1);
    // The layer forgets its remembered refusal when the reset's
    // announcement arrives (answered from the cache meanwhile, uncharged).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while status(&app, &[("x-tenant", "acme")]).await == 429 {
        assert!(std::time::Instant::now() < deadline, "reset never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(statuses(&app, "acme", 2).await, [200, 429]);
    assert_eq!(statuses(&app, "globex", 1).await, [429]);
}

#[tokio::test]
async fn no_key_is_the_limits_on_missing_reject() {
    let (app, served) = app_with(Config::from_toml_str(PER_TENANT).unwrap()).await;
    for headers in [&[][..], &[("x-tenant", "")][..]] {
        let res = send(&app, request("GET", "/", "127.0.0.1:1", headers)).await;
        assert_eq!(res.status(), 401);
        assert_eq!(header(&res, "www-authenticate").as_deref(), Some("ApiKey"));
        let body = body_text(res).await;
        assert!(body.contains("urn:fleetlimit:missing-key"), "{body}");
        assert!(body.contains(r#"custom key \"tenant\""#), "{body}");
    }
    assert_eq!(served.load(Ordering::Relaxed), 0);
}

#[cfg(feature = "redis")]
/// `on_missing = "ip"`: requests without a tenant count by client IP, in a
/// bucket apart from a tenant whose name is that IP.
#[tokio::test]
async fn no_key_is_the_limits_on_missing_ip_and_never_a_tenants_bucket() {
    let server = RedisServer::start();
    let p = prefix("custom-missing-ip");
    let body = PER_TENANT.replace(
        "key = \"custom:tenant\"",
        "key = \"custom:tenant\"\non_missing = \"ip\"",
    );
    let (app, _) = app_with(redis_config(&server, &p, "500ms", &body)).await;
    let mut anonymous = Vec::new();
    for _ in 0..3 {
        anonymous.push(status(&app, &[]).await);
    }
    assert_eq!(anonymous, [200, 200, 429]);
    assert_eq!(statuses(&app, "127.0.0.1", 3).await, [200, 200, 429]);
    let mut keys: Vec<String> = server.keys_with_pttl(&p).into_iter().map(|k| k.0).collect();
    keys.sort();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys[0].contains(":{c#"), "{keys:?}");
    assert!(keys[1].ends_with(":{ip:127.0.0.1}"), "{keys:?}");
}

#[tokio::test]
async fn an_invalid_key_is_a_400_the_refusal_hook_sees() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hook_seen = Arc::clone(&seen);
    let layer = RateLimitLayer::new(Config::from_toml_str(PER_TENANT).unwrap())
        .key_fn("tenant", tenant)
        .on_refusal(move |r| {
            hook_seen
                .lock()
                .unwrap()
                .push((r.reason(), r.limit().map(str::to_owned)));
            let mut res = r.into_default_response();
            res.headers_mut()
                .insert("x-shaped", http::HeaderValue::from_static("1"));
            res
        })
        .await
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let res = send(
        &app,
        request("GET", "/", "127.0.0.1:1", &[("x-tenant", "invalid")]),
    )
    .await;
    assert_eq!(res.status(), 400);
    assert_eq!(header(&res, "x-shaped").as_deref(), Some("1"));
    assert_eq!(
        header(&res, "content-type").as_deref(),
        Some("application/problem+json")
    );
    let body = body_text(res).await;
    assert!(
        body.contains(r#""type":"urn:fleetlimit:invalid-key""#),
        "{body}"
    );
    assert!(body.contains(r#""limit":"per-tenant""#), "{body}");
    assert_eq!(
        *seen.lock().unwrap(),
        [(RefusalReason::InvalidKey, Some("per-tenant".to_owned()))]
    );
    assert_eq!(
        RefusalReason::InvalidKey.problem_type(),
        "urn:fleetlimit:invalid-key"
    );
}

#[cfg(feature = "redis")]
/// 10 KB values are decided like any other, two that differ in their last
/// byte count apart, and their Redis keys stay short.
#[tokio::test]
async fn ten_kilobyte_values_are_decided_normally_and_stored_short() {
    let server = RedisServer::start();
    let p = prefix("custom-long");
    let (app, _) = app_with(redis_config(&server, &p, "500ms", PER_TENANT)).await;
    let long_a = format!("{}a", "t".repeat(10 * 1024));
    let long_b = format!("{}b", "t".repeat(10 * 1024));
    assert_eq!(statuses(&app, &long_a, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&app, &long_b, 3).await, [200, 200, 429]);
    let keys = server.keys_with_pttl(&p);
    assert_eq!(keys.len(), 2, "{keys:?}");
    for (k, _) in &keys {
        assert!(k.len() <= p.len() + 50, "{} bytes: {k}", k.len());
    }
    server.assert_every_key_expires(&p);
    // In process too (hashed alike, no Redis to bound it).
    let (app, _) = app_with(Config::from_toml_str(PER_TENANT).unwrap()).await;
    assert_eq!(statuses(&app, &long_a, 3).await, [200, 200, 429]);
}

#[cfg(feature = "redis")]
/// A limit that was keyed by an API key and is now keyed by a custom key
/// under the same name (a configuration change): the tenant `acme` does
/// not inherit the bucket of the API key `acme`.
#[tokio::test]
async fn a_custom_value_equal_to_an_api_key_is_another_bucket() {
    let server = RedisServer::start();
    let p = prefix("custom-vs-header");
    let by_header = PER_TENANT.replace("custom:tenant", "header:x-api-key");
    let (header_app, _) = app_with(redis_config(&server, &p, "500ms", &by_header)).await;
    let mut api = Vec::new();
    for _ in 0..3 {
        api.push(status(&header_app, &[("x-api-key", "acme")]).await);
    }
    assert_eq!(api, [200, 200, 429]);
    let (custom_app, _) = app_with(redis_config(&server, &p, "500ms", PER_TENANT)).await;
    let res = send(
        &custom_app,
        request("GET", "/", "127.0.0.1:1", &[("x-tenant", "acme")]),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 1);
    let mut keys: Vec<String> = server.keys_with_pttl(&p).into_iter().map(|k| k.0).collect();
    keys.sort();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys[0].contains(":{c#") && keys[1].contains(":{h#"),
        "{keys:?}"
    );
    assert_ne!(keys[0][keys[0].len() - 33..], keys[1][keys[1].len() - 33..]);
}

#[tokio::test]
async fn an_unregistered_name_fails_the_build_at_its_place_in_the_file() {
    let dir = std::env::temp_dir().join(format!("fleetlimit-custom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tenants.toml");
    std::fs::write(&path, PER_TENANT).unwrap();
    let cfg = Config::from_toml_file(&path).unwrap();
    // A name that is registered, but not the one the limit asks for.
    let err = RateLimitLayer::new(cfg)
        .key_fn("tenants", tenant)
        .await
        .unwrap_err();
    let BuildError::Config(e) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(e.file(), Some(path.as_path()));
    assert_eq!((e.line(), e.column()), (Some(3), Some(7)));
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "{}:3:7: limit \"per-tenant\" is keyed by custom key \"tenant\", but no extractor",
            path.display()
        )),
        "{text}"
    );
    assert!(text.contains(".key_fn(\"tenant\", ..)"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();

    // Built in code: no place, the limit still named.
    let cfg = Config::builder()
        .limit(
            "per-tenant",
            LimitConfig::token_bucket(KeySource::custom("tenant"), 2, Rate::per_second(1)),
        )
        .route("/", RouteConfig::new(["per-tenant"]))
        .build()
        .unwrap();
    let err = RateLimitLayer::new(cfg.clone()).await.unwrap_err();
    assert!(
        matches!(&err, BuildError::Config(e) if e.line().is_none()),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("limit \"per-tenant\""), "{err}");
    let source: &dyn std::error::Error = &err;
    assert!(source.source().is_none());
    // Registered: builds.
    let built = RateLimitLayer::new(cfg).key_fn("tenant", tenant).await;
    assert!(built.is_ok());
}

#[tokio::test]
async fn a_registered_name_no_limit_uses_is_only_a_warning() {
    let cfg = Config::from_toml_str(PER_TENANT).unwrap();
    let (built, logs) = logged(async {
        RateLimitLayer::new(cfg)
            .key_fn("tenant", tenant)
            .key_fn("region", |_req| KeyAnswer::Missing)
            .await
    })
    .await;
    assert!(built.is_ok());
    let warns: Vec<&str> = logs.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warns.len(), 1, "{logs}");
    assert!(
        warns[0].contains(r#"registered under "region", but no limit is keyed by "custom:region""#),
        "{logs}"
    );
}

/// A panicking extractor: `503` with `Retry-After`, the handler never
/// called, other tenants unaffected, one ERROR line a second.
#[tokio::test(start_paused = true)]
async fn a_panicking_extractor_is_a_503_never_an_uncounted_admission() {
    let _one_at_a_time = FAILING_EXTRACTOR.lock().await;
    let ((), logs) = logged(async {
        let (app, served) = app_with(Config::from_toml_str(PER_TENANT).unwrap()).await;
        for _ in 0..50 {
            let res = send(
                &app,
                request("GET", "/", "127.0.0.1:1", &[("x-tenant", "boom")]),
            )
            .await;
            assert_eq!(res.status(), 503);
            assert_eq!(header(&res, "retry-after").as_deref(), Some("1"));
            let body = body_text(res).await;
            assert!(
                body.contains(r#""type":"urn:fleetlimit:key-unavailable""#),
                "{body}"
            );
            assert!(!body.contains("bug"), "{body}");
        }
        assert_eq!(served.load(Ordering::Relaxed), 0);
        assert_eq!(statuses(&app, "acme", 3).await, [200, 200, 429]);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(status(&app, &[("x-tenant", "boom")]).await, 503);
    })
    .await;
    let errors: Vec<&str> = logs.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 2, "{logs}");
    assert!(errors[0].contains("its extractor panicked"), "{logs}");
    assert!(errors[0].contains("reason=\"key-unavailable\""), "{logs}");
    assert!(errors[0].contains("suppressed=0"), "{logs}");
    assert!(errors[1].contains("suppressed=49"), "{logs}");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_panicking_extractor_charges_nothing_on_redis() {
    let _one_at_a_time = FAILING_EXTRACTOR.lock().await;
    let server = RedisServer::start();
    let p = prefix("custom-panic");
    let (app, served) = app_with(redis_config(&server, &p, "500ms", PER_TENANT)).await;
    for _ in 0..3 {
        assert_eq!(status(&app, &[("x-tenant", "boom")]).await, 503);
    }
    assert_eq!(served.load(Ordering::Relaxed), 0);
    assert!(server.keys_with_pttl(&p).is_empty());
    assert_eq!(statuses(&app, "acme", 3).await, [200, 200, 429]);
}

/// Layers made without an extractor: a custom-keyed limit
/// is refused when the layer is made, with the builder's error (placed
/// where the key was written), never answered at request time.
#[tokio::test]
async fn layers_built_without_the_builder_refuse_custom_keys() {
    let cfg = Config::from_toml_str(PER_TENANT).unwrap();
    let built = RateLimitLayer::new(cfg.clone()).await.unwrap_err();
    let in_memory = RateLimitLayer::new(cfg.clone()).await.unwrap_err();
    let on_memory = RateLimitLayer::with_store(cfg.clone(), Arc::new(MemoryStore::new(10)))
        .await
        .unwrap_err();
    let on_own = RateLimitLayer::with_store(cfg.clone(), Arc::new(Own(MemoryStore::new(10))))
        .await
        .unwrap_err();
    let BuildError::Config(e) = &built else {
        panic!("{built}");
    };
    assert_eq!((e.line(), e.column()), (Some(3), Some(7)), "{e}");
    assert!(
        e.message().starts_with(
            "limit \"per-tenant\" is keyed by custom key \"tenant\", but no extractor of that \
             name was registered"
        ),
        "{e}"
    );
    assert_eq!(in_memory, built);
    assert_eq!(on_memory, built);
    assert_eq!(on_own, built);
}

/// A store of the application's own (around the in-process one).
#[derive(Debug)]
struct Own(MemoryStore);

impl fleetlimit::store::Store for Own {
    fn check(&self, check: &fleetlimit::store::Check) -> fleetlimit::store::StoreFuture {
        self.0.check(check)
    }
}

#[test]
fn bad_custom_names_in_code_fail_the_configuration() {
    for bad in ["", "a b", "t/x", &"x".repeat(65)] {
        let err = Config::builder()
            .limit(
                "per-tenant",
                LimitConfig::token_bucket(KeySource::custom(bad), 2, Rate::per_second(1)),
            )
            .build()
            .unwrap_err();
        assert!(
            err.message().starts_with(&format!(
                "limit \"per-tenant\": custom key name {bad:?} must be"
            )),
            "{err}"
        );
    }
}
