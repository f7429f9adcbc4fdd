//! Exact under concurrency: separate "servers" (each its own layer and fred
//! pool) hammering one key admit exactly the capacity.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

mod support;

use support::*;

const LIMITS: &str = r#"
[limits.hot]
key = "header:x-api-key"
capacity = 50
refill = "1/d"

[[routes]]
path = "/"
limits = ["hot"]
on_redis_error = "closed"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_servers_400_requests_exactly_50_admitted() {
    let server = RedisServer::start();
    let prefix = prefix("concurrency");
    let mut servers = Vec::new();
    for _ in 0..4 {
        // Generous deadline: a store failure shows as a 503 on this closed
        // route, and the test counts those too.
        let cfg = redis_config(&server, &prefix, "2s", LIMITS);
        servers.push(ok_app(cfg).await);
    }
    let mut tasks = Vec::new();
    for i in 0..400 {
        let app = servers[i % 4].clone();
        tasks.push(tokio::spawn(async move {
            send(
                &app,
                request("GET", "/", "127.0.0.1:9", &[("x-api-key", "shared")]),
            )
            .await
            .status()
            .as_u16()
        }));
    }
    let mut counts = std::collections::BTreeMap::new();
    for t in tasks {
        *counts.entry(t.await.unwrap()).or_insert(0) += 1;
    }
    assert_eq!(counts.get(&200), Some(&50), "{counts:?}");
    assert_eq!(counts.get(&429), Some(&350), "{counts:?}");
    assert_eq!(counts.len(), 2, "nothing but 200 and 429: {counts:?}");
    server.assert_every_key_expires(&prefix);
}

/// 300 concurrent requests over 30 keys of capacity 5, on one layer: how
/// many were admitted, and how many script calls Redis saw. The refused-key
/// cache is off, so every check reaches Redis one way or another.
async fn three_hundred_checks(coalesce: bool) -> (usize, u64) {
    let server = RedisServer::start();
    let prefix = prefix("coalesce");
    let body = format!(
        "refused_cache_keys = 0\ncoalesce = {coalesce}\n{}",
        LIMITS.replace("capacity = 50", "capacity = 5")
    );
    let app = ok_app(redis_config(&server, &prefix, "2s", &body)).await;
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    let mut tasks = Vec::new();
    for i in 0..300 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("k{}", i % 30);
            send(
                &app,
                request("GET", "/", "127.0.0.1:9", &[("x-api-key", &key)]),
            )
            .await
            .status()
            .as_u16()
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        let s = t.await.unwrap();
        assert!(s == 200 || s == 429, "{s}");
        admitted += usize::from(s == 200);
    }
    server.assert_every_key_expires(&prefix);
    (admitted, server.script_calls())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_decisions_stay_exact_and_take_fewer_calls() {
    let (admitted, one_each) = three_hundred_checks(false).await;
    // 30 keys × capacity 5, whatever the batching.
    assert_eq!(admitted, 150);
    assert_eq!(one_each, 300, "without coalescing, one call per check");
    let (admitted, calls) = three_hundred_checks(true).await;
    assert_eq!(admitted, 150);
    println!("coalesced: {calls} script calls for 300 checks");
    assert!(
        calls <= 150,
        "concurrent checks were coalesced: {calls} script calls for 300 checks"
    );
}
