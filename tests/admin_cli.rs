//! The `fleetlimit` command against real Redis: check-config, inspect,
//! reset, and a sweep that repairs exactly the keys without an expiry.

mod support;

use std::path::PathBuf;
use std::process::Command;

use fred::prelude::*;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_fleetlimit");

fn config_file(name: &str, url: &str, prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetlimit-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            r#"[redis]
url = "{url}"
key_prefix = "{prefix}"

[limits.per-key]
key = "header:x-api-key"
capacity = 10
refill = "1/min"

[limits.daily]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 1000
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

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn line_value(out: &str, label: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} in {out}"))
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// 1,000 limiter-shaped keys with expiries, 3 of them without.
async fn seed(client: &impl KeysInterface, prefix: &str) -> Vec<String> {
    let mut bare = Vec::new();
    for i in 0..1000 {
        let key = format!("{prefix}:per-key:{{h:caller-{i}}}");
        if i % 333 == 7 {
            let _: () = client
                .set(&key, "1700000000000000", None, None, false)
                .await
                .unwrap();
            bare.push(key);
        } else {
            let ex = Expiration::PX(600_000 + i);
            let _: () = client
                .set(&key, "1700000000000000", Some(ex), None, false)
                .await
                .unwrap();
        }
    }
    bare
}

#[tokio::test]
async fn sweep_repairs_the_3_keys_without_expiry_and_leaves_997_alone() {
    let server = RedisServer::start();
    let prefix = prefix("sweep");
    let cfg = config_file("sweep.toml", &server.url(), &prefix);
    let client = server.client().await;
    let bare = seed(&client, &prefix).await;
    assert_eq!(bare.len(), 3);
    let expiretime = |k: &str| server.cli(&["EXPIRETIME", k]).unwrap().trim().to_owned();
    let before: Vec<(String, String)> = (0..1000)
        .map(|i| format!("{prefix}:per-key:{{h:caller-{i}}}"))
        .filter(|k| !bare.contains(k))
        .map(|k| {
            let t = expiretime(&k);
            (k, t)
        })
        .collect();

    let (code, out, err) = run(&["sweep", "--config", cfg.to_str().unwrap(), "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(line_value(&out, "without expiry before:"), 3, "{out}");
    assert_eq!(
        line_value(&out, "without expiry after:"),
        3,
        "a dry run changes nothing: {out}"
    );
    assert_eq!(server.cli(&["PTTL", &bare[0]]).unwrap().trim(), "-1");

    let (code, out, err) = run(&["sweep", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(line_value(&out, "scanned:"), 1000, "{out}");
    assert_eq!(line_value(&out, "without expiry before:"), 3, "{out}");
    assert_eq!(line_value(&out, "repaired:"), 3, "{out}");
    assert_eq!(line_value(&out, "without expiry after:"), 0, "{out}");
    for k in &bare {
        let pttl: i64 = server.cli(&["PTTL", k]).unwrap().trim().parse().unwrap();
        // The limit's own TTL: 10 tokens at 1/min, full in 600 s, plus 1 s.
        assert!((595_000..=601_000).contains(&pttl), "{k}: {pttl}");
    }
    for (k, t) in &before {
        assert_eq!(&expiretime(k), t, "{k}'s expiry was changed");
    }
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn sweep_scans_every_cluster_primary() {
    let cluster = RedisCluster::start();
    let prefix = prefix("sweep-cluster");
    let cfg = config_file("sweep-cluster.toml", &cluster.url(), &prefix);
    let client = Builder::from_config(Config::from_url(&cluster.url()).unwrap())
        .build()
        .unwrap();
    client.init().await.unwrap();
    let bare = seed(&client, &prefix).await;
    // The 3 bare keys are spread over the primaries.
    let (code, out, err) = run(&["sweep", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(line_value(&out, "scanned:"), 1000, "{out}");
    assert_eq!(
        line_value(&out, "without expiry before:"),
        bare.len() as u64,
        "{out}"
    );
    assert_eq!(line_value(&out, "without expiry after:"), 0, "{out}");
    cluster.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn check_config_inspect_and_reset() {
    let server = RedisServer::start();
    let prefix = prefix("inspect");
    let cfg = config_file("inspect.toml", &server.url(), &prefix);
    let cfg = cfg.to_str().unwrap();

    let (code, out, _) = run(&["check-config", cfg]);
    assert_eq!(code, 0);
    assert!(
        out.contains("ok") && out.contains("route * /: limits [per-key, daily]"),
        "{out}"
    );
    let bad = cfg.replace("inspect.toml", "bad.toml");
    std::fs::write(
        &bad,
        "[limits.x]\nkey = \"ip\"\ncapacity = 0\nrefill = \"1/s\"\n",
    )
    .unwrap();
    let (code, _, err) = run(&["check-config", &bad]);
    assert_eq!(code, 2);
    assert!(
        err.contains("bad.toml:3:12: limit \"x\": capacity must be at least 1"),
        "{err}"
    );
    // A duration too large to hold is a clear error, not a wrapped number.
    let (code, _, err) = run(&[
        "sweep",
        "--config",
        cfg,
        "--default-ttl",
        "999999999999999999d",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--default-ttl: cannot read"), "{err}");

    let client = server.client().await;
    let key = format!("{prefix}:per-key:{{h:alice}}");
    // 4.5 of 10 tokens at 1/min: the bucket is full 330 s from now.
    let t = server.cli(&["TIME"]).unwrap();
    let mut it = t.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let now_us = it.next().unwrap() * 1_000_000 + it.next().unwrap();
    let tat = (now_us + 330_000_000).to_string();
    let _: () = client
        .set(&key, tat.as_str(), Some(Expiration::PX(9000)), None, false)
        .await
        .unwrap();
    let (code, out, err) = run(&["inspect", "alice", "--config", cfg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&key) && out.contains("of 10 tokens"), "{out}");
    let shown: f64 = out
        .split(" of 10 tokens")
        .next()
        .and_then(|s| s.split_whitespace().last())
        .unwrap()
        .parse()
        .unwrap();
    assert!((4.4..4.7).contains(&shown), "{out}");
    assert!(out.contains("expires in"), "{out}");
    assert!(
        out.contains("daily") && out.contains("no key: a full bucket"),
        "{out}"
    );

    let (code, out, _) = run(&["reset", "alice", "--limit", "per-key", "--config", cfg]);
    assert_eq!(code, 0);
    assert!(out.contains("1 key(s) deleted"), "{out}");
    assert_eq!(server.cli(&["EXISTS", &key]).unwrap().trim(), "0");

    let (code, _, err) = run(&[
        "inspect",
        "alice",
        "--config",
        cfg,
        "--redis",
        "redis://127.0.0.1:1",
    ]);
    assert_eq!(code, 1, "an unreachable Redis fails cleanly: {err}");
    let (code, _, err) = run(&["frobnicate"]);
    assert_eq!(code, 2);
    assert!(err.contains("usage"), "{err}");
}

/// A Redis URL fleetlimit cannot use is a usage error (exit 2) with where
/// it came from, whether in the file, `--redis` or `REDIS_URL`; a password
/// in it is not echoed.
#[test]
fn bad_redis_urls_are_usage_errors() {
    let bad = config_file("notaurl.toml", "notaurl://x", "p");
    let bad = bad.to_str().unwrap();
    let (code, out, err) = run(&["check-config", bad]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("notaurl.toml:2:7: unsupported Redis URL scheme \"notaurl://\" in \"notaurl://x\"; accepted: redis://, rediss://"),
        "{err}"
    );

    let good = config_file("good-url.toml", "redis://127.0.0.1:1", "p");
    let good = good.to_str().unwrap();
    let (code, out, err) = run(&[
        "inspect",
        "alice",
        "--config",
        good,
        "--redis",
        "notaurl://u:s3cret@x",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("--redis: unsupported Redis URL scheme \"notaurl://\""),
        "{err}"
    );
    assert!(err.contains("notaurl://u:***@x"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");

    let out = Command::new(BIN)
        .args(["sweep", "--config", good, "--dry-run"])
        .env("REDIS_URL", "redis-cluster://127.0.0.1:notaport")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("REDIS_URL: cannot read the Redis URL"),
        "{err}"
    );
}
