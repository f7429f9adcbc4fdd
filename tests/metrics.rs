//! Feature `metrics` (docs/metrics.md): what the limiter counts, exactly.
//!
//! In-process: a `DebuggingRecorder` set for the test's thread (each
//! `#[tokio::test]` runs on one current-thread runtime, so every handle the
//! layer registers lands in that test's recorder), on a store that can be
//! made to fail. Through `examples/metrics.rs`: the Prometheus text a
//! scraper reads, in-process and on a real Redis that is then killed.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::routing::get;
use fleetlimit::store::{Check, MemoryStore, Store, StoreFuture};
use fleetlimit::{Config, RateLimitLayer, StoreError};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::example::Example;
use support::stats::Parts;
use support::{RedisServer, request, send};

/// Counts the allocations of the current thread (a test's current-thread
/// runtime runs the whole in-process request path there).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: `System` does the work; the counter is a const-initialised
// thread local (no allocation of its own).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The in-process store, or down.
#[derive(Debug)]
struct Switch {
    inner: MemoryStore,
    down: AtomicBool,
}

impl Store for Switch {
    fn check(&self, check: &Check) -> StoreFuture {
        if self.down.load(Ordering::Relaxed) {
            return Box::pin(async { Err(StoreError::Unavailable("switched off".into())) });
        }
        self.inner.check(check)
    }
}

/// A metric's name, labels and value (a histogram's: how many samples).
type Sample = (String, Vec<(String, String)>, f64);

/// Each metric of `snap` with all of `labels` (and no other), its value.
fn value(snap: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = snap
        .iter()
        .filter(|(n, ls, _)| {
            n == name
                && ls.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v)| *v)
        .collect();
    assert!(found.len() <= 1, "{name} {labels:?} twice");
    found.first().copied().unwrap_or(0.0)
}

fn snapshot(s: &Snapshotter) -> Vec<Sample> {
    s.snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            let key = k.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let v = match v {
                DebugValue::Counter(c) => c as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            };
            (key.name().to_owned(), labels, v)
        })
        .collect()
}

const CONFIG: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 2
refill = "1/min"

[limits.watch]
key = "header:x-api-key"
capacity = 1
refill = "1/min"
mode = "shadow"

[limits.per-ip]
key = "ip"
capacity = 100
refill = "1/min"

[limits.soft]
key = "header:x-api-key"
capacity = 1
refill = "1/min"
on_exceed = "challenge"

[breaker]
failures = 2

[[routes]]
path = "/"
limits = ["per-key", "watch"]
on_redis_error = "open"

[[routes]]
path = "/pair"
limits = ["per-ip", "per-key"]
on_redis_error = "closed"

[[routes]]
path = "/local"
limits = ["per-key"]
on_redis_error = "local"

[[routes]]
path = "/soft"
limits = ["soft"]
"#;

fn app(layer: RateLimitLayer) -> Router {
    support::ok_routes(layer, ["/", "/pair", "/local", "/soft"])
}

async fn statuses(app: &Router, path: &str, key: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        let req = request("GET", path, "10.0.0.1:1000", &[("x-api-key", key)]);
        out.push(send(app, req).await.status().as_u16());
    }
    out
}

/// Every outcome of a decision, per route and limit, on a store that
/// answers and then fails; the refused-key cache's answers; the breaker's
/// transitions.
#[tokio::test]
async fn decisions_are_counted_per_route_limit_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let cfg = Config::from_toml_str(CONFIG).unwrap();
    let store = Arc::new(Switch {
        inner: MemoryStore::new(1000),
        down: AtomicBool::new(false),
    });
    let app = app(RateLimitLayer::with_store(cfg, store.clone())
        .await
        .unwrap());

    // "/": per-key 2 then refused; "watch" (shadow) has room for one.
    assert_eq!(statuses(&app, "/", "a", 4).await, [200, 200, 429, 429]);
    // "/pair": per-key of "b" refuses the third; per-ip had room.
    assert_eq!(statuses(&app, "/pair", "b", 3).await, [200, 200, 429]);
    // "/soft": challenged past its one, never refused.
    assert_eq!(statuses(&app, "/soft", "c", 3).await, [200, 200, 200]);

    let s = snapshot(&snapshotter);
    let d = |route: &str, limit: &str, outcome: &str| {
        value(
            &s,
            "fleetlimit_decisions_total",
            &[("route", route), ("limit", limit), ("outcome", outcome)],
        )
    };
    assert_eq!(d("/", "per-key", "admitted"), 2.0);
    // The first refusal is the store's, the second remembered.
    assert_eq!(d("/", "per-key", "refused"), 2.0);
    assert_eq!(d("/", "watch", "admitted"), 1.0);
    // Over its one on the second and third requests (served by it; the
    // third refused by per-key in the same call); the fourth was answered
    // from the refused-key cache, which did not ask it.
    assert_eq!(d("/", "watch", "shadow_refused"), 2.0);
    assert_eq!(d("/", "watch", "refused_by_other"), 1.0);
    assert_eq!(
        value(
            &s,
            "fleetlimit_refused_cache_hits_total",
            &[("route", "/"), ("limit", "per-key")]
        ),
        1.0
    );
    assert_eq!(d("/pair", "per-ip", "admitted"), 2.0);
    assert_eq!(d("/pair", "per-ip", "refused_by_other"), 1.0);
    assert_eq!(d("/pair", "per-key", "refused"), 1.0);
    assert_eq!(d("/soft", "soft", "admitted"), 1.0);
    assert_eq!(d("/soft", "soft", "escalated"), 2.0);
    let breaker = |state: &str| {
        value(
            &s,
            "fleetlimit_breaker_state",
            &[("node", "store"), ("state", state)],
        )
    };
    assert_eq!((breaker("closed"), breaker("open")), (1.0, 0.0));

    // Redis (here: the store) down: each route's failure policy.
    store.down.store(true, Ordering::Relaxed);
    assert_eq!(statuses(&app, "/", "d", 3).await, [200; 3]);
    assert_eq!(statuses(&app, "/pair", "e", 2).await, [503; 2]);
    // The local share: all of per-key's 2 (fleet size 1).
    assert_eq!(statuses(&app, "/local", "f", 3).await, [200, 200, 429]);
    let s = snapshot(&snapshotter);
    let d = |route: &str, limit: &str, outcome: &str| {
        value(
            &s,
            "fleetlimit_decisions_total",
            &[("route", route), ("limit", limit), ("outcome", outcome)],
        )
    };
    assert_eq!(d("/", "per-key", "degraded_open"), 3.0);
    assert_eq!(d("/", "watch", "degraded_open"), 3.0);
    assert_eq!(d("/pair", "per-ip", "degraded_closed"), 2.0);
    assert_eq!(d("/pair", "per-key", "degraded_closed"), 2.0);
    assert_eq!(d("/local", "per-key", "degraded_local"), 2.0);
    assert_eq!(d("/local", "per-key", "degraded_local_refused"), 1.0);
    // Two definite errors in a row opened it (`[breaker] failures = 2`).
    let breaker = |state: &str| {
        value(
            &s,
            "fleetlimit_breaker_state",
            &[("node", "store"), ("state", state)],
        )
    };
    assert_eq!((breaker("closed"), breaker("open")), (0.0, 1.0));
    let to_open = value(
        &s,
        "fleetlimit_breaker_transitions_total",
        &[("node", "store"), ("to", "open")],
    );
    assert_eq!(to_open, 1.0);
    // Not a store of fleetlimit's: no script calls.
    assert_eq!(
        value(&s, "fleetlimit_script_calls_total", &[("script", "lean")]),
        0.0
    );
}

/// A recorder receiving the counts costs a request no allocation: the
/// handles are registered once, and counting is adding to an atomic (the
/// same request path without a recorder, whose handles do nothing, is the
/// baseline; `cargo bench --bench allocs` with and without the feature
/// compares against a build without it).
#[tokio::test]
async fn a_recorder_costs_no_allocation_per_request() {
    // Two configurations: layers built from one share its routes' handles.
    let cfg = || {
        Config::from_toml_str(
            r#"
        [limits.per-key]
        key = "header:x-api-key"
        capacity = 1000000
        refill = "1000/s"

        [[routes]]
        path = "/"
        limits = ["per-key"]
        "#,
        )
        .unwrap()
    };
    async fn per_request(app: &Router) -> u64 {
        // Warm: the key's bucket, the route's handles.
        statuses(app, "/", "k", 10).await;
        let before = ALLOCATIONS.with(Cell::get);
        assert_eq!(statuses(app, "/", "k", 100).await, [200; 100]);
        ALLOCATIONS.with(Cell::get) - before
    }
    let plain = app(RateLimitLayer::new(cfg()).await.unwrap());
    let without = per_request(&plain).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let counted = app(RateLimitLayer::new(cfg()).await.unwrap());
    let with = per_request(&counted).await;
    let s = snapshot(&snapshotter);
    let admitted = [
        ("route", "/"),
        ("limit", "per-key"),
        ("outcome", "admitted"),
    ];
    assert_eq!(value(&s, "fleetlimit_decisions_total", &admitted), 110.0);
    assert_eq!(with, without, "allocations per 100 requests");
}

/// A hot key's leases, and the plan resolver's cache.
#[tokio::test(start_paused = true)]
async fn leases_and_plan_lookups_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let cfg = Config::from_toml_str(
        r#"
        [limits.hot]
        key = "header:x-api-key"
        capacity = 100
        refill = "1/min"
        lease_batch = 4
        lease_above = 2

        [limits.tiered]
        key = "header:x-api-key"
        capacity = 5
        refill = "1/min"

        [plans.pro.tiered]
        capacity = 10

        [[routes]]
        path = "/hot"
        limits = ["hot"]

        [[routes]]
        path = "/tiered"
        limits = ["tiered"]
        "#,
    )
    .unwrap();
    let store = Arc::new(Switch {
        inner: MemoryStore::new(1000),
        down: AtomicBool::new(false),
    });
    let layer = RateLimitLayer::with_store(cfg, store)
        .plan_resolver(|_key: String| async { Ok(Some("pro".to_owned())) })
        .await
        .unwrap();
    let ok = get(|| async { "ok" });
    let app = Router::new()
        .route("/hot", ok.clone())
        .route("/tiered", ok)
        .layer(layer);
    // Past 2 a second the key takes 4 at once: the 3rd request takes a
    // lease (itself and 3 more), the 7th the next one.
    assert_eq!(statuses(&app, "/hot", "h", 7).await, [200; 7]);
    assert_eq!(statuses(&app, "/tiered", "t", 3).await, [200; 3]);
    let s = snapshot(&snapshotter);
    let hot = [("route", "/hot"), ("limit", "hot")];
    assert_eq!(value(&s, "fleetlimit_lease_grants_total", &hot), 2.0);
    let admitted = [("route", "/hot"), ("limit", "hot"), ("outcome", "admitted")];
    assert_eq!(value(&s, "fleetlimit_decisions_total", &admitted), 7.0);
    let lookups = |r: &str| value(&s, "fleetlimit_plan_cache_lookups_total", &[("result", r)]);
    assert_eq!((lookups("miss"), lookups("hit")), (1.0, 2.0));
}

/// Partial leases of a hot key on three instances sharing a real Redis:
/// the leases granted (whole and short), the refusals each lease table
/// answered without Redis (its lease got nothing: `elsewhere`; its short
/// lease is spent: `waiting`), the tokens a lapsed lease stranded, and the
/// lease script's calls.
#[tokio::test]
async fn lease_refusals_and_stranded_tokens_are_counted_on_redis() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let server = RedisServer::start();
    let body = r#"
        [limits.hot]
        key = "header:x-api-key"
        capacity = 30
        refill = "1/min"
        lease_batch = 10
        lease_above = 1

        [[routes]]
        path = "/"
        limits = ["hot"]
    "#;
    let mut apps = Vec::new();
    for _ in 0..3 {
        let cfg = support::redis_config(&server, &support::prefix("lease-metrics"), "500ms", body);
        apps.push(app(RateLimitLayer::new(cfg).await.unwrap()));
    }
    let (a, b, c) = (&apps[0], &apps[1], &apps[2]);
    // A and B: one request to Redis, then a whole lease of 10 (the request
    // and 9 held); 8 left in Redis.
    assert_eq!(statuses(a, "/", "k", 2).await, [200; 2]);
    assert_eq!(statuses(b, "/", "k", 2).await, [200; 2]);
    // C: one to Redis (7 left), then a short lease of all 7: the request
    // and 6 held; then, spent, C refuses by itself (waiting).
    let mut want = vec![200; 8];
    want.push(429);
    assert_eq!(statuses(c, "/", "k", 9).await, want);
    // A spends its 9, then its next lease gets nothing (refused by that
    // answer), and its table refuses the next (elsewhere: B holds 9).
    let mut want = vec![200; 9];
    want.extend([429, 429]);
    assert_eq!(statuses(a, "/", "k", 11).await, want);
    // B's 9 lapse unspent (LEASE_TTL is 1 s): stranded, seen by its next
    // request, which leases again and gets nothing.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    assert_eq!(statuses(b, "/", "k", 1).await, [429]);
    let s = snapshot(&snapshotter);
    let hot = [("route", "/"), ("limit", "hot")];
    let refused = |reason: &str| {
        value(
            &s,
            "fleetlimit_lease_local_refusals_total",
            &[("route", "/"), ("limit", "hot"), ("reason", reason)],
        )
    };
    assert_eq!(value(&s, "fleetlimit_lease_grants_total", &hot), 3.0);
    assert_eq!((refused("elsewhere"), refused("waiting")), (1.0, 1.0));
    assert_eq!(
        value(&s, "fleetlimit_lease_stranded_tokens_total", &hot),
        9.0
    );
    let lease = [("script", "lease")];
    assert_eq!(value(&s, "fleetlimit_script_calls_total", &lease), 5.0);
    assert_eq!(server.calls_of("evalsha"), 5 + 3, "5 leases, 3 lean checks");
}

/// Two `redis-server`s as regions `a` and `b` and one layer in each, on a
/// global limit `api` keyed by `x-api-key` of burst `n[x]` refilled
/// `n[x]` a second (interval 400 ms).
async fn two_regions(test: &str, n: [u32; 2]) -> ([RedisServer; 2], Vec<RateLimitLayer>) {
    let servers = [RedisServer::start(), RedisServer::start()];
    let prefix = support::prefix(test);
    let exchange = format!(
        "a = \"{}\"\nb = \"{}\"\n",
        servers[0].url(),
        servers[1].url()
    );
    let mut layers = Vec::new();
    for ((server, this), n) in servers.iter().zip(["a", "b"]).zip(n) {
        let body = format!(
            r#"
[regions]
this = "{this}"
interval = "400ms"

[regions.exchange]
{exchange}
[limits.api]
key = "header:x-api-key"
capacity = {n}
refill = "{n}/s"
scope = "global"

[default]
limits = ["api"]
"#
        );
        let cfg = support::redis_config(server, &prefix, "250ms", &body);
        layers.push(RateLimitLayer::new(cfg).await.unwrap());
    }
    (servers, layers)
}

/// Regions (`[regions]`, `scope = "global"`): two `redis-server`s as
/// regions `a` and `b`, one instance each, in this test's process. Only
/// region `a` is asked for the key, so `b` gives its quota away: the
/// exchange's figures, labelled by limit and region, match what
/// `RateLimitLayer::region_stats` says.
#[tokio::test]
async fn the_regions_exchange_is_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (_servers, layers) = two_regions("region-metrics", [20, 20]).await;
    let a = support::ok_routes(layers[0].clone(), ["/"]);
    // 50 a second in region a for 3 s: several intervals of demand.
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(20));
    for _ in 0..150 {
        tick.tick().await;
        statuses(&a, "/", "k", 1).await;
    }
    let s = snapshot(&snapshotter);
    let stats: Vec<support::stats::Region> = layers.iter().map(|l| l.region().unwrap()).collect();
    let api = |region: &'static str| [("limit", "api"), ("region", region)];
    let moved = value(&s, "fleetlimit_region_quota_moved_total", &api("b"));
    assert!(moved > 0.0, "region b gave quota away: {stats:?}");
    assert_eq!(moved, stats[1].moved as f64);
    assert_eq!(
        value(&s, "fleetlimit_region_rebalanced_total", &api("b")),
        stats[1].rebalanced as f64
    );
    assert!(stats[1].rebalanced > 0, "{stats:?}");
    assert_eq!(
        value(&s, "fleetlimit_region_quota_moved_total", &api("a")),
        stats[0].moved as f64
    );
    assert_eq!(
        value(&s, "fleetlimit_region_quota_in_flight", &api("b")),
        stats[1].in_flight as f64
    );
    for (x, region) in ["a", "b"].into_iter().enumerate() {
        let calls = value(
            &s,
            "fleetlimit_region_exchange_calls_total",
            &[("region", region)],
        );
        let cycles = value(
            &s,
            "fleetlimit_region_exchange_cycles_total",
            &[("region", region)],
        );
        assert!(
            calls > 0.0 && cycles > 0.0,
            "{region}: {calls} calls, {cycles} cycles"
        );
        // One thread runs the exchange and the test: nothing ran between
        // the snapshot and the stats.
        assert_eq!(calls, stats[x].calls as f64, "{region}");
        assert_eq!(cycles, stats[x].cycles as f64, "{region}");
    }
}

/// Regions that disagree on a global limit's numbers (b's instance at
/// burst 40 / 40 a second, a's at 20/20, b started last as in a rolling
/// change): within 2 intervals each region's gauge says how many regions'
/// rules differ from its own, by limit and region (docs/regions.md).
#[tokio::test]
async fn regions_whose_rules_differ_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (_servers, _layers) = two_regions("region-rules", [20, 40]).await;
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let s = snapshot(&snapshotter);
    for region in ["a", "b"] {
        let labels = [("limit", "api"), ("region", region)];
        assert_eq!(
            value(&s, "fleetlimit_region_rules_differ", &labels),
            1.0,
            "{region}"
        );
    }
}

/// Regions, on the days that are not good: region b's Redis restarted
/// empty is counted by b's instance (a new generation, and the key claimed
/// from a's records), then b's Redis gone is counted by a's as stale.
#[tokio::test]
async fn a_restart_and_a_stale_region_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (servers, layers) = two_regions("region-restart", [20, 20]).await;
    let apps: Vec<Router> = (layers.into_iter())
        .map(|l| support::ok_routes(l, ["/"]))
        .collect();
    let interval = std::time::Duration::from_millis(400);
    let api = |region: &'static str| [("limit", "api"), ("region", region)];
    // The key asked in both regions, so that b's cycle meets it.
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(50));
    for i in 0..60 {
        tick.tick().await;
        if i == 20 {
            servers[1].restart();
        }
        statuses(&apps[i % 2], "/", "k", 1).await;
    }
    let s = snapshot(&snapshotter);
    let changed = value(&s, "fleetlimit_region_generation_changes_total", &api("b"));
    assert!(changed >= 1.0, "b's new generation: {changed}");
    assert!(
        value(&s, "fleetlimit_region_claims_total", &api("b")) >= 1.0,
        "b claimed the key"
    );
    assert_eq!(
        value(&s, "fleetlimit_region_generation_changes_total", &api("a")),
        0.0
    );
    // b's Redis gone: a's cycle no longer reaches it.
    servers[1].kill();
    tokio::time::sleep(interval * 5).await;
    let s = snapshot(&snapshotter);
    let with = |w: &'static str| [("limit", "api"), ("region", "a"), ("with", w)];
    let stale = value(&s, "fleetlimit_region_exchange_stale_seconds", &with("b"));
    assert!(
        stale >= (interval * 3).as_secs_f64(),
        "a has not reached b for {stale} s"
    );
}

/// The Prometheus text of `/metrics`: the value of the sample `name` with
/// exactly `labels` (0 when absent).
fn scraped(ex: &Example, name: &str, labels: &[(&str, &str)]) -> f64 {
    let (status, raw) = ex.http("GET", "/metrics", &[]);
    assert_eq!(status, 200, "{raw}");
    sample(&raw, name, labels)
}

fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (found, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once("} ") {
                Some((ls, v)) => (ls, v),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(v) => ("", v),
                None => continue,
            },
        };
        let found: Vec<&str> = found.split(',').filter(|l| !l.is_empty()).collect();
        let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        if found.len() == wanted.len() && wanted.iter().all(|w| found.contains(&w.as_str())) {
            return value.trim().parse().unwrap();
        }
    }
    0.0
}

/// N admitted then M refused for one key, in-process: the scrape says so.
#[test]
fn example_counts_decisions_in_process() {
    let ex = Example::start("metrics", &[], &[]);
    assert!(ex.banner.contains("in-process store"), "{}", ex.banner);
    let k = [("x-api-key", "k")];
    let mut want = vec![200; 5];
    want.extend([429; 3]);
    assert_eq!(ex.statuses("GET", "/", &k, 8), want);
    let d = |outcome: &str| {
        scraped(
            &ex,
            "fleetlimit_decisions_total",
            &[("route", "/"), ("limit", "per-key"), ("outcome", outcome)],
        )
    };
    assert_eq!(d("admitted"), 5.0);
    assert_eq!(d("refused"), 3.0);
    // Scraping is not limited, nor counted.
    assert_eq!(d("admitted"), 5.0);
    let (_, raw) = ex.http("GET", "/metrics", &[]);
    assert!(
        raw.contains("# type fleetlimit_decisions_total counter"),
        "{raw}"
    );
    // No Redis: no script call, no store call.
    assert!(!raw.contains("fleetlimit_script_calls_total"), "{raw}");
    assert!(
        !raw.contains("fleetlimit_store_call_duration_seconds"),
        "{raw}"
    );
}

/// On Redis: every call is timed and counted; the refused-key cache
/// answers the repeats; killed, each route's failure policy is counted.
#[test]
fn example_counts_store_calls_and_degraded_decisions_on_redis() {
    let server = RedisServer::start();
    let ex = Example::start("metrics", &[], &[("REDIS_URL", &server.url())]);
    assert!(ex.banner.contains("using Redis at"), "{}", ex.banner);
    let k = [("x-api-key", "k")];
    let mut want = vec![200; 5];
    want.extend([429; 3]);
    assert_eq!(ex.statuses("GET", "/", &k, 8), want);
    let (_, text) = ex.http("GET", "/metrics", &[]);
    let m = |name: &str, labels: &[(&str, &str)]| sample(&text, name, labels);
    let d = |route: &str, outcome: &str| {
        m(
            "fleetlimit_decisions_total",
            &[("route", route), ("limit", "per-key"), ("outcome", outcome)],
        )
    };
    assert_eq!(d("/", "admitted"), 5.0);
    assert_eq!(d("/", "refused"), 3.0);
    // Redis was asked 6 times (one request at a time: one check per call);
    // the last two refusals came from the refused-key cache.
    let hits = [("route", "/"), ("limit", "per-key")];
    assert_eq!(m("fleetlimit_refused_cache_hits_total", &hits), 2.0);
    assert_eq!(
        m("fleetlimit_script_calls_total", &[("script", "lean")]),
        6.0
    );
    assert_eq!(
        m("fleetlimit_script_checks_total", &[("script", "lean")]),
        6.0
    );
    let ok = [("result", "ok")];
    assert_eq!(m("fleetlimit_store_call_duration_seconds_count", &ok), 6.0);
    let sum = m("fleetlimit_store_call_duration_seconds_sum", &ok);
    assert!(sum > 0.0 && sum < 6.0, "{sum}");
    // (The example runner lower-cases what it reads.)
    let inf = [("result", "ok"), ("le", "+inf")];
    assert_eq!(
        m("fleetlimit_store_call_duration_seconds_bucket", &inf),
        6.0
    );
    assert_eq!(
        m(
            "fleetlimit_breaker_state",
            &[("node", "store"), ("state", "closed")]
        ),
        1.0
    );

    server.kill();
    let o = [("x-api-key", "o")];
    assert_eq!(ex.statuses("GET", "/", &o, 4), [200; 4]);
    assert_eq!(ex.statuses("GET", "/checkout", &o, 3), [503; 3]);
    // The local share of a fleet of one: the whole 5.
    let mut want = vec![200; 5];
    want.push(429);
    assert_eq!(ex.statuses("GET", "/search", &o, 6), want);
    let (_, text) = ex.http("GET", "/metrics", &[]);
    let m = |name: &str, labels: &[(&str, &str)]| sample(&text, name, labels);
    let d = |route: &str, outcome: &str| {
        m(
            "fleetlimit_decisions_total",
            &[("route", route), ("limit", "per-key"), ("outcome", outcome)],
        )
    };
    assert_eq!(d("/", "degraded_open"), 4.0);
    assert_eq!(d("/checkout", "degraded_closed"), 3.0);
    assert_eq!(d("/search", "degraded_local"), 5.0);
    assert_eq!(d("/search", "degraded_local_refused"), 1.0);
    // The calls that reached a dead Redis failed (refused, or timed out,
    // until the breaker opened); none was counted ok.
    let failed: f64 = ["unavailable", "timeout", "redis-error", "protocol"]
        .iter()
        .map(|r| {
            m(
                "fleetlimit_store_call_duration_seconds_count",
                &[("result", r)],
            )
        })
        .sum();
    assert!(failed >= 1.0, "{text}");
    assert_eq!(m("fleetlimit_store_call_duration_seconds_count", &ok), 6.0);
}

/// The precision a freeze spent, as a scraper reads it: the checks Redis
/// ran after their bound (discarded, nothing charged) and the `local`
/// admissions written back once Redis answered again.
#[test]
fn example_counts_late_checks_and_the_write_back() {
    let server = RedisServer::start();
    let ex = Example::start("metrics", &[], &[("REDIS_URL", &server.url())]);
    assert!(ex.banner.contains("using Redis at"), "{}", ex.banner);
    let p = [("x-api-key", "p")];
    assert_eq!(ex.statuses("GET", "/search", &p, 1), [200]);
    server.freeze();
    // Each waits out the 5 ms deadline, and `local` admits it.
    assert_eq!(ex.statuses("GET", "/search", &p, 3), [200; 3]);
    server.thaw();
    let late = |text: &str, event: &str| {
        sample(
            text,
            "fleetlimit_precision_events_total",
            &[("event", event)],
        )
    };
    let written = |text: &str, result: &str| {
        sample(
            text,
            "fleetlimit_writeback_units_total",
            &[("result", result)],
        )
    };
    // Bounded: the write-back starts within a second of Redis answering
    // (the breaker's cool-off first); a busy machine gets ten.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let text = loop {
        // A request lets the breaker see Redis again.
        let _ = ex.statuses("GET", "/", &[("x-api-key", "q")], 1);
        let (_, text) = ex.http("GET", "/metrics", &[]);
        if written(&text, "charged") >= 3.0 && late(&text, "late_discarded") >= 1.0 {
            break text;
        }
        assert!(std::time::Instant::now() < until, "{text}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(written(&text, "charged"), 3.0, "{text}");
    for nothing in ["clamped", "lost", "expired"] {
        assert_eq!(written(&text, nothing), 0.0, "{nothing}: {text}");
    }
    assert_eq!(late(&text, "unknown_outcome"), 0.0, "{text}");
    assert_eq!(late(&text, "settled_charged"), 0.0, "{text}");
}

/// Refusals the refused-key cache answered from entries a reset (or a
/// re-subscription) voided, as the example's scrape says.
fn voided(ex: &Example) -> f64 {
    scraped(
        ex,
        "fleetlimit_precision_events_total",
        &[("event", "refused_cache_voided")],
    )
}

/// A reset voids the refusals the refused-key cache remembered for the
/// key: the refusals they answered are counted (an upper bound of those
/// answered after the reset was made), as a scraper reads it.
#[test]
fn example_counts_refusals_a_reset_voided() {
    let server = RedisServer::start();
    let ex = Example::start("metrics", &[], &[("REDIS_URL", &server.url())]);
    assert!(ex.banner.contains("using Redis at"), "{}", ex.banner);
    let v = [("x-api-key", "v")];
    // 5 admitted, then one refusal from Redis and three from the cache.
    let mut want = vec![200; 5];
    want.extend([429; 4]);
    assert_eq!(ex.statuses("GET", "/", &v, 9), want);
    assert_eq!(voided(&ex), 0.0);
    assert_eq!(
        scraped(
            &ex,
            "fleetlimit_refused_cache_hits_total",
            &[("route", "/"), ("limit", "per-key")]
        ),
        3.0
    );

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/metrics.toml");
    let cfg = Config::from_toml_file(path)
        .unwrap()
        .try_with_redis_url(server.url())
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let admin = fleetlimit::admin::Admin::connect(&cfg).await.unwrap();
        assert_eq!(admin.reset("v", None).await, Ok(1));
    });
    // The announcement reaches the example's listener within a second on
    // an idle host; polled for longer on a busy one.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while voided(&ex) < 3.0 && std::time::Instant::now() < give_up {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(voided(&ex), 3.0);
    // The key goes to Redis again and finds its bucket full.
    assert_eq!(ex.statuses("GET", "/", &v, 1), [200]);
    assert_eq!(voided(&ex), 3.0, "no entry left to void");
}

/// Redis restarted: the reset listener subscribes again and forgets every
/// remembered refusal (an announcement may have been missed meanwhile);
/// what they answered is counted the same way.
#[test]
fn example_counts_refusals_a_resubscribe_voided() {
    let server = RedisServer::start();
    let ex = Example::start("metrics", &[], &[("REDIS_URL", &server.url())]);
    assert!(ex.banner.contains("using Redis at"), "{}", ex.banner);
    let w = [("x-api-key", "w")];
    let mut want = vec![200; 5];
    want.extend([429; 3]);
    assert_eq!(ex.statuses("GET", "/", &w, 8), want);
    assert_eq!(voided(&ex), 0.0);
    server.restart();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while voided(&ex) < 2.0 && std::time::Instant::now() < give_up {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(voided(&ex), 2.0, "the two refusals the cache answered");
    // The restarted Redis is empty: the key's bucket is full again.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut status = 0;
    while std::time::Instant::now() < give_up {
        status = ex.statuses("GET", "/", &w, 1)[0];
        if status == 200 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(status, 200);
}
