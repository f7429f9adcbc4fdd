//! Write-back after `local`: what an instance admitted from its share while
//! Redis was cut off or frozen is charged to Redis once it answers again,
//! once (a second recovery charges nothing more); a key is never put in
//! debt; a limit a reload removed meanwhile is forgotten, never a panic.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::time::{Duration, Instant};

use axum::Router;
use fleetlimit::{Config, RateLimitLayer};
use support::relay::Relay;
use support::*;

const CAPACITY: u64 = 100;

/// One instance (its share is the whole limit), a token bucket of 100
/// refilling one a day on `/w` (`local`), and `/other` (another limit).
fn body(with_w: bool) -> String {
    let w = if with_w {
        format!(
            "[limits.w]\nkey = \"account:x-account\"\ncapacity = {CAPACITY}\nrefill = \"1/d\"\n\n\
             [[routes]]\npath = \"/w\"\nlimits = [\"w\"]\non_redis_error = \"local\"\n\n"
        )
    } else {
        String::new()
    };
    format!(
        "[fleet]\nsize = 1\n\n{w}[limits.other]\nkey = \"account:x-account\"\ncapacity = 10\nrefill = \"1/s\"\n\n\
         [[routes]]\npath = \"/other\"\nlimits = [\"other\"]\non_redis_error = \"local\"\n"
    )
}

fn config(url: &str, prefix: &str, with_w: bool) -> Config {
    config_at(url, prefix, "20ms", &body(with_w))
}

fn app(layer: RateLimitLayer) -> Router {
    support::ok_routes(layer, ["/w", "/other"])
}

/// `n` requests of `account` on `/w`: how many Redis admitted (with
/// `X-RateLimit-Remaining`) and how many the local buckets admitted.
async fn spend(app: &Router, account: &str, n: usize) -> (usize, usize) {
    let (mut redis, mut local) = (0, 0);
    for _ in 0..n {
        let res = send(
            app,
            request("GET", "/w", "127.0.0.1:4000", &[("x-account", account)]),
        )
        .await;
        assert_eq!(res.status(), 200);
        if header(&res, "x-ratelimit-remaining").is_some() {
            redis += 1;
        } else {
            assert!(
                header(&res, "x-ratelimit-limit").is_some(),
                "local answers name the limit"
            );
            local += 1;
        }
    }
    (redis, local)
}

/// Units Redis holds charged on `account`'s `/w` bucket (one a day refill:
/// TAT − now, in days, rounded up).
fn used(server: &RedisServer, prefix: &str, account: &str) -> u64 {
    let key = format!("{prefix}:w:{{a:{account}}}");
    let Some(tat) = server.tat(&key) else {
        return 0;
    };
    let t: Vec<f64> = (server.cli(&["TIME"]).unwrap().lines())
        .map(|l| l.trim().parse().unwrap())
        .collect();
    ((tat - (t[0] * 1e6 + t[1])) / 86_400e6).ceil() as u64
}

/// How long a write-back may take after Redis answers again: the breaker's
/// cool-off (500 ms), the write-back's spread (1 s) and its first rounds,
/// with room for a busy machine.
const WRITTEN_BACK_WITHIN: Duration = Duration::from_secs(6);

async fn wait_used(server: &RedisServer, prefix: &str, account: &str, want: u64, app: &Router) {
    let until = Instant::now() + WRITTEN_BACK_WITHIN;
    loop {
        // Traffic on another route lets the breaker see Redis again.
        let _ = send(
            app,
            request("GET", "/other", "127.0.0.1:4000", &[("x-account", "probe")]),
        )
        .await;
        let now = used(server, prefix, account);
        if now == want {
            return;
        }
        assert!(
            Instant::now() < until,
            "Redis holds {now} units of {account}, not {want}, {WRITTEN_BACK_WITHIN:?} after it came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The case: 20 spent through Redis (80 left), 30 admitted locally
/// during the fault, then Redis holds 50 spent once it answers again, and
/// a second fault and recovery charge nothing more.
async fn thirty_written_back_once(
    what: &str,
    server: &RedisServer,
    url: &str,
    fault: impl Fn(),
    heal: impl Fn(),
) {
    let prefix = prefix(what);
    let app = app(RateLimitLayer::new(config(url, &prefix, true))
        .await
        .unwrap());
    let account = "bob";
    assert_eq!(spend(&app, account, 20).await, (20, 0));
    assert_eq!(used(server, &prefix, account), 20);
    fault();
    let (redis, local) = spend(&app, account, 30).await;
    heal();
    assert_eq!(
        (redis, local),
        (0, 30),
        "{what}: all thirty answered locally"
    );
    wait_used(server, &prefix, account, 50, &app).await;
    // A second fault and recovery, nothing admitted locally meanwhile.
    fault();
    tokio::time::sleep(Duration::from_millis(300)).await;
    heal();
    tokio::time::sleep(WRITTEN_BACK_WITHIN / 2).await;
    assert_eq!(used(server, &prefix, account), 50, "{what}: charged once");
    // And the key goes on from there.
    wait_until_redis_decides(&app).await;
    assert_eq!(spend(&app, account, 1).await, (1, 0));
    assert_eq!(used(server, &prefix, account), 51);
    server.assert_every_key_expires(&prefix);
}

/// Until a request on `/other` is decided by Redis again.
async fn wait_until_redis_decides(app: &Router) {
    let until = Instant::now() + WRITTEN_BACK_WITHIN;
    loop {
        let res = send(
            app,
            request("GET", "/other", "127.0.0.1:4000", &[("x-account", "probe")]),
        )
        .await;
        if header(&res, "x-ratelimit-remaining").is_some() {
            return;
        }
        assert!(Instant::now() < until, "Redis never decided again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_during_a_cut_are_charged_once_after_the_heal() {
    let server = RedisServer::start();
    let relay = Relay::start(server.port);
    thirty_written_back_once(
        "wb-cut",
        &server,
        &relay.url(),
        || relay.cut(),
        || relay.heal(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_during_a_freeze_are_charged_once_after_the_thaw() {
    let server = RedisServer::start();
    let url = server.url();
    thirty_written_back_once(
        "wb-frozen",
        &server,
        &url,
        || server.freeze(),
        || server.thaw(),
    )
    .await;
}

/// 90 spent, 30 admitted locally: the write-back charges the 10 the
/// bucket holds, not 30 (a key is never put in debt), and the key is
/// refused until it refills, like any empty bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_never_puts_a_key_in_debt() {
    let server = RedisServer::start();
    let relay = Relay::start(server.port);
    let prefix = prefix("wb-debt");
    let app = app(RateLimitLayer::new(config(&relay.url(), &prefix, true))
        .await
        .unwrap());
    assert_eq!(spend(&app, "carol", 90).await, (90, 0));
    relay.cut();
    assert_eq!(spend(&app, "carol", 30).await, (0, 30));
    relay.heal();
    wait_used(&server, &prefix, "carol", CAPACITY, &app).await;
    let res = send(
        &app,
        request("GET", "/w", "127.0.0.1:4000", &[("x-account", "carol")]),
    )
    .await;
    assert_eq!(res.status(), 429);
    // The next token in at most a day: not 20 more days of debt.
    assert!(header_u64(&res, "retry-after") <= 86_400);
}

/// A reload that removes the limit while its units wait to be written
/// back: they are forgotten (the limit is gone), nothing panics, and the
/// other limits' write-backs go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_removing_the_limit_forgets_its_write_back() {
    let server = RedisServer::start();
    let relay = Relay::start(server.port);
    let prefix = prefix("wb-reload");
    let layer = RateLimitLayer::new(config(&relay.url(), &prefix, true))
        .await
        .unwrap();
    let reload = layer.reload_handle();
    let app = app(layer);
    assert_eq!(spend(&app, "dave", 5).await, (5, 0));
    relay.cut();
    assert_eq!(spend(&app, "dave", 7).await, (0, 7));
    // `other` admitted locally too: 3 of its 10.
    for _ in 0..3 {
        let res = send(
            &app,
            request("GET", "/other", "127.0.0.1:4000", &[("x-account", "dave")]),
        )
        .await;
        assert_eq!(res.status(), 200);
    }
    reload.reload(config(&relay.url(), &prefix, false)).unwrap();
    relay.heal();
    let other_key = format!("{prefix}:other:{{a:dave}}");
    let until = Instant::now() + WRITTEN_BACK_WITHIN;
    loop {
        // Refill 1/s: 3 charged show as a TAT about 3 s ahead.
        let raw = server.cli(&["GET", &other_key]).unwrap();
        if !raw.trim().is_empty() {
            break;
        }
        assert!(Instant::now() < until, "other's write-back never came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        used(&server, &prefix, "dave"),
        5,
        "the removed limit's 7 are forgotten"
    );
}
