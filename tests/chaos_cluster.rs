//! Chaos on a 3-primary Redis Cluster: one primary is killed long enough for
//! the cluster to notice (no replicas: its slots are down, then the whole
//! cluster refuses), then started again from its nodes.conf; and 1,000
//! slots moved between primaries under load (`redis-cli --cluster
//! reshard`), checks coalesced per primary meeting them on the move.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::time::Duration;

use support::chaos::{self, Fleet};
use support::*;

/// The cluster's `cluster-node-timeout` (2 s in `RedisCluster::start`): a
/// primary unreachable this long is marked failing, and the cluster,
/// without replicas, refuses; a node back rejoins after about as long.
const NODE_TIMEOUT: Duration = Duration::from_millis(1_000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_primary_killed_and_back() {
    init_tracing();
    let node_timeout = NODE_TIMEOUT.as_millis().to_string();
    let cluster = RedisCluster::start_with(&["--cluster-node-timeout", &node_timeout]);
    let prefix = prefix("chaos-cluster");
    let fleet = Fleet::start(
        || {
            cluster_config(
                &cluster,
                &prefix,
                &format!("{}ms", chaos::DEADLINE_MS),
                chaos::LIMITS,
            )
        },
        3,
    )
    .await;
    let (samples, fault, recovered) = chaos::run(
        &fleet,
        "cluster",
        // Down half as long again as the cluster takes to notice.
        NODE_TIMEOUT.mul_f64(1.5),
        || cluster.nodes[1].kill(),
        || cluster.nodes[1].restart(),
    )
    .await;
    chaos::assert_scenario("cluster", &samples, fault, recovered, &fleet, true);
    chaos::assert_exact(&fleet, "cluster").await;
    cluster.assert_every_key_expires(&prefix);
}

/// Budget keys: each admits exactly this many (no refill within the test).
const BUDGET: u32 = 10;
/// Keys of each route: half of them in the slots the reshard moves.
const BUDGET_KEYS: usize = 200;
const OPEN_KEYS: usize = 200;
/// The slots `redis-cli --cluster reshard` moves off the first primary
/// (0–5460): the lowest it has.
const MOVED: u16 = 1_000;
/// A batch window five times the bench's, so that calls carry several
/// checks at this test's rate, and a call across slots meeting a moved
/// key sends several per slot at once.
/// A deadline far above this machine's scheduling noise: what is tested is
/// that checks meeting a slot on the move are decided (exactly once), not
/// how late answers may be; a closed route that timed out would answer 503.
const RESHARD_DEADLINE_MS: u64 = 500;

fn reshard_limits() -> String {
    format!(
        r#"batch_window = "5ms"

[limits.open]
key = "header:x-api-key"
capacity = 1000000
refill = "1000/s"

[limits.budget]
key = "header:x-api-key"
capacity = {BUDGET}
refill = "1/d"

[[routes]]
path = "/"
limits = ["open"]
on_redis_error = "open"

[[routes]]
path = "/budget"
limits = ["budget"]
on_redis_error = "closed"
"#
    )
}

/// `n` values of header `x-api-key` for `limit`, half of them (the even
/// ones) with their Redis key in the slots moved.
fn values(prefix: &str, limit: &str, n: usize) -> Vec<String> {
    let slot = |v: &str| fred::util::redis_keyslot(header_key(prefix, limit, v).as_bytes());
    let (mut moved, mut other) = (Vec::new(), Vec::new());
    // Bounded: a slot below MOVED comes once in 16 values.
    for j in 0..100 * n {
        let v = format!("{limit}-{j}");
        let list = if slot(&v) < MOVED {
            &mut moved
        } else {
            &mut other
        };
        if list.len() < n / 2 {
            list.push(v);
        }
        if moved.len() + other.len() == n {
            break;
        }
    }
    assert_eq!(moved.len() + other.len(), n);
    moved
        .into_iter()
        .zip(other)
        .flat_map(|(a, b)| [a, b])
        .collect()
}

struct Seen {
    route: &'static str,
    key: String,
    status: u16,
    took: Duration,
}

/// 1,000 slots move from one primary to another (`redis-cli --cluster
/// reshard`) while three layers send checks coalesced per primary: no 5xx,
/// every answer within the deadline's bound, every check charged once (a
/// key of known budget: admitted + tokens left = its capacity), and the
/// calls that met a slot on the move were counted and decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_of_a_thousand_slots_under_load() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use fleetlimit::RateLimitLayer;
    use fleetlimit::store::RedisStore;

    init_tracing();
    let cluster = RedisCluster::start();
    let prefix = prefix("chaos-reshard");
    let deadline = format!("{RESHARD_DEADLINE_MS}ms");
    let mut apps = Vec::new();
    let mut stores = Vec::new();
    for _ in 0..3 {
        let cfg = cluster_config(&cluster, &prefix, &deadline, &reshard_limits());
        let store = RedisStore::connect(&cfg).await.unwrap();
        let layer = RateLimitLayer::with_store(cfg, Arc::new(store.clone()))
            .await
            .unwrap();
        apps.push(ok_routes(layer, ["/", "/budget"]));
        stores.push(store);
    }
    let id = |n: &RedisServer| n.cli(&["CLUSTER", "MYID"]).unwrap().trim().to_owned();
    let (from, to) = (id(&cluster.nodes[0]), id(&cluster.nodes[1]));
    let slots_of = |n: &RedisServer| -> usize {
        let nodes = n.cli(&["CLUSTER", "NODES"]).unwrap();
        let me = nodes.lines().find(|l| l.contains("myself")).unwrap();
        me.split_whitespace()
            .skip(8)
            .filter(|r| !r.starts_with('['))
            .map(|r| match r.split_once('-') {
                Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
                None => 1,
            })
            .sum()
    };
    let before = slots_of(&cluster.nodes[1]);
    let open = Arc::new(values(&prefix, "open", OPEN_KEYS));
    let budget = Arc::new(values(&prefix, "budget", BUDGET_KEYS));

    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (t, app) in (0..6).map(|t| (t, apps[t % 3].clone())) {
        let (stop, open, budget) = (Arc::clone(&stop), Arc::clone(&open), Arc::clone(&budget));
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            // Bounded: stops when told, or after 60 s whatever happens.
            let give_up = Instant::now() + Duration::from_secs(60);
            let mut i = t;
            while !stop.load(Ordering::Relaxed) && Instant::now() < give_up {
                i += 7;
                for (route, key) in [
                    ("/", open[i % OPEN_KEYS].clone()),
                    ("/budget", budget[i % BUDGET_KEYS].clone()),
                ] {
                    let started = Instant::now();
                    let req = request("GET", route, "127.0.0.1:7000", &[("x-api-key", &key)]);
                    let status = tokio::time::timeout(Duration::from_secs(5), send(&app, req))
                        .await
                        .map_or(0, |r| r.status().as_u16());
                    seen.push(Seen {
                        route,
                        key,
                        status,
                        took: started.elapsed(),
                    });
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            seen
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let addr = format!("127.0.0.1:{}", cluster.nodes[0].port);
    let reshard = tokio::task::spawn_blocking(move || {
        std::process::Command::new(cli_bin())
            .args(["--cluster", "reshard", &addr])
            .args(["--cluster-from", &from, "--cluster-to", &to])
            .args(["--cluster-slots", "1000", "--cluster-yes"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        reshard.status.success(),
        "reshard: {}",
        String::from_utf8_lossy(&reshard.stderr)
    );
    // Until every layer has met a moved slot (its slot table is behind
    // until it does), for 10 s at most.
    let after = Instant::now();
    while after.elapsed() < Duration::from_secs(10)
        && (after.elapsed() < Duration::from_millis(500)
            || stores.iter().any(|s| s.redirects().calls == 0))
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    for t in tasks {
        seen.extend(t.await.unwrap());
    }
    let moved = slots_of(&cluster.nodes[1]) - before;
    assert!(moved >= 1_000, "{moved} slots moved");

    let redirects: Vec<_> = stores.iter().map(RedisStore::redirects).collect();
    let slowest = seen.iter().map(|s| s.took).max().unwrap_or_default();
    println!(
        "reshard: {moved} slots moved, {} requests, slowest {slowest:?}, redirects {redirects:?}",
        seen.len()
    );
    assert!(seen.len() > 200, "too little traffic: {}", seen.len());
    // The bound of a call: its deadline and the host's stalls, once more
    // after a call Redis ran too late; and scheduling on a busy machine.
    let bound = Duration::from_millis(2 * RESHARD_DEADLINE_MS + 250);
    for s in &seen {
        assert!(s.status != 0, "{} {} hung for {:?}", s.route, s.key, s.took);
        assert!(
            s.status < 500,
            "{} {} answered {}",
            s.route,
            s.key,
            s.status
        );
        assert!(s.took < bound, "{} {} took {:?}", s.route, s.key, s.took);
        match s.route {
            "/" => assert_eq!(s.status, 200, "{}", s.key),
            _ => assert!(s.status == 200 || s.status == 429, "{}", s.key),
        }
    }
    for r in &redirects {
        assert!(r.calls > 0, "no call met a slot on the move: {redirects:?}");
        assert_eq!(r.decided + r.by_policy, r.calls, "{r:?}");
        // Sent again within the first call's deadline (its hard bound,
        // once more after Late), or left to the policy by then.
        assert!(
            r.slowest_us < bound.as_micros() as u64,
            "a call that met a slot on the move took {} µs: {r:?}",
            r.slowest_us
        );
    }

    // Charged once: admitted + tokens left = the budget, key by key (every
    // budget answer came from Redis: no 5xx above, the route is closed).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut owner = std::collections::HashMap::new();
    for n in &cluster.nodes {
        for (k, _) in n.keys_with_pttl(&prefix) {
            owner.insert(k, n);
        }
    }
    let mut admitted = std::collections::HashMap::new();
    for s in seen
        .iter()
        .filter(|s| s.route == "/budget" && s.status == 200)
    {
        *admitted.entry(s.key.as_str()).or_insert(0u32) += 1;
    }
    for i in budget.iter() {
        let a = admitted.get(i.as_str()).copied().unwrap_or(0);
        assert!(a <= BUDGET, "{i}: {a} admitted, over its {BUDGET}");
        let key = header_key(&prefix, "budget", i);
        let left = match owner.get(&key) {
            Some(n) => tokens(n, &key, f64::from(BUDGET), 1.0 / 86_400.0),
            None => f64::from(BUDGET),
        };
        let sum = f64::from(a) + left;
        assert!(
            (sum - f64::from(BUDGET)).abs() < 0.5,
            "{i}: {a} admitted and {left} tokens left (a check charged twice, or lost)"
        );
    }
    cluster.assert_every_key_expires(&prefix);
}
