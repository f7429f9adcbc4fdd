//! An outage or an abusive client does not flood the logs: degraded
//! decisions are logged at most once a second per route (WARN), refusals
//! at DEBUG with one INFO line a second per limit; each line that is
//! written counts the ones held back since the previous (`suppressed=N`).
// Its Redis tests need the `redis` feature; their helpers are unused without it.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports))]

use crate::support;

use std::time::{Duration, Instant};

use fleetlimit::Config;
use support::*;

fn capture(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    crate::support::init_tracing();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(level)
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

/// The `suppressed=N` of a line.
fn suppressed(line: &str) -> u64 {
    line.split("suppressed=")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no suppressed=N in {line}"))
}

const OPEN_ROUTE: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 100
refill = "1/d"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "open"
"#;

#[cfg(feature = "redis")]
#[tokio::test(flavor = "current_thread")]
async fn fifty_requests_during_an_outage_log_a_couple_of_warnings() {
    let (captured, _guard) = capture(tracing::Level::WARN);
    // Nothing listens on this loopback port: Redis is down from the start.
    let url = format!("redis://127.0.0.1:{}", free_port());
    let cfg = config_at(&url, &prefix("logs-outage"), "20ms", OPEN_ROUTE);
    let app = ok_app(cfg).await;
    let _ = captured.take(); // the start-up warning

    let started = Instant::now();
    for i in 0..50 {
        let key = format!("k{i}");
        let res = send(
            &app,
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", &key)]),
        )
        .await;
        assert_eq!(res.status(), 200);
    }
    let burst = started.elapsed();
    // A second later the next degraded decision is logged again, with the
    // count of the ones held back meanwhile.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let res = send(
        &app,
        request("GET", "/", "127.0.0.1:1", &[("x-api-key", "last")]),
    )
    .await;
    assert_eq!(res.status(), 200);

    let logs = captured.take();
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("served without limiting"))
        .collect();
    // One line per started second of the burst, plus the last request's.
    let most = burst.as_secs() as usize + 2;
    assert!(
        (2..=most).contains(&lines.len()),
        "{} lines for 51 degraded decisions over {burst:?}: {logs}",
        lines.len()
    );
    // Every decision is accounted for: logged, or counted by a later line.
    let accounted: u64 = lines.iter().map(|l| 1 + suppressed(l)).sum();
    assert_eq!(accounted, 51, "{logs}");
    // The first line carries the evidence.
    for field in [
        "WARN",
        "limit=per-key",
        "key=h#",
        "reason=",
        "degraded=true",
        "policy=\"open\"",
        "suppressed=0",
    ] {
        assert!(lines[0].contains(field), "{field} in {}", lines[0]);
    }
    assert!(lines.last().unwrap().contains("suppressed="));
}

const TIGHT: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 1
refill = "1/d"

[[routes]]
path = "/"
limits = ["per-key"]
"#;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_burst_of_refusals_gives_one_info_line_a_second() {
    let (captured, _guard) = capture(tracing::Level::DEBUG);
    let cfg = Config::from_toml_str(TIGHT).unwrap();
    let app = ok_app(cfg).await;
    let req = || request("GET", "/", "127.0.0.1:1", &[("x-api-key", "abuser")]);
    assert_eq!(send(&app, req()).await.status(), 200);
    for _ in 0..100 {
        assert_eq!(send(&app, req()).await.status(), 429);
    }
    let logs = captured.take();
    let refused = |level: &str| -> Vec<String> {
        logs.lines()
            .filter(|l| l.contains(level) && l.contains("refused"))
            .map(str::to_owned)
            .collect()
    };
    let info = refused(" INFO ");
    assert_eq!(info.len(), 1, "{logs}");
    for field in [
        "limit=per-key",
        "key=h#",
        "remaining=0",
        "reason=\"limit-exceeded\"",
        "degraded=false",
        "suppressed=0",
    ] {
        assert!(info[0].contains(field), "{field} in {}", info[0]);
    }
    // Each refusal still has its line, at DEBUG.
    assert_eq!(refused("DEBUG").len(), 99, "{logs}");

    // A second later: the summary of what was held back.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(send(&app, req()).await.status(), 429);
    let logs = captured.take();
    let info: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains(" INFO ") && l.contains("refused"))
        .collect();
    assert_eq!(info.len(), 1, "{logs}");
    assert_eq!(suppressed(info[0]), 99, "{logs}");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "current_thread")]
async fn refusals_decided_by_redis_are_summarised_too() {
    let (captured, _guard) = capture(tracing::Level::INFO);
    let server = RedisServer::start();
    let prefix = prefix("logs-refusals");
    let app = ok_app(redis_config(&server, &prefix, "500ms", TIGHT)).await;
    let req = |k: &str| request("GET", "/", "127.0.0.1:1", &[("x-api-key", k)]);

    let started = Instant::now();
    let mut refusals = 0;
    // Keys Redis refuses, and the same keys again from the refused-key cache.
    for i in 0..20 {
        let key = format!("k{i}");
        assert_eq!(send(&app, req(&key)).await.status(), 200);
        for _ in 0..3 {
            assert_eq!(send(&app, req(&key)).await.status(), 429);
            refusals += 1;
        }
    }
    let took = started.elapsed();
    let logs = captured.take();
    let info: Vec<&str> = logs.lines().filter(|l| l.contains("refused")).collect();
    assert!(
        !info.is_empty() && info.len() <= took.as_secs() as usize + 1,
        "{} INFO lines for {refusals} refusals over {took:?}: {logs}",
        info.len()
    );
    let counted: u64 = info.iter().map(|l| 1 + suppressed(l)).sum();
    assert!(counted <= refusals, "{logs}");
    server.assert_every_key_expires(&prefix);
}

const TWO_KEYS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 1
refill = "1/d"

[limits.by-ip]
key = "ip"
capacity = 1000
refill = "1/s"

[[routes]]
path = "/"
limits = ["per-key", "by-ip"]
"#;

/// Requests answered before the store — a missing key header (401), or no
/// client address on a server without `ConnectInfo` (503) — are logged
/// like refusals: one line a second per limit, with the count held back.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn requests_answered_before_the_store_are_summarised_too() {
    let (captured, _guard) = capture(tracing::Level::INFO);
    let app = ok_app(Config::from_toml_str(TWO_KEYS).unwrap()).await;
    for _ in 0..50 {
        let res = send(&app, request("GET", "/", "127.0.0.1:1", &[])).await;
        assert_eq!(res.status(), 401);
        // No ConnectInfo at all: the server's setup, not the client's.
        let bare = http::Request::get("/")
            .header("x-api-key", "k")
            .body(axum::body::Body::empty())
            .unwrap();
        assert_eq!(send(&app, bare).await.status(), 503);
    }
    let logs = captured.take();
    let count = |what: &str| logs.lines().filter(|l| l.contains(what)).count();
    assert_eq!(count("reason=\"missing-key\""), 1, "{logs}");
    assert_eq!(count("reason=\"no-client-ip\""), 1, "{logs}");
    assert_eq!(count(" ERROR "), 1, "{logs}");

    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        send(&app, request("GET", "/", "127.0.0.1:1", &[]))
            .await
            .status(),
        401
    );
    let logs = captured.take();
    let line = logs
        .lines()
        .find(|l| l.contains("reason=\"missing-key\""))
        .unwrap_or_else(|| panic!("{logs}"));
    assert_eq!(suppressed(line), 49, "{logs}");
}
