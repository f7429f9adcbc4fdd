//! Healthy Redis, busy host: a slow moment of this process is not a Redis
//! outage. With the default configuration (5 ms deadline, default breaker),
//! a `closed` route answers from Redis when the machine is busy with CPU
//! hogs, and when the instance itself is busy with 256 concurrent clients.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

mod support;

use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use fleetlimit::{Config, RateLimitLayer};
use support::stats::Parts;
use support::*;

/// A `closed` route whose limit no client reaches (an account gets at most
/// 100 requests): every answer is Redis's 200, unless the limiter could not
/// decide (503). The slow refill keeps each key for hours, so the expiry
/// check at the end finds them however long the run took (at 10^6/s they
/// expired within a second of the last request, before a slow scan).
const LIMITS: &str = r#"
[limits.closed]
key = "account:x-account"
capacity = 1000
refill = "1/h"

[[routes]]
path = "/sign-in"
limits = ["closed"]
on_redis_error = "closed"
"#;

/// The default `[redis]` settings (deadline, pool, coalescing, breaker).
fn config(server: &RedisServer, prefix: &str) -> Config {
    let src = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n\n{LIMITS}",
        server.url()
    );
    Config::from_toml_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

async fn app(server: &RedisServer, prefix: &str) -> (Router, RateLimitLayer) {
    let layer = RateLimitLayer::new(config(server, prefix)).await.unwrap();
    let app = Router::new()
        .route("/sign-in", post(|| async { "welcome" }))
        .layer(layer.clone());
    (app, layer)
}

/// One sign-in of `account`: its status.
async fn sign_in(app: &Router, account: &str) -> u16 {
    let req = request(
        "POST",
        "/sign-in",
        "127.0.0.1:5000",
        &[("x-account", account)],
    );
    send(app, req).await.status().as_u16()
}

/// The two tests load the machine: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Busy-loop shells, killed when dropped (also when the test panics).
struct CpuHogs(Vec<Child>);

impl CpuHogs {
    fn start(n: usize) -> Self {
        Self(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Default)]
struct Tally {
    total: AtomicU64,
    unavailable: AtomicU64,
    other: AtomicU64,
}

impl Tally {
    fn record(&self, status: u16) {
        self.total.fetch_add(1, Ordering::Relaxed);
        match status {
            200 => {}
            503 => {
                self.unavailable.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                self.other.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn counts(&self) -> (u64, u64, u64) {
        (
            self.total.load(Ordering::Relaxed),
            self.unavailable.load(Ordering::Relaxed),
            self.other.load(Ordering::Relaxed),
        )
    }
}

/// Two CPU hogs on the machine, Redis healthy, 16 concurrent clients for
/// 10 s, each sending a request every 100 ms (1,600 answers, as in the
/// report): at most 1 % of the answers are 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_hogs_do_not_make_a_healthy_redis_refuse() {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("busy-hogs");
    let (app, layer) = app(&server, &prefix).await;
    let _hogs = CpuHogs::start(2);
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + Duration::from_secs(10);
    let mut tasks = Vec::new();
    for client in 0..16u64 {
        let (app, tally) = (app.clone(), Arc::clone(&tally));
        tasks.push(tokio::spawn(async move {
            let account = format!("hog-client-{client}");
            // Independent clients: not all at the same instant.
            tokio::time::sleep(Duration::from_millis(6 * client)).await;
            let mut every = tokio::time::interval(Duration::from_millis(100));
            // Bounded by count and by time.
            for _ in 0..100 {
                every.tick().await;
                if Instant::now() >= until {
                    break;
                }
                tally.record(sign_in(&app, &account).await);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (total, unavailable, other) = tally.counts();
    println!(
        "cpu hogs: {total} answers, {unavailable} were 503, breaker {:?}",
        layer.breaker()
    );
    assert!(total >= 1_000, "too little traffic: {total}");
    assert_eq!(other, 0, "only 200 and 503 are possible here");
    assert!(
        unavailable * 100 <= total,
        "{unavailable} of {total} answers were 503 with Redis healthy (at most 1 %)"
    );
    server.assert_every_key_expires(&prefix);
}

/// One instance, 256 concurrent clients over 10,000 keys, Redis healthy,
/// started cold: at most 0.1 % of the answers are 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_clients_do_not_make_a_healthy_redis_refuse() {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("busy-256");
    let (app, layer) = app(&server, &prefix).await;
    const CLIENTS: u64 = 256;
    const EACH: u64 = 80;
    let tally = Arc::new(Tally::default());
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let (app, tally) = (app.clone(), Arc::clone(&tally));
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                // Spread over 10,000 accounts.
                let account = format!("acct-{}", (client * 7_919 + i * 131) % 10_000);
                tally.record(sign_in(&app, &account).await);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (total, unavailable, other) = tally.counts();
    println!(
        "256 clients: {total} answers, {unavailable} were 503, breaker {:?}",
        layer.breaker()
    );
    assert_eq!(total, CLIENTS * EACH);
    assert_eq!(other, 0, "only 200 and 503 are possible here");
    assert!(
        unavailable * 1_000 <= total,
        "{unavailable} of {total} answers were 503 with Redis healthy (at most 0.1 %)"
    );
}
