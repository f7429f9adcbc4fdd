//! Chaos on a standalone Redis: three layer instances under traffic while
//! the server is killed, frozen, restarted, paused, or kept busy by a slow
//! script. Each scenario asserts the shared invariants (see
//! `support/chaos.rs`): no 500 and no hung request; `/` (open) always 200;
//! `/sign-in` (closed) 503 with Retry-After only during the outage; `/search`
//! (local) kept limiting; the breaker opened and closed; exact decisions
//! after recovery; every key under the prefix has an expiry.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::chaos::{self, Fleet};
use support::*;

async fn fleet(server: &RedisServer, prefix: &str) -> Fleet {
    Fleet::start(
        || {
            redis_config(
                server,
                prefix,
                &format!("{}ms", chaos::DEADLINE_MS),
                chaos::LIMITS,
            )
        },
        3,
    )
    .await
}

type Run = (Vec<chaos::Sample>, std::time::Instant, std::time::Instant);

async fn finish(server: &RedisServer, fleet: &Fleet, prefix: &str, tag: &str, run: Run) {
    finish_with(server, fleet, prefix, tag, run, true).await;
}

async fn finish_with(
    server: &RedisServer,
    fleet: &Fleet,
    prefix: &str,
    tag: &str,
    run: Run,
    outage: bool,
) {
    let (samples, fault, recovered) = run;
    chaos::assert_scenario(tag, &samples, fault, recovered, fleet, outage);
    chaos::assert_exact(fleet, tag).await;
    server.assert_every_key_expires(prefix);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_then_start_again() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("chaos-kill");
    let fleet = fleet(&server, &prefix).await;
    let run = chaos::run(
        &fleet,
        "kill",
        Duration::from_millis(1_500),
        || server.kill(),
        || server.restart(),
    )
    .await;
    finish(&server, &fleet, &prefix, "kill", run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_empty_script_cache() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("chaos-restart");
    let fleet = fleet(&server, &prefix).await;
    // A quick restart: down for a moment, back empty (no script cached).
    let run = chaos::run(
        &fleet,
        "restart",
        Duration::from_millis(200),
        || server.restart(),
        || {},
    )
    .await;
    // NOSCRIPT is recovered by EVAL: no request fails because of it.
    finish_with(&server, &fleet, &prefix, "restart", run, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_then_sigcont() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("chaos-stop");
    let fleet = fleet(&server, &prefix).await;
    let run = chaos::run(
        &fleet,
        "stop",
        Duration::from_millis(1_500),
        || server.freeze(),
        || server.thaw(),
    )
    .await;
    finish(&server, &fleet, &prefix, "stop", run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("chaos-pause");
    let fleet = fleet(&server, &prefix).await;
    let run = chaos::run(
        &fleet,
        "pause",
        Duration::from_millis(1_500),
        || {
            assert_eq!(
                server
                    .cli(&["CLIENT", "PAUSE", "1500", "ALL"])
                    .unwrap()
                    .trim(),
                "OK"
            );
        },
        || {},
    )
    .await;
    finish(&server, &fleet, &prefix, "pause", run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_script_holds_redis_busy() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("chaos-busy");
    let fleet = fleet(&server, &prefix).await;
    let mut busy = None;
    let run = chaos::run(
        &fleet,
        "busy",
        Duration::from_millis(1_500),
        || {
            // A script spinning for 1.5 s on Redis's clock: Redis runs
            // nothing else meanwhile (below its busy-reply threshold, so
            // clients are not even told BUSY: they just wait).
            const SPIN: &str = "local t0 = redis.call('TIME') \
                while true do local t = redis.call('TIME') \
                if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 1500000 then break end end return 1";
            busy = Some(
                Command::new(support::cli_bin())
                    .args(["-p", &server.port.to_string(), "EVAL", SPIN, "0"])
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        },
        || {},
    )
    .await;
    let status = busy.unwrap().wait().unwrap();
    assert!(status.success());
    finish(&server, &fleet, &prefix, "busy", run).await;
}
