//! `fleetlimit reset` reaches every instance: each layer instance remembers
//! keys Redis refused (until their Retry-After) and holds hot keys' token
//! leases, so deleting the Redis keys alone would leave the fleet answering
//! from memory. A reset is announced on the prefix's pub/sub channel and
//! every instance forgets those keys within a second.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use axum::Router;
use fleetlimit::admin::Admin;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_fleetlimit");

/// The requirement: a reset reaches every instance within this.
const REACH: Duration = Duration::from_secs(1);

/// Three tokens a minute: a refused caller waits up to a minute, far longer
/// than `REACH`, so only the reset can explain an admission.
const LIMITS: &str = r#"
[limits.per-account]
key = "account:x-account"
capacity = 3
refill = "1/min"

[[routes]]
path = "/"
limits = ["per-account"]
on_redis_error = "closed"
"#;

fn config_file(name: &str, url: &str, prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetlimit-reset-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "[redis]\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\ndeadline = \"500ms\"\n{LIMITS}"
        ),
    )
    .unwrap();
    path
}

fn cli_reset(file: &Path, account: &str) {
    let out = Command::new(BIN)
        .args(["reset", account, "--config", file.to_str().unwrap()])
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1 key(s) deleted"), "{stdout}");
}

fn from(account: &str) -> http::Request<axum::body::Body> {
    request("GET", "/", "127.0.0.1:1", &[("x-account", account)])
}

/// Three layer instances (three fred pools) on `url`.
async fn three(url: &str, prefix: &str) -> Vec<Router> {
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(ok_app(config_at(url, prefix, "500ms", LIMITS)).await);
    }
    apps
}

/// Spends `account`'s three tokens on the first instance, then has Redis
/// refuse it once on each instance (each remembers the refusal).
async fn refuse_everywhere(apps: &[Router], account: &str) {
    for _ in 0..3 {
        assert_eq!(send(&apps[0], from(account)).await.status(), 200);
    }
    for app in apps {
        let res = send(app, from(account)).await;
        assert_eq!(res.status(), 429);
        let retry = header_u64(&res, "retry-after");
        assert!(retry > 10 * REACH.as_secs(), "Retry-After {retry}");
    }
}

/// Polls every instance until each has admitted `account` once, until
/// `deadline`; returns which instances still refused then.
async fn still_refusing(apps: &[Router], account: &str, deadline: Instant) -> Vec<usize> {
    let mut waiting: Vec<usize> = (0..apps.len()).collect();
    // Bounded by the deadline: at most REACH / 10 ms rounds.
    while !waiting.is_empty() && Instant::now() < deadline {
        let mut next = Vec::new();
        for &i in &waiting {
            let status = send(&apps[i], from(account)).await.status().as_u16();
            assert!(status == 200 || status == 429, "instance {i}: {status}");
            if status != 200 {
                next.push(i);
            }
        }
        waiting = next;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    waiting
}

/// Three instances on `url` refuse alice from their refused-key caches
/// (`script_calls` counts Redis's script calls since `reset_stats`); the
/// CLI's reset reaches all three within `REACH`, and each admission is then
/// Redis's (one script call each).
async fn a_reset_reaches_three_instances(
    url: &str,
    prefix: &str,
    reset_stats: impl Fn(),
    script_calls: impl Fn() -> u64,
) {
    let file = config_file(&format!("{prefix}.toml"), url, prefix);
    let apps = three(url, prefix).await;
    refuse_everywhere(&apps, "alice").await;
    reset_stats();
    for app in &apps {
        assert_eq!(send(app, from("alice")).await.status(), 429);
    }
    assert_eq!(script_calls(), 0, "the refused caches answered");

    cli_reset(&file, "alice");
    let reset_at = Instant::now();
    let left = still_refusing(&apps, "alice", reset_at + REACH).await;
    assert!(
        left.is_empty(),
        "instances {left:?} still refuse alice {REACH:?} after the reset"
    );
    println!(
        "all three admitted {:?} after the reset",
        reset_at.elapsed()
    );
    // Each admission was Redis's: a full bucket again, one token each.
    assert_eq!(script_calls(), 3);
}

#[tokio::test]
async fn a_reset_reaches_the_refused_caches_of_three_instances() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("reset-reach");
    a_reset_reaches_three_instances(
        &server.url(),
        &prefix,
        || {
            server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
        },
        || server.script_calls(),
    )
    .await;
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn a_reset_reaches_every_instance_on_a_cluster() {
    init_tracing();
    let cluster = RedisCluster::start();
    let prefix = prefix("reset-reach-cluster");
    a_reset_reaches_three_instances(
        &cluster.url(),
        &prefix,
        || {
            for n in &cluster.nodes {
                n.cli(&["CONFIG", "RESETSTAT"]).unwrap();
            }
        },
        || cluster.nodes.iter().map(|n| n.script_calls()).sum::<u64>(),
    )
    .await;
    cluster.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn a_reset_reaches_every_instance_on_sentinel() {
    init_tracing();
    let setup = SentinelSetup::start();
    let prefix = prefix("reset-reach-sentinel");
    a_reset_reaches_three_instances(
        &setup.url(),
        &prefix,
        || {
            setup.primary.cli(&["CONFIG", "RESETSTAT"]).unwrap();
        },
        || setup.primary.script_calls(),
    )
    .await;
}

#[tokio::test]
async fn the_listener_survives_a_redis_restart() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("reset-restart");
    let file = config_file("restart.toml", &server.url(), &prefix);
    let apps = three(&server.url(), &prefix).await;
    refuse_everywhere(&apps, "alice").await;

    // Restarted empty: alice's bucket is gone with it. Whatever was
    // announced while the instances were disconnected is lost, so each
    // forgets its remembered refusals once it listens again.
    server.restart();
    // The pools reconnect (fred's policy: at most 1 s apart) and answer a
    // fresh caller; the bound is a guard, not a measure.
    for (i, app) in apps.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while send(app, from(&format!("probe-{i}"))).await.status() != 200 {
            assert!(Instant::now() < deadline, "instance {i} never reconnected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let channel = format!("{prefix}:reset");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let numsub = server.cli(&["PUBSUB", "NUMSUB", &channel]).unwrap();
        if numsub.lines().nth(1).map(str::trim) == Some("3") {
            break;
        }
        assert!(Instant::now() < deadline, "never resubscribed: {numsub}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let listening = Instant::now();
    let left = still_refusing(&apps, "alice", listening + REACH).await;
    assert!(
        left.is_empty(),
        "instances {left:?} still refuse alice after Redis restarted empty"
    );

    // And the subscription works again: refuse, reset, admitted.
    refuse_everywhere(&apps, "bob").await;
    cli_reset(&file, "bob");
    let reset_at = Instant::now();
    let left = still_refusing(&apps, "bob", reset_at + REACH).await;
    assert!(left.is_empty(), "instances {left:?} still refuse bob");
}

const HOT: &str = r#"
[limits.hot]
key = "account:x-account"
capacity = 1000
refill = "1/d"
lease_batch = 200
lease_above = 5

[[routes]]
path = "/"
limits = ["hot"]
on_redis_error = "closed"
"#;

#[tokio::test]
async fn a_reset_drops_a_hot_keys_lease() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("reset-lease");
    let cfg = redis_config(&server, &prefix, "500ms", HOT);
    let app = ok_app(cfg.clone()).await;
    // Connected beforehand: the reset below costs two commands.
    let admin = Admin::connect(&cfg).await.unwrap();

    // Five requests make the key hot; the sixth takes a lease of 200
    // (itself included), which lives for a second at most.
    for _ in 0..5 {
        assert_eq!(send(&app, from("carol")).await.status(), 200);
    }
    let leased_at = Instant::now();
    let res = send(&app, from("carol")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 1000 - 5 - 1);
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    assert_eq!(send(&app, from("carol")).await.status(), 200);
    assert_eq!(server.script_calls(), 0, "spent from the lease");

    assert_eq!(admin.reset("carol", None).await, Ok(1));
    // Before the lease would lapse by itself, the next request goes to
    // Redis and sees a full bucket. Polling slower than the lease could be
    // spent (199 tokens, at most 100 polls) so it cannot run dry instead.
    let deadline = leased_at + REACH;
    let mut remaining = None;
    while Instant::now() < deadline {
        let res = send(&app, from("carol")).await;
        assert_eq!(res.status(), 200);
        if server.script_calls() > 0 {
            remaining = Some(header_u64(&res, "x-ratelimit-remaining"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        remaining,
        Some(999),
        "the lease outlived the reset (the request went to Redis only after {:?})",
        leased_at.elapsed()
    );
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn a_malformed_reset_message_is_ignored_and_logged_at_debug() {
    let captured = Captured::default();
    let writer = captured.clone();
    crate::support::init_tracing();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = RedisServer::start();
    let prefix = prefix("reset-malformed");
    let cfg = redis_config(&server, &prefix, "500ms", LIMITS);
    let apps = vec![ok_app(cfg.clone()).await];
    refuse_everywhere(&apps, "alice").await;
    refuse_everywhere(&apps, "bob").await;
    let alice = format!("{prefix}:per-account:{{a:alice}}");
    assert_eq!(server.cli(&["EXISTS", &alice]).unwrap().trim(), "1");
    captured.take();

    // Each names alice's key, but not as a well-formed announcement.
    let channel = format!("{prefix}:reset");
    let huge = format!("{alice}\n{}", "x".repeat(70_000));
    let garbage = [
        format!("{alice} trailing"),
        format!("{alice}\n\n"),
        format!("{alice}\nother-prefix:per-account:{{a:alice}}"),
        huge,
        String::new(),
    ];
    for g in &garbage {
        server.cli(&["PUBLISH", &channel, g]).unwrap();
    }
    // A valid announcement after them: once bob is admitted, the garbage
    // before it has been read (one connection, in order).
    let admin = Admin::connect(&cfg).await.unwrap();
    assert_eq!(admin.reset("bob", None).await, Ok(1));
    let left = still_refusing(&apps, "bob", Instant::now() + REACH).await;
    assert!(left.is_empty(), "the listener stopped after garbage");

    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    assert_eq!(send(&apps[0], from("alice")).await.status(), 429);
    assert_eq!(server.script_calls(), 0, "alice is still remembered");
    let logs = captured.take();
    let ignored = logs
        .lines()
        .filter(|l| l.contains("DEBUG") && l.contains("ignored a malformed reset message"))
        .count();
    assert_eq!(ignored, garbage.len(), "{logs}");
}

#[tokio::test]
async fn the_listener_ends_with_the_layer() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = prefix("reset-drop");
    let channel = format!("{prefix}:reset");
    let numsub = || {
        let out = server.cli(&["PUBSUB", "NUMSUB", &channel]).unwrap();
        out.lines().nth(1).unwrap().trim().parse::<u32>().unwrap()
    };
    let app = ok_app(redis_config(&server, &prefix, "500ms", LIMITS)).await;
    assert_eq!(numsub(), 1, "subscribed once the layer is built");
    assert_eq!(send(&app, from("alice")).await.status(), 200);
    drop(app);
    // The listener quits at once; QUIT itself is bounded by 1 s.
    let deadline = Instant::now() + Duration::from_secs(2);
    while numsub() != 0 {
        assert!(Instant::now() < deadline, "still subscribed after the drop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_layer_built_while_redis_is_down_listens_once_it_is_up() {
    init_tracing();
    let server = RedisServer::start();
    server.kill();
    let prefix = prefix("reset-late");
    let body = format!("connect_timeout = \"200ms\"\n{LIMITS}");
    let app = ok_app(redis_config(&server, &prefix, "500ms", &body)).await;
    server.restart();
    let channel = format!("{prefix}:reset");
    // fred's reconnect policy retries at most 1 s apart; the bound is a guard.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = server.cli(&["PUBSUB", "NUMSUB", &channel]).unwrap();
        if out.lines().nth(1).map(str::trim) == Some("1") {
            break;
        }
        assert!(Instant::now() < deadline, "never subscribed: {out}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And it works: refused, reset, admitted.
    let deadline = Instant::now() + Duration::from_secs(10);
    while send(&app, from("probe")).await.status() != 200 {
        assert!(Instant::now() < deadline, "the pool never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let apps = vec![app];
    refuse_everywhere(&apps, "alice").await;
    let file = config_file("late.toml", &server.url(), &prefix);
    cli_reset(&file, "alice");
    let left = still_refusing(&apps, "alice", Instant::now() + REACH).await;
    assert!(left.is_empty(), "still refused after the reset");
}
