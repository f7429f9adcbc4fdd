//! On a Redis Cluster a fault stays the size of its cause: with one of
//! three primaries dead, keys owned by the two healthy primaries are still
//! decided by Redis, and only the dead primary's keys follow their route's
//! failure policy (each primary has its own circuit breaker).
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{get, post};
use fleetlimit::RateLimitLayer;
use support::stats::Parts;
use support::*;

/// Slow refills: a key lives an hour after its first request (so it can
/// be found on its primary), and no client comes near the capacity.
const LIMITS: &str = r#"
[limits.closed]
key = "account:x-account"
capacity = 10000
refill = "1/h"

[limits.open]
key = "account:x-account"
capacity = 10000
refill = "1/h"

[[routes]]
path = "/sign-in"
limits = ["closed"]
on_redis_error = "closed"

[[routes]]
path = "/"
limits = ["open"]
on_redis_error = "open"
"#;

const ACCOUNTS: usize = 60;

#[derive(Default, Debug)]
struct Seen {
    answers: u32,
    decided: u32,
    unavailable: u32,
    other: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_dead_primary_degrades_only_its_own_keys() {
    init_tracing();
    // The healthy primaries keep serving their slots while one is down
    // (by default a cluster that lost slots refuses every command).
    let cluster = RedisCluster::start_with(&["--cluster-require-full-coverage", "no"]);
    let prefix = prefix("node-down");
    // A deadline far above this machine's scheduling noise: what is tested
    // is where failures are attributed (the dead primary refuses
    // connections at once), not how late answers may be.
    let layer = RateLimitLayer::new(cluster_config(&cluster, &prefix, "100ms", LIMITS))
        .await
        .unwrap();
    let app = Router::new()
        .route("/sign-in", post(|| async { "welcome" }))
        .route("/", get(|| async { "home" }))
        .layer(layer.clone());

    // Every account once, to learn which primary owns its keys.
    let accounts: Vec<String> = (0..ACCOUNTS).map(|i| format!("acct-{i}")).collect();
    for a in &accounts {
        let res = send(
            &app,
            request("POST", "/sign-in", "127.0.0.1:6000", &[("x-account", a)]),
        )
        .await;
        assert_eq!(res.status(), 200, "{a} before the fault");
    }
    let mut owner: HashMap<&str, usize> = HashMap::new();
    // redis-cli may fail on a busy machine: a few rounds, bounded.
    for _ in 0..5 {
        for (i, node) in cluster.nodes.iter().enumerate() {
            for (key, _) in node.keys_with_pttl(&prefix) {
                if let Some(a) = accounts.iter().find(|a| key.ends_with(&format!(":{a}}}"))) {
                    owner.insert(a.as_str(), i);
                }
            }
        }
        if owner.len() == ACCOUNTS {
            break;
        }
    }
    assert_eq!(owner.len(), ACCOUNTS, "every account has an owner");
    let dead = 1;
    assert!(
        owner.values().any(|&n| n == dead) && owner.values().any(|&n| n != dead),
        "accounts on the dead primary and on healthy ones: {owner:?}"
    );

    cluster.nodes[dead].kill();
    let fault = Instant::now();
    // Four clients cycling through every account on both routes for 3 s
    // (more than the cluster's node timeout, so it marks the node failed).
    let mut tasks = Vec::new();
    for client in 0..4 {
        let (app, accounts, owner) = (app.clone(), accounts.clone(), owner.clone());
        let owner: HashMap<String, usize> =
            owner.into_iter().map(|(a, n)| (a.to_owned(), n)).collect();
        tasks.push(tokio::spawn(async move {
            let mut seen: HashMap<(bool, &'static str), Seen> = HashMap::new();
            let mut i = client;
            while fault.elapsed() < Duration::from_secs(3) {
                let a = &accounts[i % ACCOUNTS];
                i += 1;
                for (method, path) in [("POST", "/sign-in"), ("GET", "/")] {
                    let res = send(
                        &app,
                        request(method, path, "127.0.0.1:6000", &[("x-account", a)]),
                    )
                    .await;
                    let s = seen.entry((owner[a] == dead, path)).or_default();
                    s.answers += 1;
                    s.decided += u32::from(header(&res, "x-ratelimit-limit").is_some());
                    match res.status().as_u16() {
                        200 => {}
                        503 => {
                            assert!(header(&res, "retry-after").is_some());
                            s.unavailable += 1;
                        }
                        _ => s.other += 1,
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            seen
        }));
    }
    let mut seen: HashMap<(bool, &'static str), Seen> = HashMap::new();
    for t in tasks {
        for (k, s) in t.await.unwrap() {
            let all = seen.entry(k).or_default();
            all.answers += s.answers;
            all.decided += s.decided;
            all.unavailable += s.unavailable;
            all.other += s.other;
        }
    }
    let nodes = layer.nodes();
    println!("node down: {seen:?}\nbreakers {nodes:?}");

    for path in ["/sign-in", "/"] {
        let healthy = &seen[&(false, path)];
        assert!(healthy.answers >= 100, "too little traffic: {healthy:?}");
        assert_eq!(healthy.other, 0, "{path}: {healthy:?}");
        assert_eq!(
            healthy.unavailable, 0,
            "{path}: keys on healthy primaries were refused: {healthy:?}"
        );
        assert!(
            healthy.decided * 100 >= healthy.answers * 99,
            "{path}: keys on healthy primaries not decided by Redis: {healthy:?}"
        );
    }
    // The dead primary's keys follow their policy: closed refuses, open
    // serves without limiting.
    let closed = &seen[&(true, "/sign-in")];
    assert_eq!(closed.unavailable, closed.answers, "{closed:?}");
    let open = &seen[&(true, "/")];
    assert_eq!(
        (open.unavailable, open.other, open.decided),
        (0, 0, 0),
        "{open:?}"
    );

    // Failures were attributed to the dead primary alone.
    let dead_addr = format!(":{}", cluster.nodes[dead].port);
    let (down, up): (Vec<_>, Vec<_>) = nodes.iter().partition(|(n, _)| n.ends_with(&dead_addr));
    assert_eq!(down.len(), 1, "{nodes:?}");
    assert!(
        down[0].1.opened >= 1 && down[0].1.short_circuited > 0,
        "{nodes:?}"
    );
    assert_eq!(up.len(), 2, "{nodes:?}");
    for (n, b) in &up {
        assert_eq!((b.opened, b.state), (0, "closed"), "{n}: {b:?}");
    }
}
