//! A give-back reaches only the window its charge went into. A check Redis
//! ran in time whose answer came after its caller stopped waiting is
//! settled: what it charged is given back. On a window algorithm that
//! give-back carries the end of the charged window as a second "not after"
//! bound, so one that reaches Redis after the window rolled over changes
//! nothing (the units went with their window) instead of taking them off
//! the next window, which never had them: an under-count.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::time::{Duration, Instant};

use axum::Router;
use fleetlimit::RateLimitLayer;
use support::relay::Relay;
use support::*;

/// The short windows (of [`SHORT_MS`]) roll over within a test; the long
/// ones never do.
const BODY: &str = r#"
[limits.fw-short]
key = "account:x-account"
algorithm = "fixed-window"
limit = 100
window = "3s"

[limits.fw-long]
key = "account:x-account"
algorithm = "fixed-window"
limit = 100
window = "1h"

[limits.sw-short]
key = "account:x-account"
algorithm = "sliding-window"
limit = 100
window = "3s"

[limits.sw-long]
key = "account:x-account"
algorithm = "sliding-window"
limit = 100
window = "1h"

[[routes]]
path = "/fw-short"
limits = ["fw-short"]
on_redis_error = "open"

[[routes]]
path = "/fw-long"
limits = ["fw-long"]
on_redis_error = "open"

[[routes]]
path = "/sw-short"
limits = ["sw-short"]
on_redis_error = "open"

[[routes]]
path = "/sw-long"
limits = ["sw-long"]
on_redis_error = "open"
"#;

/// The short windows' length (`window` in [`BODY`]): three times A's
/// deadline. A's held checks are answered by its policy one deadline into
/// the window they charged, and the window after it leaves B's charges,
/// the release and the give-backs about two deadlines to be judged in.
const SHORT_MS: u64 = 3_000;

/// The deadline of the instance whose answers are held.
const A_DEADLINE: &str = "1s";

const ROUTES: [&str; 4] = ["fw-short", "fw-long", "sw-short", "sw-long"];

/// How long the test waits for something Redis is sure to do soon (a key
/// expiring, a give-back landing), at most.
const PATIENCE: Duration = Duration::from_secs(15);

fn key(prefix: &str, limit: &str, account: &str) -> String {
    format!("{prefix}:{limit}:{{a:{account}}}")
}

/// A fixed window's count, or a sliding window's "<index> <current>
/// <previous>" as numbers ([0] when the key is gone).
fn stored(server: &RedisServer, key: &str) -> Vec<u64> {
    let raw = server.cli(&["GET", key]).unwrap_or_default();
    let raw = raw.trim();
    if raw.is_empty() {
        return vec![0];
    }
    raw.split(' ').map(|n| n.parse().unwrap()).collect()
}

/// Redis's clock, in ms.
fn redis_ms(server: &RedisServer) -> u64 {
    let time = server.cli(&["TIME"]).unwrap();
    let t: Vec<u64> = time.lines().map(|l| l.trim().parse().unwrap()).collect();
    t[0] * 1000 + t[1] / 1000
}

async fn get(app: &Router, route: &str, account: &str) -> http::Response<axum::body::Body> {
    let req = request(
        "GET",
        &format!("/{route}"),
        "127.0.0.1:4000",
        &[("x-account", account)],
    );
    send(app, req).await
}

/// Polls `done` until it holds, at most [`PATIENCE`].
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < PATIENCE,
            "{what}: not within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answers_give_back_reaches_only_its_own_window() {
    let server = RedisServer::start();
    let relay = Relay::start(server.port);
    let prefix = prefix("refund-windows");
    // A behind the relay gives up on its checks; B reaches Redis directly.
    // A's deadline leaves Redis time to run each check in time however busy
    // the machine (a check that reached it later would change nothing, and
    // there would be nothing to give back).
    let a = ok_routes(
        RateLimitLayer::new(config_at(&relay.url(), &prefix, A_DEADLINE, BODY))
            .await
            .unwrap(),
        ROUTES.map(|r| format!("/{r}")),
    );
    let b = ok_routes(
        RateLimitLayer::new(config_at(&server.url(), &prefix, "2s", BODY))
            .await
            .unwrap(),
        ROUTES.map(|r| format!("/{r}")),
    );
    for r in ROUTES {
        let res = get(&a, r, "warm").await;
        assert!(
            header(&res, "x-ratelimit-remaining").is_some(),
            "{r}: warm-up"
        );
    }

    // A's checks at the start of a sliding window (of Redis's clock), so
    // that the fixed window they open ends near the next sliding boundary:
    // then B's charges below have most of both new windows to be judged in.
    until("a sliding window's start", || {
        redis_ms(&server) % SHORT_MS < SHORT_MS / 6
    })
    .await;
    // Redis runs A's checks; their answers wait in the relay, so A answers
    // each by its policy.
    relay.hold_answers();
    let held = ROUTES.map(|r| {
        let a = a.clone();
        tokio::spawn(async move { (r, get(&a, r, "acct").await) })
    });
    for h in held {
        let (r, res) = h.await.unwrap();
        assert_eq!(res.status(), 200, "{r}");
        assert!(
            header(&res, "x-ratelimit-remaining").is_none(),
            "{r}: answered by Redis"
        );
    }
    let k = |r: &str| key(&prefix, r, "acct");
    until("A's checks charged", || {
        stored(&server, &k("fw-short")) == [1]
            && stored(&server, &k("fw-long")) == [1]
            && stored(&server, &k("sw-short")).get(1) == Some(&1)
            && stored(&server, &k("sw-long")).get(1) == Some(&1)
    })
    .await;
    let sw_charged_in = stored(&server, &k("sw-short"))[0];

    // The short windows roll over; B charges 3 in each new one (and 3 more
    // in the long ones).
    until("the short windows over", || {
        stored(&server, &k("fw-short")) == [0] && redis_ms(&server) / SHORT_MS > sw_charged_in
    })
    .await;
    for r in ROUTES {
        for _ in 0..3 {
            let res = get(&b, r, "acct").await;
            assert!(header(&res, "x-ratelimit-remaining").is_some(), "{r}: B");
        }
    }
    assert_eq!(stored(&server, &k("fw-short")), [3]);
    assert_eq!(stored(&server, &k("fw-long")), [4]);
    assert_eq!(stored(&server, &k("sw-short"))[1..], [3, 1]);
    assert_eq!(stored(&server, &k("sw-long"))[1..], [4, 0]);
    // What follows is judged while B's short windows last.
    let pttl: u64 = server
        .cli(&["PTTL", &k("fw-short")])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let sw_ends = (stored(&server, &k("sw-short"))[0] + 1) * SHORT_MS;
    let judged_until = (redis_ms(&server) + pttl).min(sw_ends) - 50;

    // The answers come; A settles them. Its calls answer again (the warm
    // key), so its give-backs are sent.
    relay.release();
    let start = Instant::now();
    for r in ROUTES {
        // Redis's answer, once A's breaker (if the hold opened it) lets a
        // call through again.
        while header(&get(&a, r, "warm").await, "x-ratelimit-remaining").is_none() {
            assert!(start.elapsed() < PATIENCE, "{r}: A's calls answer again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Into a window still open, the unit is given back...
    until("the long windows' give-backs", || {
        stored(&server, &k("fw-long")) == [4 - 1] && stored(&server, &k("sw-long"))[1..] == [3, 0]
    })
    .await;
    // ...and never into the window after (the short give-backs were sent
    // beside the long ones, and end at their first `LATE`): watched for
    // 500 ms, or until B's windows end.
    assert!(
        redis_ms(&server) < judged_until,
        "the give-backs came after B's windows ended: nothing left to judge"
    );
    let watch = Instant::now() + Duration::from_millis(500);
    while Instant::now() < watch && redis_ms(&server) < judged_until {
        assert_eq!(stored(&server, &k("fw-short")), [3], "fixed window");
        assert_eq!(
            stored(&server, &k("sw-short"))[1..],
            [3, 1],
            "sliding window"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
