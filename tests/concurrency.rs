//! Exact under concurrency: separate "servers" (each its own layer and fred
//! pool) hammering one key admit exactly the capacity.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

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

/// Two checks of one key coalesced into one call see each other's charge
/// (the lean script's repeated-key flag, `d`): with room for one more,
/// exactly one of the two is admitted; with room for both, the key holds
/// both charges. Slow refill (1/day) keeps the answers far from timing.
#[tokio::test(flavor = "current_thread")]
async fn two_checks_of_one_key_in_one_call_see_each_other() {
    use std::time::Duration;

    use fleetlimit::store::{Bucket, Check, Rule, Store};

    let server = RedisServer::start();
    let store = server.coalescing_store(Duration::from_secs(2)).await;
    let day_us = 86_400e6;
    let check = |key: &str, capacity: f64| Check {
        cost: 1.0,
        slot: None,
        buckets: vec![Bucket {
            key: key.into(),
            rule: Rule::TokenBucket {
                capacity,
                refill_per_sec: 1.0 / 86_400.0,
            },
            shadow: false,
        }],
    };
    // {one} has room for exactly one more; {two} for both.
    let spent = store.check(&check("rl:pair:{one}", 2.0)).await.unwrap();
    assert!(spent.allowed, "{spent:?}");
    server.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    for (key, admitted) in [("rl:pair:{one}", 1), ("rl:pair:{two}", 2)] {
        server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
        server.cli(&["SLOWLOG", "RESET"]).unwrap();
        // Nothing runs on this runtime until they are joined: the first
        // check's call goes alone (nothing was in flight), and the two
        // after it wait in the queue, taken together into one call.
        let lead = store.check(&check("rl:pair:{lead}", 1_000.0));
        let a = store.check(&check(key, 2.0));
        let b = store.check(&check(key, 2.0));
        let (lead, a, b) = tokio::join!(lead, a, b);
        assert!(lead.unwrap().allowed);
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(server.calls_of("evalsha"), 2, "{a:?} {b:?}");
        // The two checks' call named the key twice, and carried the flag.
        let log = server.cli(&["SLOWLOG", "GET", "100"]).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        // Each entry: id, time, duration, the command's words, the
        // client's address, its (empty) name.
        let pair = lines
            .split(|l| *l == "EVALSHA")
            .skip(1)
            .map(|rest| rest.split(|l| l.is_empty()).next().unwrap_or_default())
            .find(|call| call.iter().filter(|l| **l == key).count() == 2)
            .unwrap_or_else(|| panic!("no call with {key} twice:\n{log}"));
        assert!(pair.contains(&"d"), "no repeated-key flag:\n{log}");
        assert_eq!(
            usize::from(a.allowed) + usize::from(b.allowed),
            admitted,
            "{key}: {a:?} {b:?}"
        );
        // Decided in order: the first of the two was admitted.
        assert!(a.allowed, "{a:?}");
        assert_eq!(b.limits[0].remaining.floor(), 0.0, "{b:?}");
        // Two charges stored (for {one}, the earlier one and the first of
        // the pair), a day each from when the bucket was full.
        let stored = server.tat(key).unwrap();
        let time = server.cli(&["TIME"]).unwrap();
        let mut t = time.lines().map(|l| l.trim().parse::<f64>().unwrap());
        let now_us = t.next().unwrap() * 1e6 + t.next().unwrap();
        let owed = (stored - now_us) / day_us;
        assert!((owed - 2.0).abs() < 1e-3, "{key}: {owed} days owed");
    }
    server.assert_every_key_expires("rl:pair");
}
