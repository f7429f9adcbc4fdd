//! `fleetlimit top` against a real Redis holding a known state: buckets
//! charged through the layer, a heartbeat of the layer's and two by hand
//! (one live, one long dead), and a decision record.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fleetlimit::Config;
use fleetlimit::admin::Admin;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_fleetlimit");

fn config_file(name: &str, url: &str, prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetlimit-top-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            r#"[redis]
url = "{url}"
key_prefix = "{prefix}"

[fleet]
discover = true
heartbeat = "1s"

[limits.per-key]
key = "header:x-api-key"
capacity = 10
refill = "1/min"
record = true

[limits.daily]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 100
window = "1h"

[[routes]]
path = "/"
limits = ["per-key", "daily"]
"#
        ),
    )
    .unwrap();
    path
}

/// How `top` shows the caller whose API key is `value` for `limit`: the
/// first 12 hex digits of the key's digest.
fn shown_id(cfg: &Config, limit: &str, value: &str) -> String {
    let key = Admin::redis_key(cfg, limit, value).unwrap();
    let inner = key.split_once('{').unwrap().1;
    // "h#" and 12 hex digits.
    inner[..14].to_owned()
}

/// Polls `f` until it holds, for 10 s at most.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn top_shows_instances_exhausted_keys_and_refusals() {
    let server = RedisServer::start();
    let path = config_file("top.toml", &server.url(), "top");
    let cfg = Config::from_toml_file(&path).unwrap();
    let app = ok_app(cfg.clone()).await;

    // alice: 10 admitted, 2 refused (the second from the refused-key
    // cache, recorded too); bob: 3 admitted.
    let mut statuses = Vec::new();
    for (who, n) in [("alice", 12), ("bob", 3)] {
        for _ in 0..n {
            let req = request("GET", "/", "10.0.0.1:1000", &[("x-api-key", who)]);
            statuses.push(send(&app, req).await.status().as_u16());
        }
    }
    let mut want = vec![200; 10];
    want.extend([429, 429, 200, 200, 200]);
    assert_eq!(statuses, want);
    let cli = |args: &[&str]| server.cli(args).unwrap_or_default().trim().to_owned();
    eventually("15 decisions recorded", || {
        cli(&["XLEN", "top:record:{per-key}"]) == "15"
    })
    .await;
    let hb = "top:fleet:{instances}";
    eventually("the layer's heartbeat", || cli(&["ZCARD", hb]) == "1").await;
    let now_s: i64 = cli(&["TIME"]).lines().next().unwrap().parse().unwrap();
    let (now_ms, hour_ago) = (now_s * 1000, now_s * 1000 - 3_600_000);
    cli(&["ZADD", hb, &now_ms.to_string(), "other-host"]);
    cli(&["ZADD", hb, &hour_ago.to_string(), "gone-host"]);

    // Off the runtime's thread: the layer keeps heartbeating meanwhile.
    let config = path.to_str().unwrap().to_owned();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        run_cli(
            &["top", "--once", "--config", &config, "--window", "1h"],
            &[],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    let at = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in\n{out}"))
    };
    assert!(
        lines[0].starts_with("fleetlimit top: prefix \"top\", "),
        "{out}"
    );
    let fleet = at("instances: ");
    assert_eq!(
        lines[fleet],
        "instances: 2 live (top:fleet:{instances}, dead after 3 s silent)"
    );
    assert!(
        lines[fleet + 1..fleet + 3]
            .iter()
            .any(|l| l.starts_with("  other-host  last beat ")),
        "{out}"
    );
    assert!(!out.contains("gone-host"), "{out}");

    let (alice, bob) = (
        shown_id(&cfg, "per-key", "alice"),
        shown_id(&cfg, "per-key", "bob"),
    );
    let per_key = at("limit per-key (");
    assert!(
        lines[per_key].ends_with(": 2 keys in view, 1 exhausted"),
        "{out}"
    );
    assert_eq!(lines[per_key + 1], format!("  {alice}  0/10  EXHAUSTED"));
    assert_eq!(lines[per_key + 2], format!("  {bob}  7/10"));
    // Refused requests took nothing from the daily window (all or none).
    let daily = at("limit daily (");
    assert!(
        lines[daily].ends_with(": 2 keys in view, 0 exhausted"),
        "{out}"
    );
    let (alice, bob) = (
        shown_id(&cfg, "daily", "alice"),
        shown_id(&cfg, "daily", "bob"),
    );
    assert_eq!(lines[daily + 1], format!("  {alice}  90/100"));
    assert_eq!(lines[daily + 2], format!("  {bob}  97/100"));

    let refusals = at("refusals recorded in the last 3600 s:");
    assert!(
        lines[refusals + 1].starts_with("  per-key  2 refused of 15 decisions, "),
        "{out}"
    );
    // 4 buckets, the decision stream and the heartbeat: one SCAN page.
    assert_eq!(
        *lines.last().unwrap(),
        "scan: 6 keys this refresh, pass over the keyspace complete"
    );
}

/// Refreshed: frames follow each other, the screen not cleared on a pipe.
#[test]
fn top_refreshes_until_stopped() {
    let server = RedisServer::start();
    let path = config_file("refresh.toml", &server.url(), "topr");
    let mut child = Command::new(BIN)
        .args([
            "top",
            "--config",
            path.to_str().unwrap(),
            "--interval",
            "100ms",
        ])
        .env_remove("REDIS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut frames = 0;
    let mut line = String::new();
    while frames < 3 {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "top stopped");
        assert!(!line.contains('\x1b'), "{line:?}");
        if line.starts_with("fleetlimit top: prefix \"topr\"") {
            frames += 1;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn top_exits_2_on_bad_usage_and_1_without_redis() {
    let server = RedisServer::start();
    let path = config_file("exits.toml", &server.url(), "tope");
    let config = path.to_str().unwrap();
    for args in [
        &["top", "--once"][..],
        &["top", "--once", "--config", "/nonexistent/fleetlimit.toml"],
        &["top", "--once", "--config", config, "--interval", "0s"],
        &["top", "--once", "--config", config, "--sample", "0"],
        &["top", "--once", "--config", config, "--sample", "10001"],
        &["top", "--once", "--config", config, "--redis", "http://x"],
    ] {
        let (code, out, err) = run_cli(args, &[]);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(!err.is_empty(), "{args:?}");
    }
    server.kill();
    let (code, _, err) = run_cli(&["top", "--once", "--config", config], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.starts_with("fleetlimit: "), "{err}");
}

/// A limit with plans: a caller's plan is not known to `top`, so a key is
/// shown under the base numbers with the most a plan would leave it, and is
/// not called exhausted while a plan would still admit it.
#[tokio::test]
async fn top_never_calls_a_caller_on_a_plan_exhausted() {
    let server = RedisServer::start();
    let path = config_file("plans.toml", &server.url(), "topp");
    let toml = std::fs::read_to_string(&path).unwrap()
        + "\n[plans.pro.per-key]\ncapacity = 1000\n\n[plan_assignments]\n\"carol\" = \"pro\"\n";
    std::fs::write(&path, toml).unwrap();
    let cfg = Config::from_toml_file(&path).unwrap();
    let app = ok_app(cfg.clone()).await;
    // carol, on pro: 20 admitted (980 left of 1000; 0 under the base 10).
    for _ in 0..20 {
        let req = request("GET", "/", "10.0.0.1:1000", &[("x-api-key", "carol")]);
        assert_eq!(send(&app, req).await.status(), 200);
    }
    let config = path.to_str().unwrap().to_owned();
    let (code, out, err) =
        tokio::task::spawn_blocking(move || run_cli(&["top", "--once", "--config", &config], &[]))
            .await
            .unwrap();
    assert_eq!(code, 0, "{out}{err}");
    let carol = shown_id(&cfg, "per-key", "carol");
    let line = out
        .lines()
        .skip_while(|l| !l.starts_with("limit per-key"))
        .find(|l| l.trim_start().starts_with(&carol))
        .unwrap_or_else(|| panic!("no line for carol ({carol}):\n{out}"));
    assert!(!line.contains("EXHAUSTED"), "{out}");
    assert!(
        line.contains("0/10") && line.contains("(up to 98"),
        "{line}"
    );
    assert!(out.contains("1 keys in view, 0 exhausted"), "{out}");
}
