//! One door for configuration: a `Config` is made only by `build` (from
//! code or from TOML) or by `try_with_redis_url`, which checks the URL as a
//! `[redis]` section's is; and both ways of making a layer (`new`,
//! `with_store`, with the builder's settings or without) refuse the same
//! configurations with the same error.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use fleetlimit::reload::ReloadError;
use fleetlimit::store::{Check, MemoryStore, Store, StoreFuture};
use fleetlimit::{BuildError, Config, RateLimitLayer};
use support::stats::Parts;
use support::*;

const LIMITS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 2
refill = "1/h"

[[routes]]
path = "/"
limits = ["per-key"]
"#;

async fn statuses(app: &Router, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        let req = request("GET", "/", "10.0.0.1:1", &[("x-api-key", "k")]);
        out.push(send(app, req).await.status().as_u16());
    }
    out
}

/// A URL from the environment that a `[redis]` section could not hold is
/// refused when the new configuration is made, with the file's message.
#[test]
fn a_url_from_the_environment_is_checked_as_the_files_is() {
    let cfg = Config::from_toml_str(LIMITS).unwrap();
    let in_file =
        Config::from_toml_str(&format!("[redis]\nurl = \"notaurl://x\"\n{LIMITS}")).unwrap_err();
    let from_env = cfg.clone().try_with_redis_url("notaurl://x").unwrap_err();
    assert_eq!(from_env.message(), in_file.message());
    assert!(
        from_env
            .message()
            .starts_with("unsupported Redis URL scheme \"notaurl://\""),
        "{from_env}"
    );
    // Not a place in any file: the URL was not written in one.
    assert_eq!((from_env.line(), from_env.file()), (None, None));
    let err = cfg.try_with_redis_url("not a url").unwrap_err();
    assert!(
        err.message().starts_with("cannot read the Redis URL"),
        "{err}"
    );
}

/// The reload's `map` is held to the same check: its error refuses the
/// reload, and the running configuration goes on.
#[tokio::test]
async fn a_bad_url_from_the_environment_refuses_a_reload() {
    let d = std::env::temp_dir().join(format!("fleetlimit-one-door-map-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join("limits.toml");
    std::fs::write(&path, LIMITS.replace("capacity = 2", "capacity = 5")).unwrap();
    let layer = RateLimitLayer::new(Config::from_toml_str(LIMITS).unwrap())
        .await
        .unwrap();
    let reload = layer.reload_handle();
    let app = ok_routes(layer, ["/"]);
    let options = reload
        .clone()
        .settle(Duration::ZERO)
        .map(|cfg| cfg.try_with_redis_url("notaurl://x"));
    let err = options.reload_file(&path).await.unwrap_err();
    std::fs::remove_dir_all(&d).unwrap();
    match &err {
        ReloadError::Invalid(e) => {
            assert!(
                e.message().starts_with("unsupported Redis URL scheme"),
                "{e}"
            )
        }
        other => panic!("{other}"),
    }
    assert!(
        err.to_string()
            .ends_with("; the running configuration is kept"),
        "{err}"
    );
    assert_eq!(statuses(&app, 3).await, [200, 200, 429]);
}

/// A store of the application's own, around the in-process one.
#[derive(Debug)]
struct Wrapped(MemoryStore);

impl Store for Wrapped {
    fn check(&self, check: &Check) -> StoreFuture {
        self.0.check(check)
    }
}

/// `with_store` on a `MemoryStore` is `new` without Redis: decided in
/// process, with no breaker in front (a store that cannot fail); a store
/// of the application's own, even around one, has a breaker.
#[tokio::test]
async fn with_store_on_the_in_process_store_is_in_memory() {
    let cfg = Config::from_toml_str(LIMITS).unwrap();
    let in_memory = RateLimitLayer::new(cfg.clone()).await.unwrap();
    let memory = Arc::new(MemoryStore::new(100));
    let on_memory = RateLimitLayer::with_store(cfg.clone(), memory)
        .await
        .unwrap();
    let wrapped = RateLimitLayer::with_store(cfg.clone(), Arc::new(Wrapped(MemoryStore::new(100))));
    let wrapped = wrapped.await.unwrap();
    assert!(in_memory.breaker().is_none());
    assert!(on_memory.breaker().is_none());
    assert!(wrapped.breaker().is_some());
    for layer in [in_memory, on_memory, wrapped] {
        assert_eq!(statuses(&ok_routes(layer, ["/"]), 3).await, [200, 200, 429]);
    }
    // Given the in-process store with a builder's setting, the same.
    let built = RateLimitLayer::with_store(cfg, Arc::new(MemoryStore::new(100)))
        .on_refusal(|r| r.into_default_response())
        .await
        .unwrap();
    assert!(built.breaker().is_none());
}

/// Every way of making a layer refuses a custom key it has no extractor
/// for, with one error (see also tests/custom_keys.rs).
#[tokio::test]
async fn every_constructor_refuses_the_same_configuration_alike() {
    let src = LIMITS.replace("header:x-api-key", "custom:tenant");
    let cfg = Config::from_toml_str(&src).unwrap();
    let errors = [
        RateLimitLayer::new(cfg.clone()).await.unwrap_err(),
        RateLimitLayer::with_store(cfg.clone(), Arc::new(MemoryStore::new(10)))
            .on_refusal(|r| r.into_default_response())
            .await
            .unwrap_err(),
        RateLimitLayer::new(cfg.clone()).await.unwrap_err(),
        RateLimitLayer::with_store(cfg.clone(), Arc::new(MemoryStore::new(10)))
            .await
            .unwrap_err(),
        RateLimitLayer::with_store(cfg.clone(), Arc::new(Wrapped(MemoryStore::new(10))))
            .await
            .unwrap_err(),
    ];
    for e in &errors {
        let BuildError::Config(c) = e else {
            panic!("{e}");
        };
        assert_eq!(c.line(), Some(3), "{c}");
        assert_eq!(e, &errors[0]);
    }
}

/// `[regions]` and a global limit, from a file and from code, are one
/// configuration: the file is lowered into the builder the code uses.
#[cfg(feature = "redis")]
#[test]
fn regions_from_a_file_and_from_code_are_one_configuration() {
    use fleetlimit::configuration::{KeySource, LimitConfig, Rate, RouteConfig};
    let file = Config::from_toml_str(
        r#"
[redis]
url = "redis://127.0.0.1:6379"

[regions]
this = "us"
interval = "500ms"

[regions.exchange]
eu = "redis://:secret@10.0.0.1:6379"
us = "redis://10.1.0.1:6379"

[limits.per-key]
key = "header:x-api-key"
capacity = 100
refill = "10/s"
scope = "global"
split = { eu = 0.25, us = 0.75 }

[limits.per-ip]
key = "ip"
capacity = 10
refill = "1/s"
scope = "global"

[[routes]]
path = "/"
limits = ["per-key", "per-ip"]
"#,
    )
    .unwrap();
    let code = Config::builder()
        .redis_url("redis://127.0.0.1:6379")
        .this_region("us")
        .region("eu", "redis://:secret@10.0.0.1:6379")
        .region("us", "redis://10.1.0.1:6379")
        .region_interval(Duration::from_millis(500))
        // The file's limits come sorted by name.
        .limit(
            "per-ip",
            LimitConfig::token_bucket(KeySource::ClientIp, 10, Rate::per_second(1)).global(),
        )
        .limit(
            "per-key",
            LimitConfig::token_bucket(KeySource::header("x-api-key"), 100, Rate::per_second(10))
                .global_split([("eu", 0.25), ("us", 0.75)]),
        )
        .route("/", RouteConfig::new(["per-key", "per-ip"]))
        .build()
        .unwrap();
    assert_eq!(file.describe(), code.describe());
    assert_eq!(format!("{file:?}"), format!("{code:?}"));
    let d = file.describe();
    assert!(d.contains("global limits: "), "{d}");
    assert!(d.contains("per-key (eu 25%, us 75%)"), "{d}");
    assert!(d.contains("per-ip (eu 50%, us 50%)"), "{d}");
    // The exchange URL's password is in neither.
    assert!(!d.contains(":secret@"), "{d}");
    assert!(!format!("{file:?}").contains(":secret@"), "{file:?}");
}
