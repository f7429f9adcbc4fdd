//! The `fleetlimit` command against real Redis (standalone, Cluster and
//! Sentinel): check-config, inspect, reset, and a sweep that repairs exactly
//! fleetlimit's keys without an expiry and nothing else under the prefix.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

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
    run_cli(args, &[])
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
        // The limit's own TTL: 10 tokens at 1/min, full in 600 s, plus 2 s.
        assert!((595_000..=602_000).contains(&pttl), "{k}: {pttl}");
    }
    for (k, t) in &before {
        assert_eq!(&expiretime(k), t, "{k}'s expiry was changed");
    }
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn sweep_repairs_a_concurrency_limits_set_of_slots() {
    let server = RedisServer::start();
    let prefix = prefix("sweep-slots");
    let cfg = config_file("sweep-slots.toml", &server.url(), &prefix);
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        format!(
            "{text}\n[limits.in-flight]\nkey = \"header:x-api-key\"\nalgorithm = \"concurrency\"\n\
             max_in_flight = 5\nmax_hold = \"30s\"\n"
        ),
    )
    .unwrap();
    // A set of slots left without expiry, and a string where a set belongs.
    let slots = format!("{prefix}:in-flight:{{h:caller}}");
    let foreign = format!("{prefix}:in-flight:{{h:other}}");
    server.cli(&["ZADD", &slots, "1", "a:1"]).unwrap();
    server.cli(&["SET", &foreign, "x"]).unwrap();

    let (code, out, err) = run(&["sweep", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(line_value(&out, "repaired:"), 1, "{out}");
    let pttl: i64 = server
        .cli(&["PTTL", &slots])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The limit's own TTL: max_hold and 1 ms.
    assert!((25_000..=30_001).contains(&pttl), "{pttl}");
    assert!(
        out.contains("a string, where fleetlimit writes a zset"),
        "{out}"
    );
    assert_eq!(server.cli(&["PTTL", &foreign]).unwrap().trim(), "-1");
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
    assert!(
        err.contains("--default-ttl") && err.contains("too long"),
        "{err}"
    );

    let client = server.client().await;
    let key = header_key(&prefix, "per-key", "alice");
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
    assert!(
        err.contains("unrecognized subcommand 'frobnicate'"),
        "{err}"
    );
    assert!(err.contains("Usage: fleetlimit <COMMAND>"), "{err}");
}

/// The tokens `inspect` shows for the token bucket (`4.50 of 10 tokens`).
fn shown_tokens(out: &str) -> f64 {
    out.split(" of 10 tokens")
        .next()
        .and_then(|s| s.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token count in {out}"))
}

/// What a key is, to the byte: its type, serialized value and TTL.
fn fingerprint(server: &RedisServer, key: &str) -> (String, String, String) {
    let type_ = server.cli(&["TYPE", key]).unwrap();
    // DUMP's payload is binary: compare it as redis-cli prints it.
    let dump = server.cli(&["DUMP", key]).unwrap();
    let pttl = server.cli(&["PTTL", key]).unwrap();
    (type_, dump, pttl)
}

/// The issue's case: another application's hash, string and set under the
/// same prefix (`<prefix>:per-key:index` even starts like a limit's keys)
/// stay exactly as they were; a leaked fleetlimit key is repaired.
#[tokio::test]
async fn sweep_leaves_other_applications_keys_byte_for_byte_alone() {
    let server = RedisServer::start();
    let prefix = prefix("sweep-foreign");
    let cfg = config_file("sweep-foreign.toml", &server.url(), &prefix);
    let cfg = cfg.to_str().unwrap();
    let foreign = [
        format!("{prefix}:users"),
        format!("{prefix}:session:42"),
        format!("{prefix}:per-key:index"),
        // fleetlimit's name, another type: not what the scripts write.
        format!("{prefix}:daily:{{a:eve}}"),
    ];
    server.cli(&["HSET", &foreign[0], "alice", "1"]).unwrap();
    server.cli(&["SET", &foreign[1], "tok"]).unwrap();
    server.cli(&["SADD", &foreign[2], "a"]).unwrap();
    server.cli(&["RPUSH", &foreign[3], "x"]).unwrap();
    // A bucket some older version left without an expiry (raw header tag).
    let leaked = format!("{prefix}:per-key:{{h:caller}}");
    server.cli(&["SET", &leaked, "1700000000000000"]).unwrap();
    // A bucket of a limit this configuration no longer has.
    let unknown = format!("{prefix}:renamed:{{a:bob}}");
    server.cli(&["SET", &unknown, "3"]).unwrap();
    let before: Vec<_> = foreign.iter().map(|k| fingerprint(&server, k)).collect();
    let unknown_before = fingerprint(&server, &unknown);

    let (code, out, err) = run(&["sweep", "--config", cfg]);
    assert_eq!(code, 0, "{err}");
    for (k, b) in foreign.iter().zip(&before) {
        assert_eq!(&fingerprint(&server, k), b, "{k} was changed: {out}");
        assert_eq!(b.2.trim(), "-1", "{k}");
    }
    assert_eq!(
        fingerprint(&server, &unknown),
        unknown_before,
        "a limit the configuration does not know is not repaired without the flag: {out}"
    );
    let pttl: i64 = server
        .cli(&["PTTL", &leaked])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // per-key's own TTL: 10 tokens at 1/min, full in 600 s, plus 2 s.
    assert!((595_000..=602_000).contains(&pttl), "{leaked}: {pttl}");
    assert_eq!(line_value(&out, "scanned:"), 6, "{out}");
    assert_eq!(line_value(&out, "skipped:"), 5, "{out}");
    for k in foreign.iter().chain([&unknown]) {
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with(&format!("{k}  ("))),
            "{k} is listed as skipped: {out}"
        );
    }
    assert!(
        out.contains("a list, where fleetlimit writes a string"),
        "{out}"
    );
    assert!(out.contains("--include-unknown-limits"), "{out}");
    assert_eq!(line_value(&out, "without expiry before:"), 1, "{out}");
    assert_eq!(line_value(&out, "repaired:"), 1, "{out}");
    assert_eq!(line_value(&out, "without expiry after:"), 0, "{out}");

    // With the flag, the unknown limit's bucket gets the default TTL; the
    // other applications' keys are still untouched.
    let (code, out, err) = run(&[
        "sweep",
        "--config",
        cfg,
        "--include-unknown-limits",
        "--default-ttl",
        "90s",
    ]);
    assert_eq!(code, 0, "{err}");
    let pttl: i64 = server
        .cli(&["PTTL", &unknown])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!((85_000..=90_000).contains(&pttl), "{unknown}: {pttl}");
    assert_eq!(server.cli(&["GET", &unknown]).unwrap().trim(), "3");
    assert_eq!(line_value(&out, "skipped:"), 4, "{out}");
    assert_eq!(line_value(&out, "repaired:"), 1, "{out}");
    for (k, b) in foreign.iter().zip(&before) {
        assert_eq!(&fingerprint(&server, k), b, "{k} was changed: {out}");
    }

    // A zero TTL would delete keys, not repair them; so would 1ms (issue
    // 25: refused alike, at least 1s).
    let (code, _, err) = run(&["sweep", "--config", cfg, "--default-ttl", "0s"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--default-ttl must be at least 1s"), "{err}");
}

/// An API key is a secret: no Redis key name holds it, and the admin
/// commands, given the raw value, still find and reset its buckets.
#[tokio::test]
async fn api_keys_are_not_readable_in_redis_and_admin_commands_still_find_them() {
    let server = RedisServer::start();
    let prefix = prefix("secret-keys");
    let path = config_file("secret-keys.toml", &server.url(), &prefix);
    let cfg = path.to_str().unwrap();
    let app = ok_app(fleetlimit::Config::from_toml_file(&path).unwrap()).await;
    let secret = "sk_live_SECRET123";
    for _ in 0..3 {
        let res = send(
            &app,
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", secret)]),
        )
        .await;
        assert_eq!(res.status(), 200);
    }
    let keys: Vec<String> = server
        .keys_with_pttl(&prefix)
        .into_iter()
        .map(|k| k.0)
        .collect();
    assert_eq!(keys.len(), 2, "per-key and daily: {keys:?}");
    for k in &keys {
        assert!(!k.contains("sk_live"), "the API key is readable in {k}");
        assert!(!k.contains("SECRET123"), "the API key is readable in {k}");
    }
    // Both limits' keys of one caller share one hash tag (one cluster slot).
    let tag = |k: &str| k[k.find('{').unwrap()..].to_owned();
    assert_eq!(tag(&keys[0]), tag(&keys[1]), "{keys:?}");

    let (code, out, err) = run(&["inspect", secret, "--config", cfg]);
    assert_eq!(code, 0, "{err}");
    for k in &keys {
        assert!(out.contains(k.as_str()), "inspect shows {k}: {out}");
    }
    // 3 of 10 taken; at 1/min, refilled by under 0.5 in 30 s of slack.
    let left = shown_tokens(&out);
    assert!((7.0..7.5).contains(&left), "{out}");
    assert!(out.contains("3 of 1000 used"), "{out}");
    assert!(!out.contains("no key"), "{out}");

    let (code, out, err) = run(&["reset", secret, "--config", cfg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2 key(s) deleted"), "{out}");
    assert!(server.keys_with_pttl(&prefix).is_empty());
    let res = send(
        &app,
        request("GET", "/", "127.0.0.1:1", &[("x-api-key", secret)]),
    )
    .await;
    assert_eq!(
        header_u64(&res, "x-ratelimit-remaining"),
        9,
        "reset: full again"
    );
}

/// `[keys] secret_env`: the digest is keyed by that variable's value, a
/// missing or short secret is a configuration error at its line, and the
/// CLI computes the same keys from the same variable.
#[tokio::test]
async fn the_key_secret_comes_from_the_named_environment_variable() {
    let server = RedisServer::start();
    let prefix = prefix("secret-env");
    let path = config_file("secret-env.toml", &server.url(), &prefix);
    let body = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        format!("[keys]\nsecret_env = \"FLEETLIMIT_TEST_KEY_SECRET\"\n\n{body}"),
    )
    .unwrap();
    let cfg = path.to_str().unwrap();
    let var = "FLEETLIMIT_TEST_KEY_SECRET";

    let (code, _, err) = run(&["check-config", cfg]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("secret-env.toml:2:14:") && err.contains("FLEETLIMIT_TEST_KEY_SECRET"),
        "{err}"
    );
    assert!(err.contains("is not set"), "{err}");
    let (code, _, err) = run_cli(&["check-config", cfg], &[(var, "short")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("at least 16"), "{err}");
    let (code, out, err) = run_cli(&["check-config", cfg], &[(var, "0123456789abcdef0123")]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("the secret in $FLEETLIMIT_TEST_KEY_SECRET"),
        "{out}"
    );

    // Each secret its own key for one API key; neither the built-in one.
    let shown_key = |secret: &str| {
        let (code, out, err) = run_cli(
            &[
                "inspect",
                "sk_live_X",
                "--limit",
                "per-key",
                "--config",
                cfg,
            ],
            &[(var, secret)],
        );
        assert_eq!(code, 0, "{err}");
        out.split_whitespace()
            .find(|w| w.starts_with(&format!("{prefix}:per-key:")))
            .unwrap_or_else(|| panic!("{out}"))
            .to_owned()
    };
    let a = shown_key("0123456789abcdef0123");
    let b = shown_key("another secret, 16+ bytes");
    assert_ne!(a, b);
    assert_ne!(a, header_key(&prefix, "per-key", "sk_live_X"));
    assert!(a.contains("{h#") && !a.contains("sk_live"), "{a}");
}

#[tokio::test]
async fn an_unknown_limit_or_an_empty_key_is_a_usage_error() {
    let server = RedisServer::start();
    let prefix = prefix("bad-args");
    let cfg = config_file("bad-args.toml", &server.url(), &prefix);
    let cfg = cfg.to_str().unwrap();
    for command in ["reset", "inspect"] {
        let (code, out, err) = run(&[command, "alice", "--limit", "nope", "--config", cfg]);
        assert_eq!(code, 2, "{command}: {out}{err}");
        assert!(
            err.contains("unknown limit \"nope\"; the configuration defines: daily, per-key"),
            "{command}: {err}"
        );
        let (code, out, err) = run(&[command, "", "--config", cfg]);
        assert_eq!(code, 2, "{command} '': {out}{err}");
        assert!(err.contains("the key value is empty"), "{command}: {err}");
    }
}

/// inspect, reset and sweep through a `redis-sentinel://` URL reach the
/// primary the sentinels name.
#[tokio::test]
async fn inspect_reset_and_sweep_through_sentinel() {
    let setup = SentinelSetup::start();
    let prefix = prefix("admin-sentinel");
    let path = config_file("admin-sentinel.toml", &setup.url(), &prefix);
    let cfg = path.to_str().unwrap();
    let app = ok_app(fleetlimit::Config::from_toml_file(&path).unwrap()).await;
    for _ in 0..4 {
        let res = send(
            &app,
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", "alice")]),
        )
        .await;
        assert_eq!(res.status(), 200);
    }
    let primary = &setup.primary;
    let key = header_key(&prefix, "per-key", "alice");
    assert_eq!(primary.cli(&["EXISTS", &key]).unwrap().trim(), "1");

    let (code, out, err) = run(&["inspect", "alice", "--config", cfg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&key), "{out}");
    let left = shown_tokens(&out);
    assert!((6.0..6.5).contains(&left), "4 of 10 taken: {out}");
    assert!(out.contains("4 of 1000 used"), "{out}");

    // A leaked bucket and another application's key on the primary.
    let leaked = header_key(&prefix, "per-key", "bob");
    primary.cli(&["SET", &leaked, "1700000000000000"]).unwrap();
    let other = format!("{prefix}:users");
    primary.cli(&["HSET", &other, "alice", "1"]).unwrap();
    let (code, out, err) = run(&["sweep", "--config", cfg]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(line_value(&out, "scanned:"), 4, "{out}");
    assert_eq!(line_value(&out, "skipped:"), 1, "{out}");
    assert_eq!(line_value(&out, "without expiry before:"), 1, "{out}");
    assert_eq!(line_value(&out, "repaired:"), 1, "{out}");
    assert_eq!(line_value(&out, "without expiry after:"), 0, "{out}");
    let pttl: i64 = primary
        .cli(&["PTTL", &leaked])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!((595_000..=602_000).contains(&pttl), "{pttl}");
    assert_eq!(primary.cli(&["PTTL", &other]).unwrap().trim(), "-1");

    let (code, out, err) = run(&["reset", "alice", "--config", cfg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2 key(s) deleted"), "{out}");
    assert_eq!(primary.cli(&["EXISTS", &key]).unwrap().trim(), "0");
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

/// The command behaves like other Rust CLIs: help and version exit 0,
/// each command has its own help, usage errors exit 2 with clap's message,
/// and it prints shell completions.
#[test]
fn help_version_usage_errors_and_completions() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for command in [
        "check-config",
        "inspect",
        "reset",
        "sweep",
        "shed",
        "completions",
    ] {
        assert!(out.contains(command), "--help lists {command}: {out}");
    }
    let (code, out, _) = run(&["-h"]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert_eq!(
        out.trim(),
        format!("fleetlimit {}", env!("CARGO_PKG_VERSION"))
    );
    let (code, out, _) = run(&["inspect", "--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("--limit <NAME>") && out.contains("--config <FILE>"),
        "{out}"
    );
    let (code, _, err) = run(&["inspect", "alice"]);
    assert_eq!(code, 2);
    assert!(err.contains("--config <FILE>"), "{err}");
    let (code, _, err) = run(&["sweep", "--config", "x.toml", "--default-ttl", "soon"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("invalid value 'soon' for '--default-ttl"),
        "{err}"
    );
    let (code, out, err) = run(&["completions", "bash"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("_fleetlimit()") && out.contains("inspect"),
        "{out}"
    );
    let (code, _, _) = run(&["completions", "tcsh"]);
    assert_eq!(code, 2);
}
