//! The chaos harness: several layer instances ("servers") under steady
//! traffic while a fault is injected, and the checks every scenario shares.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{get, post};
use fleetlimit::{Config, RateLimitLayer};

use super::stats::Parts;
use super::{header, request, send};

/// Per-check deadline in the chaos scenarios.
pub const DEADLINE_MS: u64 = 20;
/// A request slower than this counts as hung.
pub const HUNG: Duration = Duration::from_millis(1_000);

/// The `[breaker]` numbers of `LIMITS`.
const BREAKER_FAILURES: u64 = 3;
const BREAKER_COOL_OFF_MS: u64 = 300;

/// Routes: `/` open, `/sign-in` closed, `/search` local (capacity 12 over a
/// fleet of 3: 4 per instance when Redis is gone), `/exact` for the
/// exactness check after recovery.
pub const LIMITS: &str = r#"
[fleet]
size = 3

[breaker]
failures = 3
cool_off = "300ms"

[limits.open]
key = "header:x-api-key"
capacity = 1000000
refill = "1000/s"

[limits.closed]
key = "account:x-account"
capacity = 1000000
refill = "1000/s"

[limits.search]
key = "header:x-api-key"
capacity = 12
refill = "1/d"

[limits.exact]
key = "header:x-api-key"
capacity = 10
refill = "1/d"

[[routes]]
path = "/"
limits = ["open"]
on_redis_error = "open"

[[routes]]
path = "/sign-in"
limits = ["closed"]
on_redis_error = "closed"

[[routes]]
path = "/search"
limits = ["search"]
on_redis_error = "local"

[[routes]]
path = "/exact"
limits = ["exact"]
on_redis_error = "closed"
"#;

#[derive(Clone, Debug)]
pub struct Sample {
    pub instance: usize,
    pub route: &'static str,
    pub started: Instant,
    pub took: Duration,
    /// `None`: hung past [`HUNG`].
    pub status: Option<u16>,
    pub retry_after: Option<u64>,
    /// Carried rate-limit headers (decided by a store, Redis or local).
    pub limited: bool,
}

pub struct Fleet {
    pub layers: Vec<RateLimitLayer>,
    pub apps: Vec<Router>,
}

impl Fleet {
    pub async fn start(config: impl Fn() -> Config, n: usize) -> Self {
        let mut layers = Vec::new();
        let mut apps = Vec::new();
        for _ in 0..n {
            let layer = RateLimitLayer::new(config()).await.unwrap();
            apps.push(
                Router::new()
                    .route("/", get(|| async { "home" }))
                    .route("/sign-in", post(|| async { "welcome" }))
                    .route("/search", get(|| async { "results" }))
                    .route("/exact", get(|| async { "exact" }))
                    .layer(layer.clone()),
            );
            layers.push(layer);
        }
        Self { layers, apps }
    }
}

/// Traffic through every instance until stopped: each loop sends `/`,
/// `/sign-in` and `/search` in turn and records every answer.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    pub fn start(fleet: &Fleet, tag: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (instance, app) in fleet.apps.iter().enumerate() {
            let (app, stop, samples) = (app.clone(), Arc::clone(&stop), Arc::clone(&samples));
            let key = format!("{tag}-key");
            let account = format!("{tag}-{instance}");
            tasks.push(tokio::spawn(async move {
                // Bounded: stops when told, or after 60 s whatever happens.
                let give_up = Instant::now() + Duration::from_secs(60);
                while !stop.load(Ordering::Relaxed) && Instant::now() < give_up {
                    for (route, method, headers) in [
                        ("/", "GET", vec![("x-api-key", key.as_str())]),
                        ("/sign-in", "POST", vec![("x-account", account.as_str())]),
                        ("/search", "GET", vec![("x-api-key", key.as_str())]),
                    ] {
                        let started = Instant::now();
                        let req = request(method, route, "127.0.0.1:7000", &headers);
                        let res = tokio::time::timeout(HUNG, send(&app, req)).await;
                        let sample = match res {
                            Ok(res) => Sample {
                                instance,
                                route,
                                started,
                                took: started.elapsed(),
                                status: Some(res.status().as_u16()),
                                retry_after: header(&res, "retry-after")
                                    .and_then(|v| v.parse().ok()),
                                limited: header(&res, "x-ratelimit-limit").is_some(),
                            },
                            Err(_) => Sample {
                                instance,
                                route,
                                started,
                                took: started.elapsed(),
                                status: None,
                                retry_after: None,
                                limited: false,
                            },
                        };
                        samples.lock().unwrap().push(sample);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }));
        }
        Self {
            stop,
            samples,
            tasks,
        }
    }

    pub async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.samples.lock().unwrap().clone()
    }
}

/// Waits (bounded) until every instance decides by Redis again with its
/// breaker closed; returns when that was.
pub async fn wait_recovered(fleet: &Fleet, tag: &str, within: Duration) -> Instant {
    let give_up = Instant::now() + within;
    loop {
        let mut all = true;
        for (i, app) in fleet.apps.iter().enumerate() {
            let res = send(
                app,
                request(
                    "GET",
                    "/",
                    "127.0.0.1:7001",
                    &[("x-api-key", &format!("{tag}-probe"))],
                ),
            )
            .await;
            let closed = fleet.layers[i]
                .breaker()
                .is_some_and(|b| b.state == "closed");
            all &= header(&res, "x-ratelimit-limit").is_some() && closed;
        }
        if all {
            return Instant::now();
        }
        assert!(
            Instant::now() < give_up,
            "{tag}: Redis decisions never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What every scenario asserts of the traffic it saw.
/// `outage`: Redis was unreachable long enough for the breakers to open and
/// the local route to refuse (false for a blink such as a quick restart).
pub fn assert_scenario(
    tag: &str,
    samples: &[Sample],
    fault: Instant,
    recovered: Instant,
    fleet: &Fleet,
    outage: bool,
) {
    assert!(
        samples.len() > 100,
        "{tag}: too little traffic ({})",
        samples.len()
    );
    let mut counts = std::collections::BTreeMap::new();
    for s in samples {
        *counts.entry((s.route, s.status)).or_insert(0) += 1;
    }
    let slowest = samples.iter().map(|s| s.took).max().unwrap_or_default();
    let breakers: Vec<_> = fleet.layers.iter().map(|l| l.breaker().unwrap()).collect();
    println!(
        "{tag}: outage {:?}, {} requests {counts:?}, slowest {slowest:?}, breakers {breakers:?}",
        recovered - fault,
        samples.len()
    );
    for s in samples {
        let status = s.status.unwrap_or_else(|| {
            panic!(
                "{tag}: {} on instance {} hung for {:?}",
                s.route, s.instance, s.took
            )
        });
        assert_ne!(status, 500, "{tag}: a 500 on {}", s.route);
        // Bounded by the deadline (plus scheduling on a busy 2-core
        // machine), not by a TCP timeout.
        assert!(
            s.took < Duration::from_millis(DEADLINE_MS + 250),
            "{tag}: {} took {:?}, past the deadline of {DEADLINE_MS} ms",
            s.route,
            s.took
        );
        match s.route {
            "/" => assert_eq!(status, 200, "{tag}: the open route answered {status}"),
            "/sign-in" => {
                assert!(
                    status == 200 || status == 503,
                    "{tag}: /sign-in answered {status}"
                );
                if status == 503 {
                    assert!(
                        s.retry_after.unwrap_or(0) >= 1,
                        "{tag}: a 503 without Retry-After"
                    );
                    assert!(
                        s.started + s.took >= fault && s.started <= recovered,
                        "{tag}: a 503 outside the outage ({:?} after the fault, {:?} after recovery)",
                        s.started.saturating_duration_since(fault),
                        s.started.saturating_duration_since(recovered),
                    );
                }
            }
            "/search" => {
                assert!(
                    status == 200 || status == 429,
                    "{tag}: /search answered {status}"
                );
                if status == 429 {
                    assert!(
                        s.retry_after.unwrap_or(0) >= 1,
                        "{tag}: a 429 without Retry-After"
                    );
                }
            }
            _ => unreachable!(),
        }
    }
    // The local route kept limiting: decided (headers) and refusing, on
    // each instance, during the outage.
    // (A blink such as a quick restart may leave no local decision to see.)
    let checked = if outage { fleet.apps.len() } else { 0 };
    for i in 0..checked {
        let during: Vec<&Sample> = samples
            .iter()
            .filter(|s| {
                s.instance == i
                    && s.route == "/search"
                    && s.started >= fault
                    && s.started < recovered
            })
            .collect();
        assert!(
            during.iter().all(|s| s.limited),
            "{tag}: instance {i} answered /search without deciding"
        );
        assert!(
            during.iter().any(|s| s.status == Some(429)),
            "{tag}: instance {i} stopped limiting /search during the outage"
        );
    }
    let opened: u64 = fleet
        .layers
        .iter()
        .map(|l| l.breaker().unwrap().opened)
        .sum();
    assert!(opened >= 1 || !outage, "{tag}: no breaker opened");
    if outage {
        // Counted, not timed: once the breaker opened, most degraded
        // decisions never waited on Redis (short-circuited in microseconds)
        // — only the failures that opened it and the probes did.
        //
        // Or, where few checks were degraded at all (on a Cluster only the
        // dead primary's keys are, so the ratio depends on which slots the
        // test's keys hash to): no more failures than the breaker's rule
        // lets through — `BREAKER_FAILURES` to open it, then one probe per
        // cool-off while the outage lasts, for each time it opened.
        let cool_offs = (recovered - fault).as_millis() as u64 / BREAKER_COOL_OFF_MS + 1;
        for (i, b) in breakers.iter().enumerate() {
            let rule = b.opened * BREAKER_FAILURES + cool_offs;
            assert!(
                b.short_circuited >= 5 * b.failures || b.failures <= rule,
                "{tag}: instance {i} waited on Redis for {} of {} degraded checks \
                 (more than the {rule} failures the breaker's rule allows)",
                b.failures,
                b.failures + b.short_circuited
            );
        }
    }
    for (i, l) in fleet.layers.iter().enumerate() {
        let b = l.breaker().unwrap();
        assert_eq!(
            b.state, "closed",
            "{tag}: instance {i}'s breaker is still {:?}",
            b.state
        );
        assert!(
            b.opened == 0 || b.closed >= 1,
            "{tag}: instance {i} opened and never closed: {b:?}"
        );
    }
}

/// After recovery decisions are exact again: a fresh key admits exactly its
/// capacity across the instances.
pub async fn assert_exact(fleet: &Fleet, tag: &str) {
    let mut admitted = 0;
    for i in 0..30 {
        let app = &fleet.apps[i % fleet.apps.len()];
        let res = send(
            app,
            request(
                "GET",
                "/exact",
                "127.0.0.1:7002",
                &[("x-api-key", &format!("{tag}-fresh"))],
            ),
        )
        .await;
        let s = res.status().as_u16();
        assert!(
            s == 200 || s == 429,
            "{tag}: /exact answered {s} after recovery"
        );
        admitted += usize::from(s == 200);
    }
    assert_eq!(
        admitted, 10,
        "{tag}: a fresh key admits exactly its capacity after recovery"
    );
}

/// A typical fault's shape: traffic, fault for `hold`, restore, recovery.
pub async fn run<F, R>(
    fleet: &Fleet,
    tag: &str,
    hold: Duration,
    inject: F,
    restore: R,
) -> (Vec<Sample>, Instant, Instant)
where
    F: FnOnce(),
    R: FnOnce(),
{
    let traffic = Traffic::start(fleet, tag);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fault = Instant::now();
    inject();
    tokio::time::sleep(hold).await;
    restore();
    let recovered = wait_recovered(fleet, tag, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    (traffic.stop().await, fault, recovered)
}
