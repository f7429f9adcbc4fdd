//! Load shedding (`[shedding]`): under overload the least important routes
//! are refused with 503 before any limit is charged, critical ones keep
//! being served; without overload nothing is shed; the fleet-wide signal
//! set in Redis reaches every instance within its refresh period, and a
//! Redis that is down or frozen neither blocks requests nor keeps the fleet
//! shedding.
// Its Redis tests need the `redis` feature; their helpers are unused without it.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports))]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use fleetlimit::configuration::RouteConfig;
use fleetlimit::shed::{Accepted, Priority, SheddingConfig};
use fleetlimit::{Config, RateLimitLayer};
use http::Request;
use support::stats::Parts;
use support::{RedisServer, body_text, header, send};

/// A backend stand-in that serves `capacity` requests at once at `base`
/// latency; beyond that, latency grows with its concurrency (each request
/// takes `base × in_flight / capacity`), as a saturated search cluster's
/// does.
struct Backend {
    in_flight: AtomicU32,
    /// The most requests it ever had at once.
    peak: AtomicU32,
    capacity: u32,
    base: Duration,
}

impl Backend {
    fn new(capacity: u32, base: Duration) -> Arc<Self> {
        Arc::new(Self {
            in_flight: AtomicU32::new(0),
            peak: AtomicU32::new(0),
            capacity,
            base,
        })
    }

    async fn serve(&self) -> &'static str {
        struct Leave<'a>(&'a AtomicU32);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let n = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(n, Ordering::Relaxed);
        let _leave = Leave(&self.in_flight);
        let factor = (f64::from(n) / f64::from(self.capacity)).max(1.0);
        tokio::time::sleep(self.base.mul_f64(factor)).await;
        "ok"
    }

    /// What the application reports as its load signal: 1.0 = saturated.
    fn load(&self) -> f64 {
        f64::from(self.in_flight.load(Ordering::Relaxed)) / f64::from(self.capacity)
    }
}

const ROUTES: &str = r#"
[limits.everyone]
key = "global"
capacity = 1000000
refill = "1000000/s"

[[routes]]
path = "/critical"
limits = ["everyone"]
priority = "critical"

[[routes]]
path = "/normal"
limits = []

[[routes]]
path = "/sheddable"
limits = []
priority = "sheddable"
"#;

fn router(backend: &Arc<Backend>, layer: RateLimitLayer) -> Router {
    let route = |b: Arc<Backend>| get(move || async move { b.serve().await });
    Router::new()
        .route("/critical", route(Arc::clone(backend)))
        .route("/normal", route(Arc::clone(backend)))
        .route("/sheddable", route(Arc::clone(backend)))
        .layer(layer)
}

/// An in-process layer with `[shedding]` and the backend's load signal.
async fn shedding_app(backend: &Arc<Backend>, shedding: &str) -> Router {
    let cfg = Config::from_toml_str(&format!("{ROUTES}\n[shedding]\n{shedding}")).unwrap();
    let b = Arc::clone(backend);
    let layer = RateLimitLayer::new(cfg)
        .load_signal(move || b.load())
        .await
        .unwrap();
    router(backend, layer)
}

fn get_req(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

#[derive(Default, Debug)]
struct Tally {
    ok: u64,
    shed: u64,
    other: u64,
}

/// `clients` loops sending to `path` for `span`. A shed client pauses
/// briefly before its next try (keeps the test light on CPU).
async fn drive(app: &Router, path: &'static str, clients: usize, span: Duration) -> Tally {
    let end = Instant::now() + span;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::default();
            while Instant::now() < end {
                let res = send(&app, get_req(path)).await;
                match res.status().as_u16() {
                    200 => t.ok += 1,
                    503 => {
                        assert_eq!(header(&res, "retry-after").as_deref(), Some("1"));
                        let body = body_text(res).await;
                        assert!(
                            body.contains(r#""type":"urn:fleetlimit:overloaded""#),
                            "{body}"
                        );
                        t.shed += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    _ => t.other += 1,
                }
            }
            t
        }));
    }
    let mut total = Tally::default();
    for t in tasks {
        let t = t.await.unwrap();
        total.ok += t.ok;
        total.shed += t.shed;
        total.other += t.other;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_four_times_capacity_critical_is_served_and_sheddable_is_shed() {
    // Capacity 8: 4 critical + 28 sheddable clients keep 32 requests
    // wanted at once, 4× what the backend serves.
    let backend = Backend::new(8, Duration::from_millis(20));
    let app = shedding_app(&backend, "").await;
    let span = Duration::from_millis(1500);
    let (critical, sheddable) = tokio::join!(
        drive(&app, "/critical", 4, span),
        drive(&app, "/sheddable", 28, span)
    );
    let peak = backend.peak.load(Ordering::Relaxed);
    eprintln!("critical {critical:?}, sheddable {sheddable:?}, backend peak {peak}");
    // Sheddable work stops at pressure 0.8 (6.4 of 8), so the backend never
    // gets near 4× its capacity: at most the critical clients beyond that,
    // plus the one or two admissions that race on the 2 worker threads.
    assert!(peak <= 14, "backend peak {peak}");
    assert!(sheddable.ok > 0, "below 0.8 sheddable work is still served");
    assert_eq!(critical.other + sheddable.other, 0);
    let rate = critical.ok as f64 / (critical.ok + critical.shed) as f64;
    assert!(
        critical.ok >= 50 && rate >= 0.9,
        "critical success {rate:.3}"
    );
    let shed_rate = sheddable.shed as f64 / (sheddable.ok + sheddable.shed) as f64;
    assert!(shed_rate >= 0.5, "sheddable shed rate {shed_rate:.3}");
    assert!(sheddable.shed >= 100, "sheddable mostly shed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_half_capacity_nothing_is_shed() {
    let backend = Backend::new(8, Duration::from_millis(20));
    let app = shedding_app(&backend, "max_in_flight = 8").await;
    let span = Duration::from_millis(1000);
    let (critical, normal, sheddable) = tokio::join!(
        drive(&app, "/critical", 1, span),
        drive(&app, "/normal", 1, span),
        drive(&app, "/sheddable", 2, span)
    );
    for t in [&critical, &normal, &sheddable] {
        assert_eq!((t.shed, t.other), (0, 0), "{t:?}");
        assert!(t.ok >= 10, "{t:?}");
    }
}

#[tokio::test]
async fn the_shed_answer_names_priority_and_signal_and_charges_nothing() {
    let load = Arc::new(AtomicU64::new(0f64.to_bits()));
    let l = Arc::clone(&load);
    let cfg = Config::from_toml_str(&format!(
        "{ROUTES}\n[limits.one]\nkey = \"global\"\ncapacity = 1\nrefill = \"1/min\"\n\
         [[routes]]\npath = \"/once\"\nlimits = [\"one\"]\npriority = \"sheddable\"\n\
         [shedding]\nretry_after = \"3s\"\n"
    ))
    .unwrap();
    let layer = RateLimitLayer::new(cfg)
        .load_signal(move || f64::from_bits(l.load(Ordering::Relaxed)))
        .await
        .unwrap();
    let app = Router::new()
        .route("/once", get(|| async { "ok" }))
        .route("/normal", get(|| async { "ok" }))
        .route("/sheddable", get(|| async { "ok" }))
        .route("/critical", get(|| async { "ok" }))
        .layer(layer);
    let set = |v: f64| load.store(v.to_bits(), Ordering::Relaxed);

    set(0.85);
    let res = send(&app, get_req("/once")).await;
    assert_eq!(res.status(), 503);
    assert_eq!(header(&res, "retry-after").as_deref(), Some("3"));
    assert_eq!(
        header(&res, "content-type").as_deref(),
        Some("application/problem+json")
    );
    assert_eq!(
        header(&res, "x-ratelimit-remaining"),
        None,
        "no limit was consulted"
    );
    let body = body_text(res).await;
    for part in [
        r#""type":"urn:fleetlimit:overloaded""#,
        r#""status":503"#,
        r#""priority":"sheddable""#,
        r#""signal":"app""#,
        r#""pressure":0.85"#,
    ] {
        assert!(body.contains(part), "{part} in {body}");
    }
    // Normal routes are served below 1.0, shed from it; critical from 1.5.
    assert_eq!(send(&app, get_req("/normal")).await.status(), 200);
    set(1.0);
    assert_eq!(send(&app, get_req("/normal")).await.status(), 503);
    assert_eq!(send(&app, get_req("/critical")).await.status(), 200);
    set(1.5);
    let res = send(&app, get_req("/critical")).await;
    assert_eq!(res.status(), 503);
    assert!(body_text(res).await.contains(r#""priority":"critical""#));
    set(f64::NAN);
    assert_eq!(
        send(&app, get_req("/sheddable")).await.status(),
        200,
        "NaN is no load"
    );

    // The shed request charged nothing: the one-token limit still admits.
    set(0.0);
    let res = send(&app, get_req("/once")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "x-ratelimit-remaining").as_deref(), Some("0"));
}

#[tokio::test]
async fn requests_in_flight_count_until_the_body_is_over() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = Arc::clone(&gate);
    let cfg = Config::builder()
        .route("/held", RouteConfig::new(Vec::<String>::new()))
        .route(
            "/critical",
            RouteConfig::new(Vec::<String>::new()).priority(Priority::Critical),
        )
        .shedding(SheddingConfig::default().max_in_flight(2))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    let app = Router::new()
        .route(
            "/held",
            get(move || async move {
                g.acquire().await.unwrap().forget();
                "held"
            }),
        )
        .route("/critical", get(|| async { "ok" }))
        .layer(layer.clone());
    assert_eq!(layer.in_flight(), Some(0));
    let a = tokio::spawn(send_owned(app.clone(), "/held"));
    let b = tokio::spawn(send_owned(app.clone(), "/held"));
    wait_for(|| layer.in_flight() == Some(2)).await;
    let res = send(&app, get_req("/held")).await;
    assert_eq!(res.status(), 503, "2 of 2 in flight: normal is shed");
    assert!(body_text(res).await.contains(r#""signal":"in_flight""#));
    // Critical goes on to 1.5 × max_in_flight: it still gets in, and its
    // place is given back once its response is over.
    let res = send(&app, get_req("/critical")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(layer.in_flight(), Some(3), "held while the body is unread");
    drop(res);
    assert_eq!(layer.in_flight(), Some(2), "a dropped body gives it back");
    gate.add_permits(2);
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    assert_eq!(body_text(a).await, "held");
    assert_eq!(layer.in_flight(), Some(1));
    drop(b);
    assert_eq!(layer.in_flight(), Some(0));
}

async fn send_owned(app: Router, path: &'static str) -> http::Response<Body> {
    send(&app, get_req(path)).await
}

/// Polls `cond` every 10 ms, at most 500 times (5 s).
async fn wait_for(mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not reached in 5 s");
}

/// CoDel's settings in the queueing tests; every margin comes from them. A
/// request that waited 2 × the target is above it whatever the scheduling
/// (the wait only grows); one that did not wait is below it unless this
/// process stalls for 100 ms. The verdict needs an interval (1 s) of such
/// waits, and lapses an interval after the last sample: far from the
/// tests' own pauses (tens of ms), so scheduling noise can neither make nor
/// break it.
const QUEUE: &str = "queue_delay_target = \"100ms\"\nqueue_delay_interval = \"1s\"";
const TARGET: Duration = Duration::from_millis(100);
const INTERVAL: Duration = Duration::from_secs(1);
/// Sends polling for the verdict, at least 20 ms apart: 5 intervals.
const POLLS: u32 = 250;

/// Sends `next()` until it is answered `503` (then returns that response),
/// 20 ms apart, at most [`POLLS`] times; every other answer must be `200`.
async fn poll_until_shed<F, Fut>(mut next: F) -> http::Response<Body>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = http::Response<Body>>,
{
    for _ in 0..POLLS {
        let res = next().await;
        if res.status() == 503 {
            return res;
        }
        assert_eq!(res.status(), 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not shed after {POLLS} sends (5 queue-delay intervals)");
}

#[tokio::test]
async fn a_standing_queue_sheds_normal_work_and_a_short_wait_ends_it() {
    let backend = Backend::new(1000, Duration::from_millis(1));
    let app = shedding_app(&backend, QUEUE).await;
    let queued = |path: &str, waited: Duration| {
        let mut req = get_req(path);
        req.extensions_mut()
            .insert(Accepted(Instant::now() - waited));
        req
    };
    let stale = TARGET * 2;
    // A queue that has not stood for an interval is no overload: the first
    // sample is after `start`, so a request answered within an interval of
    // it was admitted before the verdict could be reached.
    let start = Instant::now();
    while start.elapsed() < INTERVAL / 2 {
        let res = send(&app, queued("/normal", stale)).await;
        if start.elapsed() < INTERVAL {
            assert_eq!(res.status(), 200, "not an interval yet");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every request above target for an interval: overloaded.
    let res = poll_until_shed(|| send(&app, queued("/normal", stale))).await;
    assert!(body_text(res).await.contains(r#""signal":"queue_delay""#));
    assert_eq!(send(&app, queued("/sheddable", stale)).await.status(), 503);
    let res = send(&app, queued("/critical", stale)).await;
    assert_eq!(res.status(), 200, "critical is not shed by queueing delay");
    // One request that did not wait ends it: the next queued one starts a
    // new interval, and is served.
    assert_eq!(
        send(&app, queued("/critical", Duration::ZERO))
            .await
            .status(),
        200
    );
    assert_eq!(send(&app, queued("/normal", stale)).await.status(), 200);
}

#[tokio::test]
async fn without_shedding_nothing_changes() {
    let reads = Arc::new(AtomicU32::new(0));
    let r = Arc::clone(&reads);
    let backend = Backend::new(1, Duration::from_millis(1));
    let cfg = Config::from_toml_str(ROUTES).unwrap();
    let layer = RateLimitLayer::new(cfg)
        .load_signal(move || {
            r.fetch_add(1, Ordering::Relaxed);
            10.0
        })
        .await
        .unwrap();
    assert_eq!(layer.in_flight(), None);
    let app = router(&backend, layer);
    for path in ["/critical", "/normal", "/sheddable"] {
        let mut req = get_req(path);
        req.extensions_mut()
            .insert(Accepted(Instant::now() - Duration::from_secs(1)));
        let res = send(&app, req).await;
        assert_eq!(res.status(), 200, "{path}");
        // The unlimited routes get no rate-limit headers, as before.
        assert_eq!(
            header(&res, "x-ratelimit-limit").is_some(),
            path == "/critical"
        );
    }
    assert_eq!(reads.load(Ordering::Relaxed), 0, "the signal is never read");
}

// ---- the fleet-wide signal, on a real Redis ----

/// How often the instances read the fleet key in these tests.
const REFRESH: Duration = Duration::from_millis(200);

/// The fleet signal reaches an instance within one refresh period plus
/// the time one read takes; on a busy 2-core machine a read is given
/// 400 ms (80× its usual time, well under the 1 s the GET may take).
const READ_MARGIN: Duration = Duration::from_millis(400);

/// The Redis deadline in these tests. A check never waits more than the
/// deadline + 50 ms (room the layer gives the host's own stalls).
const DEADLINE: Duration = Duration::from_millis(50);
const LONGEST_CHECK: Duration = DEADLINE.saturating_add(Duration::from_millis(50));

fn fleet_config(server: &RedisServer, prefix: &str) -> Config {
    support::redis_config(
        server,
        prefix,
        &format!("{}ms", DEADLINE.as_millis()),
        &format!(
            "{ROUTES}\n[shedding]\nfleet_signal_refresh = \"{}ms\"\n",
            REFRESH.as_millis()
        ),
    )
}

async fn fleet_app(server: &RedisServer, prefix: &str, load: Arc<AtomicU64>) -> Router {
    let backend = Backend::new(1000, Duration::from_millis(1));
    let layer = RateLimitLayer::new(fleet_config(server, prefix))
        .load_signal(move || f64::from_bits(load.load(Ordering::Relaxed)))
        .await
        .unwrap();
    router(&backend, layer)
}

fn fleet_key(prefix: &str) -> String {
    format!("{prefix}:shed:{{fleet}}")
}

/// How long until `path` on `app` is answered `status`, polled every 20 ms;
/// panics after `bound`.
async fn time_until(app: &Router, path: &str, status: u16, bound: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let res = send(app, get_req(path)).await;
        if res.status().as_u16() == status {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < bound,
            "{path} not {status} within {bound:?} (still {})",
            res.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_signal_reaches_every_instance_within_its_refresh_period() {
    let server = RedisServer::start();
    let prefix = support::prefix("shed-fleet");
    let none = || Arc::new(AtomicU64::new(0));
    let instances = [
        fleet_app(&server, &prefix, none()).await,
        fleet_app(&server, &prefix, none()).await,
        fleet_app(&server, &prefix, none()).await,
    ];
    let bound = REFRESH + READ_MARGIN;
    for app in &instances {
        assert_eq!(send(app, get_req("/sheddable")).await.status(), 200);
    }
    let key = fleet_key(&prefix);
    server.cli(&["SET", &key, "0.9", "EX", "60"]).unwrap();
    for app in &instances {
        time_until(app, "/sheddable", 503, bound).await;
    }
    for app in &instances {
        let res = send(app, get_req("/sheddable")).await;
        assert!(body_text(res).await.contains(r#""signal":"fleet""#));
        assert_eq!(
            send(app, get_req("/normal")).await.status(),
            200,
            "0.9 < 1.0"
        );
    }
    server.cli(&["DEL", &key]).unwrap();
    for app in &instances {
        time_until(app, "/sheddable", 200, bound).await;
    }
    // An expiry ends it too (1 s, then one refresh).
    server.cli(&["SET", &key, "1.2", "EX", "1"]).unwrap();
    for app in &instances {
        time_until(app, "/normal", 503, bound).await;
    }
    for app in &instances {
        time_until(app, "/normal", 200, Duration::from_secs(1) + bound).await;
        assert_eq!(send(app, get_req("/sheddable")).await.status(), 200);
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_the_fleet_key_is_ignored() {
    let server = RedisServer::start();
    let prefix = support::prefix("shed-garbage");
    let app = fleet_app(&server, &prefix, Arc::new(AtomicU64::new(0))).await;
    let key = fleet_key(&prefix);
    for garbage in ["banana", "-1", "inf", ""] {
        server.cli(&["SET", &key, garbage, "EX", "60"]).unwrap();
        // Three refreshes: every instance has read it by then.
        let end = Instant::now() + REFRESH * 3;
        while Instant::now() < end {
            let res = send(&app, get_req("/sheddable")).await;
            assert_eq!(res.status(), 200, "{garbage:?} must not shed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Not a string at all: the read fails, and is not a 500 either.
    server.cli(&["DEL", &key]).unwrap();
    server.cli(&["RPUSH", &key, "1.5"]).unwrap();
    server.cli(&["EXPIRE", &key, "60"]).unwrap();
    tokio::time::sleep(REFRESH * 2).await;
    assert_eq!(send(&app, get_req("/sheddable")).await.status(), 200);
    // A good value after all that still works.
    server.cli(&["DEL", &key]).unwrap();
    server.cli(&["SET", &key, "0.9"]).unwrap(); // no expiry: honoured (and warned)
    time_until(&app, "/sheddable", 503, REFRESH + READ_MARGIN).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_or_down_neither_blocks_requests_nor_keeps_shedding() {
    let server = RedisServer::start();
    let prefix = support::prefix("shed-down");
    let load = Arc::new(AtomicU64::new(0));
    let app = fleet_app(&server, &prefix, Arc::clone(&load)).await;
    let key = fleet_key(&prefix);
    server.cli(&["SET", &key, "0.9", "EX", "60"]).unwrap();
    time_until(&app, "/sheddable", 503, REFRESH + READ_MARGIN).await;

    // Frozen right after a read (PTTL is its last command), so the value's
    // age counts from about the freeze, not from up to a refresh before.
    let reads = server.calls_of("pttl");
    let mut polls = 0;
    while server.calls_of("pttl") == reads {
        polls += 1;
        assert!(
            polls < 200,
            "no fleet-signal read in 200 polls (> 5 refreshes)"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.freeze();
    let frozen_at = Instant::now();
    // The last value read is kept for 3 refresh periods (600 ms), then
    // forgotten: a frozen Redis does not hold the fleet in shedding. Within
    // one refresh of the freeze it is at most ~1 refresh old: kept.
    let res = send(&app, get_req("/sheddable")).await;
    if frozen_at.elapsed() < REFRESH {
        assert_eq!(res.status(), 503, "the last value is kept for a while");
    }
    let _ = time_until(&app, "/sheddable", 200, REFRESH * 4 + READ_MARGIN * 2).await;
    // Counted from the freeze, not from this call: a slow request before
    // it would make the value look forgotten early.
    let forgotten = frozen_at.elapsed();
    assert!(
        forgotten >= REFRESH,
        "kept at least one refresh: {forgotten:?}"
    );
    // Requests never wait on the fleet task: limited and unlimited routes
    // answer within the deadline's reach while Redis is frozen (the
    // limited one by its `open` failure policy); 5 × the longest check
    // leaves room for a busy machine.
    for path in ["/normal", "/critical", "/sheddable"] {
        let t = Instant::now();
        let res = send(&app, get_req(path)).await;
        assert_eq!(res.status(), 200, "{path}");
        assert!(t.elapsed() < LONGEST_CHECK * 5, "{path}: {:?}", t.elapsed());
    }
    // Local signals still shed.
    load.store(0.9f64.to_bits(), Ordering::Relaxed);
    let res = send(&app, get_req("/sheddable")).await;
    assert_eq!(res.status(), 503);
    assert!(body_text(res).await.contains(r#""signal":"app""#));
    load.store(0f64.to_bits(), Ordering::Relaxed);
    server.thaw();

    // Back up: read again. Then down for good: forgotten again.
    time_until(&app, "/sheddable", 503, REFRESH + READ_MARGIN * 2).await;
    server.kill();
    time_until(&app, "/sheddable", 200, REFRESH * 4 + READ_MARGIN * 2).await;
    assert_eq!(send(&app, get_req("/normal")).await.status(), 200);
}

// ---- configuration errors, with file:line:col ----

fn config_error(toml: &str) -> fleetlimit::ConfigError {
    Config::from_toml_str(toml).expect_err("must be refused")
}

#[test]
fn bad_shedding_settings_are_errors_at_their_place() {
    let cases: &[(&str, usize, &str)] = &[
        ("[shedding]\nsheddable_at = 1.2\n", 2, "sheddable_at"),
        ("[shedding]\nsheddable_at = 0\n", 2, "sheddable_at"),
        ("[shedding]\ncritical_at = 0.5\n", 2, "critical_at"),
        ("[shedding]\nmax_in_flight = 0\n", 2, "max_in_flight"),
        ("[shedding]\nretry_after = \"500ms\"\n", 2, "retry_after"),
        ("[shedding]\nretry_after = \"1500ms\"\n", 2, "retry_after"),
        (
            "[shedding]\nqueue_delay_target = \"0ms\"\n",
            2,
            "queue_delay_target",
        ),
        (
            "[shedding]\nqueue_delay_target = \"50ms\"\nqueue_delay_interval = \"10ms\"\n",
            3,
            "queue_delay_interval",
        ),
        ("[shedding]\nfleet_signal_refresh = \"soon\"\n", 2, "soon"),
        ("[shedding]\nmax_inflight = 3\n", 2, "max_inflight"),
        (
            "[[routes]]\npath = \"/x\"\nlimits = []\npriority = \"urgent\"\n",
            4,
            "urgent",
        ),
        ("[default]\nlimits = []\npriority = 3\n", 3, "string"),
    ];
    for (toml, line, names) in cases {
        let e = config_error(toml);
        let shown = e.to_string();
        assert_eq!(e.line(), Some(*line), "{shown}\n{toml}");
        assert!(shown.contains(names), "{shown:?} should name {names}");
        assert!(e.column().is_some(), "{shown}");
    }
    let dir = std::env::temp_dir().join(format!("fleetlimit-shed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fleetlimit.toml");
    std::fs::write(&file, "[shedding]\nmax_in_flight = 10\ncritical_at = 0.9\n").unwrap();
    let e = Config::from_toml_file(&file).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("{}:3:", file.display())),
        "file:line:col: {e}"
    );
}

#[test]
fn the_builder_checks_the_same_bounds() {
    let e = Config::builder()
        .shedding(SheddingConfig::default().sheddable_at(1.1))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("sheddable_at"), "{e}");
    let e = Config::builder()
        .shedding(SheddingConfig::default().critical_at(f64::NAN))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("critical_at"), "{e}");
    let cfg = Config::from_toml_str(
        "[[routes]]\npath = \"/x\"\nlimits = []\npriority = \"sheddable\"\n[shedding]\n",
    )
    .unwrap();
    assert!(
        cfg.describe().contains("priority sheddable"),
        "{}",
        cfg.describe()
    );
    assert!(cfg.describe().contains("shedding:"), "{}", cfg.describe());
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleetlimit_shed_sets_the_signal_with_an_expiry_and_clears_it() {
    let server = RedisServer::start();
    let prefix = support::prefix("shed-cli");
    let app = fleet_app(&server, &prefix, Arc::new(AtomicU64::new(0))).await;
    let dir = std::env::temp_dir().join(format!("fleetlimit-shed-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fleetlimit.toml");
    std::fs::write(
        &file,
        format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n[shedding]\n",
            server.url()
        ),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let cli = |args: &[&str]| support::run_cli(args, &[]);

    let (code, out, err) = cli(&["shed", "0.9", "--for", "10m", "--config", file]);
    assert_eq!(code, 0, "{out}{err}");
    let keys = server.keys_with_pttl(&prefix);
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(keys[0].0, fleet_key(&prefix));
    assert!(
        (590_000..=600_000).contains(&keys[0].1),
        "expires in 10 min: {keys:?}"
    );
    time_until(&app, "/sheddable", 503, REFRESH + READ_MARGIN).await;
    // The sweep leaves the operator's signal alone, and says why.
    let (code, out, err) = cli(&["sweep", "--config", file]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("fleet-wide shedding signal"), "{out}");
    assert_eq!(server.keys_with_pttl(&prefix).len(), 1);

    let (code, out, err) = cli(&["shed", "off", "--config", file]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(server.keys_with_pttl(&prefix).is_empty());
    time_until(&app, "/sheddable", 200, REFRESH + READ_MARGIN).await;

    // Bad usage: no expiry, not a number, a negative pressure.
    for args in [
        &["shed", "1.2", "--config", file][..],
        &["shed", "banana", "--for", "1m", "--config", file],
        &["shed", "-1", "--for", "1m", "--config", file],
    ] {
        let (code, _, err) = cli(args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
    assert!(server.keys_with_pttl(&prefix).is_empty());
}

#[tokio::test]
async fn accepted_layer_outside_the_router_measures_the_wait_in_front() {
    use std::sync::atomic::AtomicBool;
    use tower::ServiceExt;

    let backend = Backend::new(1000, Duration::from_millis(1));
    let slow = Arc::new(AtomicBool::new(true));
    let s = Arc::clone(&slow);
    // Something in front of the limiter that makes requests wait twice the
    // target (a queue).
    let queue = axum::middleware::from_fn(move |req, next: axum::middleware::Next| {
        let s = Arc::clone(&s);
        async move {
            if s.load(Ordering::Relaxed) {
                tokio::time::sleep(TARGET * 2).await;
            }
            next.run(req).await
        }
    });
    let router = shedding_app(&backend, QUEUE).await.layer(queue);
    let app = fleetlimit::shed::StampAccepted::new(router);
    let call = |path: &'static str| {
        let app = app.clone();
        async move { app.oneshot(get_req(path)).await.unwrap() }
    };
    // Within an interval of the first request: served (see the test above).
    let start = Instant::now();
    while start.elapsed() < INTERVAL / 2 {
        let res = call("/normal").await;
        if start.elapsed() < INTERVAL {
            assert_eq!(res.status(), 200, "not an interval yet");
        }
    }
    let res = poll_until_shed(|| call("/normal")).await;
    assert!(body_text(res).await.contains(r#""signal":"queue_delay""#));
    assert_eq!(call("/critical").await.status(), 200);
    // The queue is gone: the first request through ends it.
    slow.store(false, Ordering::Relaxed);
    assert_eq!(call("/normal").await.status(), 200);
    assert_eq!(call("/sheddable").await.status(), 200);
}

#[cfg(feature = "redis")]
/// A slow Redis is not a queue. The queueing delay is the wait in front of
/// the layer; fleetlimit's own Redis call comes after it. With Redis frozen
/// and a breaker that never opens (its window outlasts the test), every
/// check waits the whole deadline, 4 × the target, the worst a slow Redis
/// can do; `on_redis_error = "open"` serves the route meanwhile, and the
/// shedder must not turn that into 503s over 3 intervals of traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_never_sheds_a_normal_route() {
    use tower::ServiceExt;

    let server = RedisServer::start();
    let prefix = support::prefix("shed-slow-redis");
    let deadline = Duration::from_millis(20);
    let interval = Duration::from_millis(500);
    let cfg = support::redis_config(
        &server,
        &prefix,
        &format!("{}ms", deadline.as_millis()),
        &format!(
            "[breaker]\nwindow = \"60s\"\n\
             [limits.everyone]\nkey = \"global\"\ncapacity = 1000000\nrefill = \"1000000/s\"\n\
             [[routes]]\npath = \"/normal\"\nlimits = [\"everyone\"]\non_redis_error = \"open\"\n\
             [shedding]\nqueue_delay_target = \"5ms\"\nqueue_delay_interval = \"{}ms\"\n",
            interval.as_millis()
        ),
    );
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    let router = Router::new()
        .route("/normal", get(|| async { "ok" }))
        .layer(layer.clone());
    let app = fleetlimit::shed::StampAccepted::new(router);
    assert_eq!(
        app.clone()
            .oneshot(get_req("/normal"))
            .await
            .unwrap()
            .status(),
        200
    );

    server.freeze();
    let end = Instant::now() + interval * 3;
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let (mut served, mut waited) = (0u32, 0u32);
                while Instant::now() < end {
                    let t = Instant::now();
                    let res = app.clone().oneshot(get_req("/normal")).await.unwrap();
                    assert_eq!(res.status(), 200, "a slow Redis shed a normal route");
                    served += 1;
                    if t.elapsed() >= deadline {
                        waited += 1;
                    }
                }
                (served, waited)
            })
        })
        .collect();
    let (mut served, mut waited) = (0, 0);
    for c in clients {
        let (s, w) = c.await.unwrap();
        served += s;
        waited += w;
    }
    server.thaw();
    // The premise: Redis was in the way of (nearly) every request, and the
    // breaker stayed closed throughout.
    assert!(served >= 20, "{served} served");
    assert!(
        waited * 10 >= served * 9,
        "{waited} of {served} waited on Redis"
    );
    assert_eq!(layer.breaker().unwrap().opened, 0);
}

/// Requests held by `on_exceed = "delay"` are parked on purpose, not load on
/// the handlers: a login attack filling the held places sheds nobody. On
/// tokio's paused clock, so the 2 s hold cannot end before the checks.
#[tokio::test(start_paused = true)]
async fn requests_held_by_delay_are_not_in_flight_pressure() {
    let cfg = Config::from_toml_str(
        "[escalation]\nmax_delayed = 20\n\
         [limits.login]\nkey = \"global\"\ncapacity = 1\nrefill = \"1/h\"\n\
         on_exceed = \"delay\"\ndelay = \"2s\"\n\
         [[routes]]\npath = \"/login\"\nlimits = [\"login\"]\npriority = \"critical\"\n\
         [[routes]]\npath = \"/normal\"\nlimits = []\n\
         [shedding]\nmax_in_flight = 4\n",
    )
    .unwrap();
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "signed in" }))
        .route("/normal", get(|| async { "ok" }))
        .layer(layer.clone());
    // The one sign-in within the limit; the next ones are held.
    assert_eq!(send(&app, get_req("/login")).await.status(), 200);
    let start = tokio::time::Instant::now();
    let held: Vec<_> = (0..10)
        .map(|_| tokio::spawn(send_owned(app.clone(), "/login")))
        .collect();
    // 10 in flight, 2.5 × max_in_flight (critical is shed from 1.5), all
    // of them held.
    wait_for(|| layer.in_flight() == Some(10)).await;
    let res = send(&app, get_req("/normal")).await;
    assert_eq!(res.status(), 200, "{}", body_text(res).await);
    assert!(held.iter().all(|h| !h.is_finished()), "still held");
    drop(res);
    for h in held {
        let res = h.await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(start.elapsed() >= Duration::from_secs(2), "held the delay");
    }
    assert_eq!(layer.in_flight(), Some(0), "responses over: none in flight");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_signal_task_reads_each_refresh_and_ends_with_the_layer() {
    let server = RedisServer::start();
    let prefix = support::prefix("shed-task");
    let app = fleet_app(&server, &prefix, Arc::new(AtomicU64::new(0))).await;
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    let span = REFRESH * 10;
    tokio::time::sleep(span).await;
    let reads = server.calls_of("get");
    // One GET a refresh: 10 over the span, give or take the busy machine's
    // late ticks (missed ticks are delayed, never bunched up).
    assert!((5..=11).contains(&reads), "{reads} reads in {span:?}");
    drop(app);
    // The task notices at its next tick.
    tokio::time::sleep(REFRESH * 2).await;
    let after_drop = server.calls_of("get");
    tokio::time::sleep(REFRESH * 5).await;
    assert_eq!(
        server.calls_of("get"),
        after_drop,
        "the task ended with the layer"
    );
}
