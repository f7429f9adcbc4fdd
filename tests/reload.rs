//! Hot reload (`RateLimitLayer::reload_handle`): a new configuration applies
//! from the next request while traffic flows, buckets of unchanged limits
//! keep their counts, and what cannot change live is refused by name while
//! the running configuration goes on serving. On a real Redis and on the
//! in-process store.
// Its Redis tests need the `redis` feature; their helpers are unused without it.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports))]

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::get;
use fleetlimit::reload::{ReloadError, ReloadHandle};
use fleetlimit::{Config, RateLimitLayer};
use support::stats::Parts;
use support::*;

/// `lowered` (route `/a`) and `kept` (route `/b`), both per API key and
/// refilling one token an hour (nothing refills during a test).
fn limits(lowered: u32) -> String {
    format!(
        r#"
[limits.lowered]
key = "header:x-api-key"
capacity = {lowered}
refill = "1/h"

[limits.kept]
key = "header:x-api-key"
capacity = 1000
refill = "1/h"

[[routes]]
path = "/a"
limits = ["lowered"]
on_redis_error = "closed"

[[routes]]
path = "/b"
limits = ["kept"]
on_redis_error = "closed"
"#
    )
}

fn app(layer: RateLimitLayer) -> Router {
    // The handler yields, so requests overlap in flight.
    let handler = || async {
        tokio::task::yield_now().await;
        "ok"
    };
    Router::new()
        .route("/a", get(handler))
        .route("/b", get(handler))
        .layer(layer)
}

fn get_as(path: &str, key: &str) -> http::Request<axum::body::Body> {
    request("GET", path, "10.0.0.1:1000", &[("x-api-key", key)])
}

/// A response: (sent after the reload returned, status, X-RateLimit-Limit).
type Seen = (bool, u16, Option<String>);

/// Eight tasks send requests to `/a` continuously (limit `lowered`, 1000);
/// once 60 are admitted the limit is lowered to 50 by a reload. Every
/// request started after `reload` returned must be refused (the key has
/// spent more than 50), say `limit 50`, and nothing may fail. `/b`'s
/// `kept` limit goes on counting where it was.
async fn lowered_under_traffic(app: Router, reload: ReloadHandle, next: Config) {
    // `kept`, counted before the reload.
    for i in 1..=5u64 {
        let res = send(&app, get_as("/b", "steady")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 1000 - i);
    }

    let admitted = Arc::new(AtomicU64::new(0));
    let reloaded = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (app, admitted, reloaded, stop, seen) = (
            app.clone(),
            Arc::clone(&admitted),
            Arc::clone(&reloaded),
            Arc::clone(&stop),
            Arc::clone(&seen),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let after = reloaded.load(Ordering::SeqCst);
                let res = send(&app, get_as("/a", "busy")).await;
                if res.status() == 200 {
                    admitted.fetch_add(1, Ordering::SeqCst);
                }
                let limit = header(&res, "x-ratelimit-limit");
                seen.lock()
                    .unwrap()
                    .push((after, res.status().as_u16(), limit));
                // A refusal answered in process never waits: let the others run.
                tokio::task::yield_now().await;
            }
        }));
    }
    while admitted.load(Ordering::SeqCst) < 60 {
        tokio::task::yield_now().await;
    }
    let changes = reload.reload(next).unwrap();
    reloaded.store(true, Ordering::SeqCst);
    assert_eq!(changes.limits_changed(), ["lowered"]);
    assert!(changes.limits_restarted().is_empty(), "{changes}");
    assert_eq!(changes.to_string(), "limits changed: lowered");
    // Traffic goes on for a while under the new configuration.
    loop {
        let after = seen.lock().unwrap().iter().filter(|s| s.0).count();
        if after >= 200 {
            break;
        }
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let failed: Vec<_> = seen.iter().filter(|s| s.1 != 200 && s.1 != 429).collect();
    assert!(
        failed.is_empty(),
        "requests failed during the swap: {failed:?}"
    );
    let after: Vec<_> = seen.iter().filter(|s| s.0).collect();
    let admitted_after = after.iter().filter(|s| s.1 == 200).count();
    assert_eq!(
        admitted_after,
        0,
        "admitted past the new limit of 50 after {} admitted",
        admitted.load(Ordering::SeqCst)
    );
    assert!(
        after.iter().all(|s| s.2.as_deref() == Some("50")),
        "every request after the reload under the new limit"
    );
    assert!(
        seen.iter().any(|s| !s.0 && s.1 == 200),
        "admitted before the reload"
    );

    // `kept` was not reset to full by the reload.
    let res = send(&app, get_as("/b", "steady")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 994);
}

#[tokio::test(start_paused = true)]
async fn in_process_a_lowered_limit_applies_from_the_next_request() {
    let cfg = Config::from_toml_str(&limits(1000)).unwrap();
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    let reload = layer.reload_handle();
    let next = Config::from_toml_str(&limits(50)).unwrap();
    lowered_under_traffic(app(layer), reload, next).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_a_lowered_limit_applies_from_the_next_request() {
    let server = RedisServer::start();
    let prefix = prefix("lowered");
    // A generous deadline: a `closed` route would turn a failed check into
    // a 503, which the test counts as a failure.
    let cfg = redis_config(&server, &prefix, "500ms", &limits(1000));
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    let reload = layer.reload_handle();
    let next = redis_config(&server, &prefix, "500ms", &limits(50));
    lowered_under_traffic(app(layer), reload, next).await;
    // Still the same two buckets, both with their expiry.
    assert_eq!(server.keys_with_pttl(&prefix).len(), 2);
    server.assert_every_key_expires(&prefix);
}

#[cfg(feature = "redis")]
/// The Redis URL and the key prefix cannot change live: both are named,
/// and the old configuration keeps deciding on the old Redis.
#[tokio::test]
async fn moving_redis_or_the_prefix_is_refused_by_name() {
    let server = RedisServer::start();
    let other = RedisServer::start();
    let prefix = prefix("moved");
    let layer = RateLimitLayer::new(redis_config(&server, &prefix, "500ms", &limits(3)))
        .await
        .unwrap();
    let reload = layer.reload_handle();
    let app = app(layer);
    assert_eq!(send(&app, get_as("/a", "k")).await.status(), 200);

    // Lowered to 1 too: none of it may apply.
    let moved = redis_config(&other, &format!("{prefix}-new"), "500ms", &limits(1));
    let err = reload.reload(moved).unwrap_err();
    let ReloadError::NeedsRestart(items) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(
        items[0],
        format!("[redis] url ({} → {})", server.url(), other.url())
    );
    assert!(items[1].starts_with("[redis] key_prefix"), "{items:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("[redis] url") && msg.contains("[redis] key_prefix"),
        "{msg}"
    );
    assert!(msg.contains("running configuration is kept"), "{msg}");

    let prefix_only = redis_config(&server, &format!("{prefix}-new"), "500ms", &limits(1));
    let err = reload.reload(prefix_only).unwrap_err().to_string();
    assert!(
        err.contains("[redis] key_prefix") && !err.contains("url"),
        "{err}"
    );

    // Still capacity 3, on the first server, under the first prefix.
    let statuses = [
        send(&app, get_as("/a", "k")).await.status(),
        send(&app, get_as("/a", "k")).await.status(),
        send(&app, get_as("/a", "k")).await.status(),
    ];
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(server.keys_with_pttl(&prefix).len(), 1);
    assert!(other.keys_with_pttl("").is_empty());
}

/// A file that does not parse is an error of `Config` (with its line), so
/// it never reaches the layer; a configuration that parses but that the
/// layer could not run as it is is refused by the reload.
#[tokio::test(start_paused = true)]
async fn bad_configurations_never_replace_the_running_one() {
    let layer = RateLimitLayer::new(Config::from_toml_str(&limits(2)).unwrap())
        .await
        .unwrap();
    let reload = layer.reload_handle();
    let app = app(layer);

    let broken = limits(1).replace("capacity = 1\n", "capacity = \n");
    let err = Config::from_toml_str(&broken).unwrap_err().to_string();
    assert!(err.starts_with("line 4, column 12"), "{err}");

    // In-process layer: Redis, even at a URL that would not connect, is a
    // restart (and a build without Redis refuses the URL itself); so is the
    // size of the in-process store.
    let to_redis = Config::from_toml_str(&limits(1))
        .unwrap()
        .try_with_redis_url("redis://127.0.0.1:1");
    if cfg!(feature = "redis") {
        let err = reload.reload(to_redis.unwrap()).unwrap_err().to_string();
        assert!(err.contains("[redis] (added"), "{err}");
    } else {
        let err = to_redis.unwrap_err().to_string();
        assert!(err.contains("no Redis support"), "{err}");
    }
    let bigger = format!("[memory]\nmax_keys = 5\n{}", limits(1));
    let err = reload
        .reload(Config::from_toml_str(&bigger).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("[memory] max_keys (100000 → 5)"), "{err}");
    let shedding = format!("[shedding]\nmax_in_flight = 10\n{}", limits(1));
    let err = reload
        .reload(Config::from_toml_str(&shedding).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("[shedding]"), "{err}");

    // Still capacity 2.
    let statuses = [
        send(&app, get_as("/a", "k")).await.status(),
        send(&app, get_as("/a", "k")).await.status(),
        send(&app, get_as("/a", "k")).await.status(),
    ];
    assert_eq!(statuses, [200, 200, 429]);

    // And a handle outlives its layer harmlessly.
    drop(app);
    let err = reload.reload(Config::from_toml_str(&limits(1)).unwrap());
    assert!(matches!(err, Err(ReloadError::LayerDropped)), "{err:?}");
}

/// What a reload reports, and what it does to a limit whose algorithm or
/// key changed (counted afresh), a new route and a removed one.
#[tokio::test(start_paused = true)]
async fn changes_are_reported_and_applied() {
    let layer = RateLimitLayer::new(Config::from_toml_str(&limits(2)).unwrap())
        .await
        .unwrap();
    let reload = layer.reload_handle();
    let app = Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }))
        .route("/c", get(|| async { "c" }))
        .layer(layer);
    for _ in 0..2 {
        assert_eq!(send(&app, get_as("/a", "k")).await.status(), 200);
    }
    assert_eq!(send(&app, get_as("/a", "k")).await.status(), 429);

    // `lowered` becomes a fixed window: its callers start afresh. `kept`
    // is gone with `/b`; `/c` is new, with a new limit.
    let next = r#"
[limits.lowered]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 3
window = "1h"

[limits.fresh]
key = "ip"
capacity = 1
refill = "1/h"

[[routes]]
path = "/a"
limits = ["lowered"]
on_redis_error = "closed"

[[routes]]
path = "/c"
methods = ["GET"]
limits = ["fresh"]

[headers]
style = "ietf"
"#;
    let changes = reload.reload(Config::from_toml_str(next).unwrap()).unwrap();
    assert_eq!(changes.limits_added(), ["fresh"]);
    assert_eq!(changes.limits_removed(), ["kept"]);
    assert_eq!(changes.limits_changed(), ["lowered"]);
    assert_eq!(changes.limits_restarted(), ["lowered"]);
    assert_eq!(changes.routes_added(), ["GET /c"]);
    assert_eq!(changes.routes_removed(), ["* /b"]);
    assert!(changes.routes_changed().is_empty(), "{changes}");
    assert_eq!(changes.settings_changed(), ["[headers] style"]);
    assert_eq!(
        changes.to_string(),
        "limits added: fresh; limits removed: kept; \
         limits changed: lowered (key or algorithm changed: counted afresh); \
         routes added: GET /c; routes removed: * /b; settings changed: [headers] style"
    );

    let statuses = [
        send(&app, get_as("/a", "k")).await.status(),
        send(&app, get_as("/a", "k")).await.status(),
        send(&app, get_as("/a", "k")).await.status(),
        send(&app, get_as("/a", "k")).await.status(),
    ];
    assert_eq!(statuses, [200, 200, 200, 429], "a fresh window of 3");
    let b = send(&app, get_as("/b", "k")).await;
    assert_eq!(b.status(), 200);
    assert!(header(&b, "ratelimit").is_none(), "/b is no longer limited");
    let c = send(&app, get_as("/c", "k")).await;
    assert_eq!(
        header(&c, "ratelimit-policy").as_deref(),
        Some("\"fresh\";q=1;w=3600")
    );
    assert!(header(&c, "x-ratelimit-limit").is_none(), "ietf style only");
    assert_eq!(send(&app, get_as("/c", "k")).await.status(), 429);

    // The same configuration again changes nothing.
    let same = reload.reload(Config::from_toml_str(next).unwrap()).unwrap();
    assert!(same.is_empty());
    assert_eq!(same.to_string(), "nothing changed");
}

/// The builder's extras carry over: a cost function (unused while its
/// route is gone, used again when it is back) and the refusal hook.
#[tokio::test(start_paused = true)]
async fn builder_extras_carry_over() {
    let layer = RateLimitLayer::new(Config::from_toml_str(&limits(10)).unwrap())
        .cost_fn("/a", |_| 4)
        .on_refusal(|r| {
            http::Response::builder()
                .status(r.default_response().status())
                .body(bytes::Bytes::from_static(b"hooked"))
                .unwrap()
        })
        .await
        .unwrap();
    let reload = layer.reload_handle();
    let app = app(layer);
    let res = send(&app, get_as("/a", "k")).await;
    assert_eq!(
        header_u64(&res, "x-ratelimit-remaining"),
        1,
        "cost 4: 6 tokens are one request"
    );

    // `/a` is gone: its cost function has no route, which is fine.
    let without_a = limits(10).replace("path = \"/a\"", "path = \"/z\"");
    let changes = reload
        .reload(Config::from_toml_str(&without_a).unwrap())
        .unwrap();
    assert_eq!(changes.routes_added(), ["* /z"]);
    assert_eq!(changes.routes_removed(), ["* /a"]);
    assert!(header(&send(&app, get_as("/a", "k")).await, "x-ratelimit-limit").is_none());

    // Back, at 5: the same bucket (4 spent, 1 left), the same cost.
    let changes = reload
        .reload(Config::from_toml_str(&limits(5)).unwrap())
        .unwrap();
    assert_eq!(changes.limits_changed(), ["lowered"]);
    let res = send(&app, get_as("/a", "k")).await;
    assert_eq!(res.status(), 429, "cost 4 with 1 left");
    assert_eq!(body_text(res).await, "hooked");
}

#[cfg(feature = "redis")]
/// Turning `record` on by a reload starts the decision recorder.
#[tokio::test]
async fn a_reload_can_turn_decision_records_on() {
    let server = RedisServer::start();
    let prefix = prefix("records");
    let layer = RateLimitLayer::new(redis_config(&server, &prefix, "500ms", &limits(5)))
        .await
        .unwrap();
    assert_eq!(layer.records(), None);
    let recorded = limits(5).replace("capacity = 5\n", "capacity = 5\nrecord = true\n");
    let changes = layer
        .reload_handle()
        .reload(redis_config(&server, &prefix, "500ms", &recorded))
        .unwrap();
    assert_eq!(changes.limits_changed(), ["lowered"]);
    let app = app(layer.clone());
    assert_eq!(send(&app, get_as("/a", "k")).await.status(), 200);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while layer.records().map_or(0, |r| r.written) < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            layer.records()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let stream = format!("{prefix}:record:{{lowered}}");
    assert_eq!(
        server.cli(&["XLEN", &stream]).as_deref().map(str::trim),
        Some("1")
    );
}

#[cfg(feature = "redis")]
/// `fleetlimit reset` reaches the remembered refusals of the configuration
/// running after a reload, not only of the one the layer was built with.
#[tokio::test]
async fn a_reset_reaches_the_reloaded_configuration() {
    let server = RedisServer::start();
    let prefix = prefix("reset");
    let cfg = redis_config(&server, &prefix, "500ms", &limits(2));
    let layer = RateLimitLayer::new(cfg.clone()).await.unwrap();
    let admin = fleetlimit::admin::Admin::connect(&cfg).await.unwrap();
    let reload = layer.reload_handle();
    let app = app(layer);
    let next = redis_config(&server, &prefix, "500ms", &limits(1));
    reload.reload(next).unwrap();

    assert_eq!(send(&app, get_as("/a", "k")).await.status(), 200);
    assert_eq!(send(&app, get_as("/a", "k")).await.status(), 429);
    // Remembered: answered without Redis, for the hour a token takes.
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    assert_eq!(send(&app, get_as("/a", "k")).await.status(), 429);
    assert_eq!(server.script_calls(), 0, "answered from the refused cache");

    assert_eq!(admin.reset("k", None).await, Ok(1));
    // The same bound as tests/reset_reach.rs.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        if send(&app, get_as("/a", "k")).await.status() == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reset did not reach the running configuration's cache"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A custom key needs an extractor registered on the builder, which a
/// reload cannot add: such a configuration is refused like at build time,
/// naming the limit, and the running one goes on; one whose extractor is
/// registered applies.
#[tokio::test(start_paused = true)]
async fn a_custom_key_without_its_extractor_is_refused() {
    let layer = RateLimitLayer::new(Config::from_toml_str(&limits(10)).unwrap())
        .key_fn("tenant", |req: &fleetlimit::RequestRef<'_>| {
            fleetlimit::KeyAnswer::from(req.headers().get("x-tenant").and_then(|v| v.to_str().ok()))
        })
        .await
        .unwrap();
    let reload = layer.reload_handle();
    let app = app(layer);
    let by = |name: &str| {
        limits(2).replacen(
            "key = \"header:x-api-key\"",
            &format!("key = \"custom:{name}\""),
            1,
        )
    };

    let err = reload
        .reload(Config::from_toml_str(&by("region")).unwrap())
        .unwrap_err();
    assert!(matches!(err, ReloadError::Invalid(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("\"lowered\"") && text.contains("region"),
        "{text}"
    );
    // Still the running configuration: capacity 10, by API key.
    let res = send(&app, get_as("/a", "k")).await;
    assert_eq!(header_u64(&res, "x-ratelimit-limit"), 10);

    reload
        .reload(Config::from_toml_str(&by("tenant")).unwrap())
        .unwrap();
    let tenant = |t: &str| {
        let mut req = get_as("/a", "k");
        req.headers_mut().insert("x-tenant", t.parse().unwrap());
        req
    };
    let codes = [
        send(&app, tenant("acme")).await.status().as_u16(),
        send(&app, tenant("acme")).await.status().as_u16(),
        send(&app, tenant("acme")).await.status().as_u16(),
        send(&app, tenant("other")).await.status().as_u16(),
    ];
    assert_eq!(codes, [200, 200, 429, 200]);
}

/// A layer built without the builder has no extractors: a reload to a
/// custom-keyed limit is refused with the error its construction gets, and
/// the running configuration goes on.
#[tokio::test(start_paused = true)]
async fn a_layer_built_without_the_builder_reloads_custom_keys_as_it_was_built() {
    let custom = limits(2).replacen("key = \"header:x-api-key\"", "key = \"custom:tenant\"", 1);
    let custom = Config::from_toml_str(&custom).unwrap();
    let refused = RateLimitLayer::new(custom.clone()).await.unwrap_err();
    let layer = RateLimitLayer::new(Config::from_toml_str(&limits(2)).unwrap())
        .await
        .unwrap();
    let reload = layer.reload_handle();
    let app = app(layer);
    match reload.reload(custom) {
        Err(ReloadError::Invalid(e)) => assert_eq!(fleetlimit::BuildError::Config(e), refused),
        other => panic!("{other:?}"),
    }
    let statuses = [
        send(&app, get_as("/a", "k")).await.status(),
        send(&app, get_as("/a", "k")).await.status(),
        send(&app, get_as("/a", "k")).await.status(),
    ];
    assert_eq!(statuses, [200, 200, 429]);
}
