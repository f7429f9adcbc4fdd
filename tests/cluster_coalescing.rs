//! On a Redis Cluster, single-token-bucket checks in flight together are
//! coalesced per primary: one call of the lean script flagged
//! `allow-cross-slot-keys` carries the checks of every slot a primary owns
//! (src/store/redis/per_node.rs), and the decisions stay exact; where the
//! cluster refuses that flag, one call per slot.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::sync::Arc;

use fleetlimit::RateLimitLayer;
use fleetlimit::store::RedisStore;
use support::*;

/// The budget key's capacity: N + 1 requests over two layers admit N.
const BUDGET: usize = 20;
/// Other keys, one request each (spread over every primary's slots).
const KEYS: usize = 90;

fn limits() -> String {
    format!(
        r#"batch_window = "5ms"

[limits.per-key]
key = "header:x-api-key"
capacity = {BUDGET}
refill = "1/d"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "closed"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_checks_take_fewer_calls_per_primary_and_stay_exact() {
    init_tracing();
    let cluster = RedisCluster::start();
    let prefix = prefix("cluster-coalescing");
    // Two layers: two stores, two pools per primary ("two servers").
    let mut apps = Vec::new();
    let mut stores = Vec::new();
    for _ in 0..2 {
        let cfg = cluster_config(&cluster, &prefix, "500ms", &limits());
        let store = RedisStore::connect(&cfg).await.unwrap();
        let layer = RateLimitLayer::with_store(cfg, Arc::new(store.clone()))
            .await
            .unwrap();
        apps.push(ok_routes(layer, ["/"]));
        stores.push(store);
    }
    // Scripts loaded at start: from here on, only the checks' calls.
    for n in &cluster.nodes {
        n.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    }

    // Every request at once, so that each layer's batch window gathers
    // many: the budget key N + 1 times (alternating layers), and KEYS
    // others once.
    let mut tasks = Vec::new();
    let requests = (0..=BUDGET)
        .map(|_| "budget".to_owned())
        .chain((0..KEYS).map(|i| format!("key-{i}")));
    for (i, key) in requests.enumerate() {
        let app = apps[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let req = request("GET", "/", "127.0.0.1:7000", &[("x-api-key", &key)]);
            (key, send(&app, req).await.status().as_u16())
        }));
    }
    let mut admitted_budget = 0;
    for t in tasks {
        let (key, status) = t.await.unwrap();
        assert!(status == 200 || status == 429, "{key}: {status}");
        if key == "budget" {
            admitted_budget += usize::from(status == 200);
        } else {
            assert_eq!(status, 200, "{key}: a fresh key refused");
        }
    }
    assert_eq!(
        admitted_budget, BUDGET,
        "N + 1 requests over two layers admit N"
    );

    let checks = (BUDGET + 1 + KEYS) as u64;
    let calls: Vec<u64> = cluster.nodes.iter().map(|n| n.script_calls()).collect();
    let total: u64 = calls.iter().sum();
    println!("cluster coalescing: {checks} checks in {total} calls, per primary {calls:?}");
    // Every primary owns some of the keys, and took fewer calls than the
    // checks: several slots' checks went in one call.
    for (i, c) in calls.iter().enumerate() {
        assert!(*c >= 1, "primary {i} decided nothing: {calls:?}");
    }
    assert!(
        total * 3 <= checks,
        "{checks} checks took {total} calls: not coalesced per primary ({calls:?})"
    );
    for s in &stores {
        assert_eq!(s.redirects().calls, 0, "no slot moved: {:?}", s.redirects());
    }
    // Exact to the token: the budget key holds nothing more.
    let key = header_key(&prefix, "per-key", "budget");
    let owner = cluster
        .nodes
        .iter()
        .find(|n| n.keys_with_pttl(&prefix).iter().any(|(k, _)| *k == key))
        .expect("the budget key is on a primary");
    let left = tokens(owner, &key, BUDGET as f64, 1.0 / 86_400.0);
    assert!(left < 0.5, "{left} tokens left after {BUDGET} admitted");
    cluster.assert_every_key_expires(&prefix);
}

/// A real server's refusal of a shebang flag, as a server that does not
/// know `allow-cross-slot-keys` refuses it.
fn refusal(cluster: &RedisCluster) -> String {
    let script = "#!lua flags=allow-cross-slot-keys,fleetlimit-unknown-flag\nreturn 1";
    let out = std::process::Command::new(cli_bin())
        .args(["-p", &cluster.nodes[0].port.to_string()])
        .args(["SCRIPT", "LOAD", script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(text.contains("shebang"), "the server accepted it: {text}");
    text
}

/// Where the cluster refuses the flagged script, coalesced checks go in
/// one call per slot (as without coalescing), said once in a log line, and
/// stay exact. The refusal is a real server's answer to an unknown flag,
/// handed to the store as its `SCRIPT LOAD` would have had it (a Redis
/// before 7 refuses the shebang itself; none is at hand here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_the_flag_is_refused_checks_go_per_slot() {
    init_tracing();
    let cluster = RedisCluster::start();
    let prefix = prefix("cluster-refused");
    let cfg = cluster_config(&cluster, &prefix, "500ms", &limits());
    let store = RedisStore::connect(&cfg).await.unwrap();
    let text = refusal(&cluster);
    let (taken, log) = logged(async {
        let first = store.refuse_cross_slot(&text);
        let again = store.refuse_cross_slot(&text);
        (first, again)
    })
    .await;
    assert_eq!(taken, (true, true), "{text}");
    assert_eq!(
        log.matches("allow-cross-slot-keys").count(),
        1,
        "said once: {log}"
    );
    assert!(!store.refuse_cross_slot("OOM command not allowed"));
    let layer = RateLimitLayer::with_store(cfg, Arc::new(store.clone()))
        .await
        .unwrap();
    let app = ok_routes(layer, ["/"]);
    for n in &cluster.nodes {
        n.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    }
    let mut tasks = Vec::new();
    let requests = (0..=BUDGET)
        .map(|_| "budget".to_owned())
        .chain((0..KEYS).map(|i| format!("key-{i}")));
    for key in requests {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let req = request("GET", "/", "127.0.0.1:7000", &[("x-api-key", &key)]);
            (key, send(&app, req).await.status().as_u16())
        }));
    }
    let mut admitted_budget = 0;
    for t in tasks {
        let (key, status) = t.await.unwrap();
        if key == "budget" {
            admitted_budget += usize::from(status == 200);
        } else {
            assert_eq!(status, 200, "{key}");
        }
    }
    assert_eq!(admitted_budget, BUDGET);
    // One call per slot at least: the KEYS + 1 keys' slots (distinct but
    // for a rare collision), never one call across slots.
    let slots: std::collections::HashSet<u16> = (0..KEYS)
        .map(|i| format!("key-{i}"))
        .chain(["budget".to_owned()])
        .map(|v| fred::util::redis_keyslot(header_key(&prefix, "per-key", &v).as_bytes()))
        .collect();
    let calls: u64 = cluster.nodes.iter().map(|n| n.script_calls()).sum();
    println!(
        "flag refused: {} checks in {calls} calls over {} slots",
        BUDGET + 1 + KEYS,
        slots.len()
    );
    assert!(
        calls >= slots.len() as u64,
        "{calls} calls for {} slots: some call crossed slots",
        slots.len()
    );
    assert!(
        calls < (BUDGET + 1 + KEYS) as u64,
        "the budget key's checks (one slot) were not coalesced: {calls} calls"
    );
}
