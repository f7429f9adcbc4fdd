//! `[redis] batch_window`: a coalesced check waits up to the window for
//! company, so checks that arrive apart share a call; decisions stay
//! exact, a lone check waits the window and no more, and Redis frozen or
//! gone costs what it costs without a window (the deadline, then the
//! breaker), the window's wait aside.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::future::Future;
use std::time::{Duration, Instant};

use support::*;

/// Capacity 5 a day per API key; `on_redis_error` open (a store failure
/// serves, without headers).
const LIMITS: &str = r#"
[limits.k]
key = "header:x-api-key"
capacity = 5
refill = "5/d"

[[routes]]
path = "/"
limits = ["k"]
on_redis_error = "open"
"#;

const WINDOW: Duration = Duration::from_millis(10);

async fn app(
    server: &RedisServer,
    prefix: &str,
    deadline: &str,
    window: Option<&str>,
) -> axum::Router {
    let window = window.map_or(String::new(), |w| format!("batch_window = \"{w}\"\n"));
    let body = format!("refused_cache_keys = 0\n{window}{LIMITS}");
    ok_app(redis_config(server, prefix, deadline, &body)).await
}

/// One request of API key `key`.
async fn get(app: &axum::Router, key: &str) -> http::Response<axum::body::Body> {
    send(
        app,
        request("GET", "/", "127.0.0.1:9", &[("x-api-key", key)]),
    )
    .await
}

/// `n` requests of API key `key`, request i sent i ms after the first (a
/// task each): their statuses in order.
async fn spaced(app: &axum::Router, key: &'static str, n: u64) -> Vec<u16> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i)).await;
                get(&app, key).await.status().as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

/// Eight checks of one key, a millisecond apart: without a window each
/// finds nothing in flight and goes alone; with a 10 ms window they share
/// calls. Either way exactly the capacity is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_apart_share_a_call_and_stay_exact() {
    let server = RedisServer::start();
    let prefix = prefix("window");
    let app = app(&server, &prefix, "2s", Some("10ms")).await;
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    let statuses = spaced(&app, "spaced", 8).await;
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(admitted, 5, "exactly the capacity: {statuses:?}");
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        3,
        "{statuses:?}"
    );
    let calls = server.script_calls();
    println!("batch window: {calls} script calls for 8 checks 1 ms apart");
    assert!(
        calls < 8,
        "checks within one window share a call: {calls} calls for 8 checks"
    );
    server.assert_every_key_expires(&prefix);
}

/// A check alone waits the window for company, then goes out: never
/// sooner than the window, and within the window plus the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_check_waits_the_window_and_no_more() {
    let server = RedisServer::start();
    let prefix = prefix("window-lone");
    let deadline = Duration::from_secs(2);
    let app = app(&server, &prefix, "2s", Some("10ms")).await;
    for round in 0..3 {
        let started = Instant::now();
        let res = get(&app, "lone").await;
        let took = started.elapsed();
        assert_eq!(res.status(), 200, "round {round}");
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 4 - round);
        assert!(took >= WINDOW, "round {round}: answered after {took:?}");
        assert!(took < WINDOW + deadline, "round {round}: {took:?}");
    }
}

/// Redis frozen: a check in a window is answered by the route's failure
/// policy (open: served) once the deadline passes, counted from when its
/// call went out; Redis gone: the same, then the breaker answers at once.
/// Other keys and the next window are not held up by the frozen call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_or_gone_costs_the_window_and_the_deadline() {
    let server = RedisServer::start();
    let prefix = prefix("window-frozen");
    let deadline = Duration::from_millis(200);
    let app = app(&server, &prefix, "200ms", Some("10ms")).await;
    let res = get(&app, "a").await;
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 4);

    server.freeze();
    let started = Instant::now();
    let statuses = spaced(&app, "b", 4).await;
    let took = started.elapsed();
    server.thaw();
    assert_eq!(statuses, [200; 4], "served on the open policy");
    // Four checks 0–3 ms apart: at most two windows, each answered a
    // deadline after its call went out (a call resent after LATE stays
    // within the same deadline), plus the spacing.
    let bound = 2 * (WINDOW + deadline) + Duration::from_millis(3) + Duration::from_secs(1);
    assert!(took < bound, "answered after {took:?}, bound {bound:?}");

    server.kill();
    let statuses = spaced(&app, "c", 20).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let started = Instant::now();
    let res = get(&app, "d").await;
    assert_eq!(res.status(), 200);
    assert!(started.elapsed() < WINDOW + deadline + Duration::from_secs(1));
}

/// A request given up on while its check waits in the window (the client
/// went away: its future dropped) is never sent: its key is not charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_given_up_in_the_window_charges_nothing() {
    let server = RedisServer::start();
    let prefix = prefix("window-gone");
    let app = app(&server, &prefix, "2s", Some("10ms")).await;
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    // Polled once (the store is asked on the first poll: its check is
    // queued), then dropped at once, long before the window ends.
    let mut request = Box::pin(get(&app, "gone"));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(
        request.as_mut().poll(&mut cx).is_pending(),
        "waits its window"
    );
    drop(request);
    // Past the window, and a call's round trip.
    tokio::time::sleep(WINDOW * 5).await;
    assert_eq!(server.script_calls(), 0, "the dropped check was not sent");
    assert!(server.keys_with_pttl(&prefix).is_empty(), "nothing charged");
    // The key is whole for the next request.
    let res = get(&app, "gone").await;
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 4);
}

/// A bad window fails at start-up, at its line and column.
#[test]
fn bad_windows_are_refused_with_their_place() {
    for (window, extra, says) in [
        ("0ms", "", "batch_window must be longer than zero"),
        ("11ms", "", "at most 10ms"),
        (
            "1ms",
            "coalesce = false\n",
            "batch_window needs coalesce = true",
        ),
    ] {
        let src = format!(
            "[redis]\nurl = \"redis://127.0.0.1:1\"\n{extra}batch_window = \"{window}\"\n{LIMITS}"
        );
        let line = 3 + extra.lines().count();
        let err = fleetlimit::Config::from_toml_str(&src).unwrap_err();
        assert!(err.message().contains(says), "{window}: {err}");
        // The value's place: `batch_window = ` is 15 characters.
        assert_eq!(
            (err.line(), err.column()),
            (Some(line), Some(16)),
            "{window}: {err}"
        );
    }
    let ok = "[redis]\nurl = \"redis://127.0.0.1:1\"\nbatch_window = \"0.5ms\"\n";
    fleetlimit::Config::from_toml_str(&format!("{ok}{LIMITS}")).unwrap();
}
