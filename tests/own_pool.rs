//! A layer on a fred pool the application built itself
//! (`RedisStore::from_pool`): its scripts loaded, decisions in Redis, the
//! deadline applied to its calls.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use fleetlimit::RateLimitLayer;
use fleetlimit::store::RedisStore;
use fred::prelude::{Builder, ClientLike, Config as FredConfig, ReconnectPolicy};
use support::*;

const LIMITS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 3
refill = "1/h"

[limits.global]
key = "global"
capacity = 100
refill = "1/h"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "closed"

[[routes]]
path = "/both"
limits = ["per-key", "global"]
on_redis_error = "closed"
"#;

/// The pool as an application would build it, then the layer on it.
async fn app(server: &RedisServer, prefix: &str) -> Router {
    let cfg = redis_config(server, prefix, "500ms", LIMITS);
    let pool = Builder::from_config(FredConfig::from_url(&server.url()).unwrap())
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(1))
        .set_policy(ReconnectPolicy::new_exponential(0, 20, 1_000, 2))
        .build_pool(2)
        .unwrap();
    pool.init().await.unwrap();
    let store = RedisStore::from_pool(pool, &cfg).await.unwrap();
    let layer = RateLimitLayer::with_store(cfg, Arc::new(store))
        .await
        .unwrap();
    support::ok_routes(layer, ["/", "/both"])
}

#[tokio::test]
async fn a_layer_on_the_applications_own_pool_admits_then_refuses() {
    let server = RedisServer::start();
    let prefix = prefix("own-pool");
    let app = app(&server, &prefix).await;
    // The scripts were loaded by `from_pool`.
    let loaded = server
        .cli(&[
            "SCRIPT",
            "EXISTS",
            &RedisStore::lean_script_sha(),
            &RedisStore::one_check_script_sha(),
            &RedisStore::script_sha(),
        ])
        .unwrap();
    assert_eq!(
        loaded.split_whitespace().collect::<Vec<_>>(),
        ["1", "1", "1"]
    );

    let from =
        |path: &str, key: &str| request("GET", path, "127.0.0.1:1000", &[("x-api-key", key)]);
    // One token bucket (the lean script, coalesced).
    for expected in (0..3).rev() {
        let res = send(&app, from("/", "alice")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), expected);
    }
    assert_eq!(send(&app, from("/", "alice")).await.status(), 429);
    // Two limits (the decision script): bob's own bucket runs out first.
    for _ in 0..3 {
        assert_eq!(send(&app, from("/both", "bob")).await.status(), 200);
    }
    assert_eq!(send(&app, from("/both", "bob")).await.status(), 429);
    // Counted in Redis, not in this process.
    let keys = server.keys_with_pttl(&prefix);
    assert_eq!(keys.len(), 3, "{keys:?}");
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn the_deadline_applies_to_the_applications_pool() {
    let server = RedisServer::start();
    let prefix = prefix("own-pool-down");
    let app = app(&server, &prefix).await;
    let alice = || request("GET", "/", "127.0.0.1:1000", &[("x-api-key", "alice")]);
    assert_eq!(send(&app, alice()).await.status(), 200);

    // Frozen: `closed` answers 503 at the 500 ms deadline, not at the
    // pool's own 1 s command timeout.
    server.freeze();
    let started = Instant::now();
    assert_eq!(send(&app, alice()).await.status(), 503);
    let took = started.elapsed();
    server.thaw();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(900),
        "{took:?}"
    );

    // Gone: answered by the failure policy too (at once when fred already
    // saw the connection close, else at the deadline).
    server.kill();
    let started = Instant::now();
    assert_eq!(send(&app, alice()).await.status(), 503);
    let took = started.elapsed();
    assert!(took < Duration::from_millis(900), "{took:?}");
}
