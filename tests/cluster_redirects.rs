//! A slot moved by hand, step by step (`CLUSTER SETSLOT … MIGRATING /
//! IMPORTING`, `MIGRATE`, `SETSLOT … NODE`), while checks coalesced per
//! primary keep coming: each step's redirection (a key not local to a call
//! across slots, `ASK`, `TRYAGAIN`, `MOVED`) is met, the checks not run are
//! sent again per slot, and every check is charged exactly once
//! (src/store/redis/per_node.rs).
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::sync::Arc;

use axum::Router;
use fleetlimit::RateLimitLayer;
use fleetlimit::store::RedisStore;
use support::*;

/// Each key admits this many: every key gets more requests than that.
const BUDGET: u32 = 3;

fn limits() -> String {
    // A window long enough that a step's requests, sent together, are
    // one batch.
    format!(
        r#"batch_window = "10ms"

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

/// `keys` sent together; each one's status.
async fn together(app: &Router, keys: &[&str]) -> Vec<(String, u16)> {
    let tasks: Vec<_> = keys
        .iter()
        .map(|k| {
            let (app, k) = (app.clone(), (*k).to_owned());
            tokio::spawn(async move {
                let req = request("GET", "/", "127.0.0.1:7000", &[("x-api-key", &k)]);
                (k, send(&app, req).await.status().as_u16())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// The node (index) owning `slot`, and every node's id.
fn owner(cluster: &RedisCluster, slot: u16) -> (usize, Vec<String>) {
    let ids: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["CLUSTER", "MYID"]).unwrap().trim().to_owned())
        .collect();
    // CLUSTER NODES: "<id> <addr> <flags> ... <ranges>".
    let nodes = cluster.nodes[0].cli(&["CLUSTER", "NODES"]).unwrap();
    for line in nodes.lines() {
        let mut f = line.split_whitespace();
        let id = f.next().unwrap_or_default();
        let owns = f.skip(7).any(|r| match r.split_once('-') {
            Some((a, b)) => {
                (a.parse().unwrap_or(u16::MAX)..=b.parse().unwrap_or(0)).contains(&slot)
            }
            None => r.parse() == Ok(slot),
        });
        if owns {
            return (ids.iter().position(|i| i == id).unwrap(), ids);
        }
    }
    panic!("no node owns slot {slot}: {nodes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_meeting_a_slot_on_the_move_are_charged_once() {
    init_tracing();
    let cluster = RedisCluster::start();
    let prefix = prefix("cluster-redirects");
    let cfg = cluster_config(&cluster, &prefix, "500ms", &limits());
    let store = RedisStore::connect(&cfg).await.unwrap();
    let layer = RateLimitLayer::with_store(cfg, Arc::new(store.clone()))
        .await
        .unwrap();
    let app = ok_routes(layer, ["/"]);

    // Three API keys whose Redis keys share one slot (a one in 16,384
    // draw per value: bounded).
    let key = |v: &str| header_key(&prefix, "per-key", v);
    let slot_of = |v: &str| fred::util::redis_keyslot(key(v).as_bytes());
    let slot = slot_of("a");
    let mut same = (0..2_000_000)
        .map(|j| format!("v{j}"))
        .filter(|v| slot_of(v) == slot);
    let (b, c) = (same.next().unwrap(), same.next().unwrap());
    let (a, b, c) = ("a", b.as_str(), c.as_str());
    let (from, ids) = owner(&cluster, slot);
    let to = (from + 1) % 3;
    let (src, dst) = (&cluster.nodes[from], &cluster.nodes[to]);
    let setslot = |n: &RedisServer, args: &[&str]| {
        let slot = slot.to_string();
        let mut cmd = vec!["CLUSTER", "SETSLOT", &slot];
        cmd.extend_from_slice(args);
        let out = n.cli(&cmd).unwrap();
        assert!(out.trim() == "OK", "SETSLOT {args:?}: {out}");
    };
    let mut statuses: Vec<(String, u16)> = Vec::new();

    // 1. `a` written on its primary.
    statuses.extend(together(&app, &[a]).await);
    // 2. The slot migrating: `a` is on the source, `b` on neither. The
    // call across slots meets `b` not local; per slot, the source answers
    // ASK for `b` (Redis 7.0; later servers may say TRYAGAIN), the target
    // TRYAGAIN for both keys: one key a call, then each where it is.
    setslot(dst, &["IMPORTING", &ids[from]]);
    setslot(src, &["MIGRATING", &ids[to]]);
    statuses.extend(together(&app, &[a, b]).await);
    // 3. `a` moved too: every key is asked of the target.
    let port = dst.port.to_string();
    let moved = src
        .cli(&[
            "MIGRATE",
            "127.0.0.1",
            &port,
            "",
            "0",
            "5000",
            "KEYS",
            &key(a),
        ])
        .unwrap();
    assert_eq!(moved.trim(), "OK", "MIGRATE: {moved}");
    statuses.extend(together(&app, &[a, b, c]).await);
    // 4. The slot is the target's: fred's table is behind, MOVED.
    for n in [dst, src, &cluster.nodes[3 - from - to]] {
        setslot(n, &["NODE", &ids[to]]);
    }
    statuses.extend(together(&app, &[a, b, c, a, b, c, a, b, c]).await);

    let r = store.redirects();
    println!("slot {slot} moved by hand: {statuses:?}\n{r:?}");
    for (k, s) in &statuses {
        assert!(*s == 200 || *s == 429, "{k}: {s}");
    }
    // Every key had more requests than its budget: exactly the budget
    // admitted (a check charged twice would admit fewer; one lost, more),
    // and nothing left in the bucket.
    for v in [a, b, c] {
        let admitted = statuses.iter().filter(|(k, s)| k == v && *s == 200).count();
        assert_eq!(admitted, BUDGET as usize, "{v}: {statuses:?}");
        let left = tokens(dst, &key(v), f64::from(BUDGET), 1.0 / 86_400.0);
        assert!(
            left < 0.5,
            "{v}: {left} tokens left on the slot's new owner"
        );
        let old = src.keys_with_pttl(&prefix);
        assert!(
            old.iter().all(|(k, _)| *k != key(v)),
            "{v} left on the old owner"
        );
    }
    assert_eq!(r.decided, r.calls, "{r:?}");
    assert!(r.not_local >= 1 && r.moved >= 1, "{r:?}");
    assert!(r.ask >= 1 && r.split >= 1, "{r:?}");
    cluster.assert_every_key_expires(&prefix);
}
