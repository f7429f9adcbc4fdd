//! Concurrency slots come back after a blip: a release that fails during a
//! network cut or a frozen Redis is queued and sent again once Redis
//! answers (src/store/redis/release.rs), so the key's slots are free
//! within a second of the heal, not at their `max_hold`; the queue is
//! bounded; under `local`, the slots an instance holds through Redis count
//! against its share (src/pipeline/check/held.rs). docs/accuracy.md, "Concurrency
//! slots".
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use fleetlimit::RateLimitLayer;
use tokio::sync::Semaphore;

use support::relay::Relay;
use support::*;

/// The issue's bound: slots free within a second of the heal (fred
/// reconnects within its policy's pause, at most 640 ms after a 0.7 s cut,
/// and the queue is sent again at most 250 ms after its last failure).
const AFTER_HEAL: Duration = Duration::from_secs(1);
/// The cut.
const BLIP: Duration = Duration::from_millis(700);
/// The freeze (the issue's, with traffic).
const FREEZE: Duration = Duration::from_secs(4);

/// examples/concurrency.toml's limits, on `/`; `{policy}` is replaced.
const LIMITS: &str = r#"
[fleet]
size = 1

[limits.searches]
key = "header:x-api-key"
capacity = 20
refill = "10/s"

[limits.searches-in-flight]
key = "header:x-api-key"
algorithm = "concurrency"
max_in_flight = 5
max_hold = "30s"

[default]
limits = ["searches", "searches-in-flight"]
on_redis_error = "{policy}"
"#;

/// Requests inside the handler now, and the most ever.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
}

/// `GET /` answers "ok" once `gate` gives it a permit (FIFO: the first
/// requests in are the first out), counted in `gauge` meanwhile.
fn gated(gate: &Arc<Semaphore>, gauge: &Arc<Gauge>) -> Router {
    let (g, n) = (Arc::clone(gate), Arc::clone(gauge));
    Router::new().route(
        "/",
        get(move || {
            let (g, n) = (Arc::clone(&g), Arc::clone(&n));
            async move {
                let now = n.now.fetch_add(1, Ordering::SeqCst) + 1;
                n.max.fetch_max(now, Ordering::SeqCst);
                g.acquire().await.unwrap().forget();
                n.now.fetch_sub(1, Ordering::SeqCst);
                "ok"
            }
        }),
    )
}

struct Setup {
    server: RedisServer,
    relay: Relay,
    app: Router,
    gate: Arc<Semaphore>,
    gauge: Arc<Gauge>,
    /// The in-flight limit's Redis key for API key "k".
    key: String,
}

/// Redis behind a relay, one instance on it (deadline 50 ms).
async fn setup(test: &str, policy: &str, limits: &str) -> Setup {
    setup_at(test, policy, limits, "50ms").await
}

/// [`setup`] with another deadline.
async fn setup_at(test: &str, policy: &str, limits: &str, deadline: &str) -> Setup {
    let server = RedisServer::start();
    let relay = Relay::start(server.port);
    let prefix = prefix(test);
    let body = limits.replace("{policy}", policy);
    let cfg = config_at(&relay.url(), &prefix, deadline, &body);
    let key = fleetlimit::admin::Admin::redis_key(&cfg, "searches-in-flight", "k").unwrap();
    let (gate, gauge) = (Arc::new(Semaphore::new(0)), Arc::new(Gauge::default()));
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    let app = gated(&gate, &gauge).layer(layer);
    Setup {
        server,
        relay,
        app,
        gate,
        gauge,
        key,
    }
}

fn zcard(server: &RedisServer, key: &str) -> u64 {
    server.cli(&["ZCARD", key]).unwrap().trim().parse().unwrap()
}

/// Polls until `done` (every 10 ms, at most `bound`); whether it happened.
async fn eventually(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + bound;
    while std::time::Instant::now() < until {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

/// `n` requests of API key "k", each in a task: their statuses.
fn spawn_requests(app: &Router, n: usize) -> Vec<tokio::task::JoinHandle<u16>> {
    (0..n)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let req = request("GET", "/", "127.0.0.1:9", &[("x-api-key", "k")]);
                send(&app, req).await.status().as_u16()
            })
        })
        .collect()
}

async fn statuses(tasks: Vec<tokio::task::JoinHandle<u16>>) -> Vec<u16> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Five requests in flight through Redis: their slots are in the set.
async fn five_in_flight(s: &Setup) -> Vec<tokio::task::JoinHandle<u16>> {
    let tasks = spawn_requests(&s.app, 5);
    assert!(
        eventually(Duration::from_secs(10), || zcard(&s.server, &s.key) == 5).await,
        "five slots taken: {}",
        zcard(&s.server, &s.key)
    );
    tasks
}

/// After the heal: the key's slots are free, and a new request of the key
/// admitted, within [`AFTER_HEAL`]. Requests the breaker still answers
/// (its cool-off after the outage: 503 on this closed route) are sent again.
async fn free_after_heal(s: &Setup, healed: std::time::Instant) {
    let freed = eventually(AFTER_HEAL, || zcard(&s.server, &s.key) == 0).await;
    let took = healed.elapsed();
    assert!(
        freed,
        "{} slots still held {took:?} after the heal",
        zcard(&s.server, &s.key)
    );
    loop {
        let next = spawn_requests(&s.app, 1);
        let done = || next[0].is_finished() || zcard(&s.server, &s.key) == 1;
        assert!(eventually(Duration::from_secs(5), done).await);
        if !next[0].is_finished() {
            // Admitted, holding a slot: within the bound.
            let took = healed.elapsed();
            assert!(took <= AFTER_HEAL, "admitted {took:?} after the heal");
            s.gate.add_permits(1);
            assert_eq!(statuses(next).await, [200]);
            return;
        }
        let status = statuses(next).await;
        assert_eq!(status, [503], "only the breaker's cool-off");
        assert!(
            healed.elapsed() <= AFTER_HEAL,
            "still refused after the heal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A 0.7 s cut during which five slow requests end: their releases fail,
/// and after the heal the five slots are free within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_slots_released_during_a_cut_are_free_within_a_second_of_the_heal() {
    let s = setup("blip-cut", "closed", LIMITS).await;
    let held = five_in_flight(&s).await;
    let began = std::time::Instant::now();
    s.relay.cut();
    // The five end during the cut: their releases cannot reach Redis.
    s.gate.add_permits(5);
    assert_eq!(statuses(held).await, [200; 5]);
    assert_eq!(zcard(&s.server, &s.key), 5, "released through a cut relay?");
    tokio::time::sleep(BLIP.saturating_sub(began.elapsed())).await;
    s.relay.heal();
    free_after_heal(&s, std::time::Instant::now()).await;
}

/// The same under a freeze (`SIGSTOP`, then `SIGCONT`) of [`FREEZE`] with
/// traffic: the key's requests meanwhile are answered by the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_slots_released_during_a_freeze_are_free_within_a_second_of_the_thaw() {
    let s = setup("blip-freeze", "closed", LIMITS).await;
    let held = five_in_flight(&s).await;
    let began = std::time::Instant::now();
    s.server.freeze();
    s.gate.add_permits(5);
    assert_eq!(statuses(held).await, [200; 5]);
    // Traffic meanwhile, answered by the policy (closed: 503).
    while began.elapsed() < FREEZE {
        let during = statuses(spawn_requests(&s.app, 3)).await;
        assert_eq!(during, [503; 3], "frozen Redis, closed route");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.server.thaw();
    free_after_heal(&s, std::time::Instant::now()).await;
}

/// Under `local` during a freeze (fleet of 1, share 5): the five requests
/// this instance holds through Redis count against its share, so none of
/// eight more is admitted; once two of the five end, two more are, and
/// never more than five are in flight here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_local_the_slots_held_through_redis_count_against_the_share() {
    let s = setup("blip-local", "local", LIMITS).await;
    // max_in_flight ÷ fleet size.
    let share = 5;
    let held = five_in_flight(&s).await;
    s.server.freeze();
    let eight = spawn_requests(&s.app, 8);
    let answered = || eight.iter().all(|t| t.is_finished());
    let admitted = || s.gauge.now.load(Ordering::SeqCst) - share;
    assert!(
        eventually(Duration::from_secs(10), answered).await,
        "{} of eight admitted locally, over the share held through Redis",
        admitted()
    );
    let eight = statuses(eight).await;
    assert_eq!(eight, [429; 8], "the share is held through Redis");
    assert_eq!(s.gauge.now.load(Ordering::SeqCst), share);
    // Two of the five (the first in the gate) end: their slots leave this
    // instance's count, whether or not Redis hears of it now.
    s.gate.add_permits(2);
    assert!(
        eventually(Duration::from_secs(5), || held
            .iter()
            .filter(|t| t.is_finished())
            .count()
            == 2)
        .await
    );
    let more = spawn_requests(&s.app, 4);
    assert!(
        eventually(Duration::from_secs(5), || more
            .iter()
            .filter(|t| t.is_finished())
            .count()
            == 2)
        .await,
        "two of four refused at once"
    );
    assert_eq!(s.gauge.now.load(Ordering::SeqCst), share, "in flight here");
    assert!(
        s.gauge.max.load(Ordering::SeqCst) <= share,
        "never over the share"
    );
    s.server.thaw();
    s.gate.add_permits(5);
    let mut all = statuses(held).await;
    all.extend(statuses(more).await);
    all.sort_unstable();
    assert_eq!(all, [200, 200, 200, 200, 200, 200, 200, 429, 429]);
    assert!(s.gauge.max.load(Ordering::SeqCst) <= share);
    // The local admissions took no slot in Redis; the five Redis ones are
    // given back.
    assert!(
        eventually(AFTER_HEAL * 5, || zcard(&s.server, &s.key) == 0).await,
        "{}",
        zcard(&s.server, &s.key)
    );
}

/// The queue's bound (src/store/redis/release.rs).
const MAX_QUEUED: u64 = 4_096;

/// More releases fail during a cut than the queue keeps: the oldest are
/// dropped, counted, and their slots count until `max_hold`; the others
/// are given back after the heal. Memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_failed_releases_than_the_queue_holds_drop_the_oldest_counted() {
    #[cfg(feature = "metrics")]
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    #[cfg(feature = "metrics")]
    let snapshotter = recorder.snapshotter();
    #[cfg(feature = "metrics")]
    let _local = metrics::set_default_local_recorder(&recorder);
    let over = 104;
    let n = MAX_QUEUED + over;
    let limits = LIMITS
        .replace("max_in_flight = 5", "max_in_flight = 5000")
        .replace("capacity = 20", "capacity = 5000");
    // 200 checks in flight at once: on a busy host a few of them took
    // longer than 50 ms (and were refused, `closed`), so this test's
    // deadline is 250 ms, still far below the cut (BLIP).
    let s = setup_at("blip-overflow", "closed", &limits, "250ms").await;
    // In waves, so that none waits for Redis longer than its deadline.
    let mut held = Vec::new();
    for wave in 0..n.div_ceil(200) {
        let k = 200.min(n - wave * 200);
        held.extend(spawn_requests(&s.app, k as usize));
        let want = wave * 200 + k;
        assert!(
            eventually(Duration::from_secs(30), || zcard(&s.server, &s.key) == want).await,
            "wave {wave}: {} slots, not {want}",
            zcard(&s.server, &s.key)
        );
    }
    s.relay.cut();
    s.gate.add_permits(n as usize);
    let all = statuses(held).await;
    assert!(all.iter().all(|&st| st == 200), "all admitted");
    tokio::time::sleep(BLIP).await;
    s.relay.heal();
    // Sent again one by one: not a performance bound, a generous one. A
    // dropped release counts until max_hold at most: fred may still send
    // a command it holds after its caller stopped waiting.
    let rest = eventually(Duration::from_secs(30), || zcard(&s.server, &s.key) <= over).await;
    assert!(rest, "{} slots left, over {over}", zcard(&s.server, &s.key));
    #[cfg(feature = "metrics")]
    {
        // A snapshot takes the counters' values (and resets them): summed
        // over snapshots until every queued release was sent again and
        // answered (a retry that timed out on a busy host is queued again
        // and counted when it succeeds), 30 s at most.
        let mut counts: std::collections::HashMap<String, u64> = Default::default();
        let give_up = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            for (k, _, _, v) in snapshotter.snapshot().into_vec() {
                let key = k.key();
                if key.name() != "fleetlimit_slot_releases_total" {
                    continue;
                }
                let Some(result) = key.labels().find(|l| l.key() == "result") else {
                    continue;
                };
                let c = match v {
                    metrics_util::debugging::DebugValue::Counter(c) => c,
                    other => panic!("{other:?}"),
                };
                *counts.entry(result.value().to_owned()).or_default() += c;
            }
            let settled = counts.get("retried").copied().unwrap_or(0)
                + counts.get("dropped").copied().unwrap_or(0)
                >= n;
            if settled || std::time::Instant::now() > give_up {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let releases = |result: &str| counts.get(result).copied().unwrap_or(0);
        assert_eq!(releases("failed"), n);
        assert_eq!(releases("dropped"), over);
        assert_eq!(releases("retried"), MAX_QUEUED);
        assert_eq!(releases("refused") + releases("expired"), 0);
    }
}

/// Garbage: while a release waits in the queue, the key is replaced by a
/// string. Sent again after the heal, Redis answers `WRONGTYPE`: nothing of
/// that request is there, so it is not sent again (no loop, no panic), and
/// the key's next check repairs it and is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_replaced_by_a_string_while_its_release_waits_is_repaired() {
    let s = setup("blip-garbage", "closed", LIMITS).await;
    let held = spawn_requests(&s.app, 1);
    assert!(eventually(Duration::from_secs(10), || zcard(&s.server, &s.key) == 1).await);
    s.relay.cut();
    s.gate.add_permits(1);
    assert_eq!(statuses(held).await, [200]);
    s.server
        .cli(&["SET", &s.key, "not a set of slots"])
        .unwrap();
    s.relay.heal();
    // The retry met the string and let it be.
    tokio::time::sleep(AFTER_HEAL).await;
    let t = s.server.cli(&["TYPE", &s.key]).unwrap();
    assert_eq!(t.trim(), "string", "a release never writes over a key");
    let next = spawn_requests(&s.app, 1);
    assert!(
        eventually(Duration::from_secs(5), || s
            .server
            .cli(&["TYPE", &s.key])
            .unwrap()
            .trim()
            == "zset"
            && zcard(&s.server, &s.key) == 1)
        .await,
        "the next check repairs the key and takes its slot"
    );
    s.gate.add_permits(1);
    assert_eq!(statuses(next).await, [200]);
    assert!(eventually(AFTER_HEAL * 5, || zcard(&s.server, &s.key) == 0).await);
}
