//! What the `fleetlimit` command prints cannot be forged or garbled by
//! what is in Redis: key names and record fields are escaped and bounded
//! in the text and in `--json`; states the limiter takes as absent are
//! said to be; a key of the wrong type is named, not fatal; a malformed
//! URL never shows its secret; numbers and policies are written as in the
//! TOML file.
// The command and its --json: not built without the `cli` feature.
#![cfg(feature = "cli")]

use crate::support;

use std::path::PathBuf;

use fred::prelude::*;
use support::*;

fn config_file(name: &str, body: &str) -> PathBuf {
    temp_file("output", name, body)
}

/// Two limits per caller (a token bucket of 10 at 1/min, a fixed window of
/// 1000 per hour), keyed by account, on `server` under `prefix`.
fn accounts(server: &RedisServer, prefix: &str, extra: &str) -> String {
    format!(
        r#"[redis]
url = "{}"
key_prefix = "{prefix}"

[limits.acct]
key = "account:x-account"
capacity = 10
refill = "1/min"

[limits.daily]
key = "account:x-account"
algorithm = "fixed-window"
limit = 1000
window = "1h"
{extra}
[[routes]]
path = "/"
limits = ["acct", "daily"]
on_redis_error = "open"
"#,
        server.url()
    )
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The issue's keys: one that forges two summary lines of the sweep, one
/// that clears the terminal, and one of 100 KB.
#[tokio::test]
async fn sweep_prints_every_name_escaped_and_bounded() {
    let server = RedisServer::start();
    let prefix = prefix("out-sweep");
    let path = config_file("sweep.toml", &accounts(&server, &prefix, ""));
    let cfg = path.to_str().unwrap();
    let client = server.client().await;
    let forged = format!("{prefix}:acct:{{a:x}}\nwithout expiry after: 0\nrepaired: 999");
    let clear = format!("{prefix}:acct:{{a:\x1b[2J\x1b[H}}");
    let long = format!("{prefix}:{}", "k".repeat(100_000));
    for k in [&forged, &clear, &long] {
        let _: () = client.set(k, "1", None, None, false).await.unwrap();
    }
    // A bucket of ours without expiry, so there is a real line to count.
    let ours = format!("{prefix}:acct:{{a:bob}}");
    let _: () = client.set(&ours, "1", None, None, false).await.unwrap();
    // And one whose value the limiter ignores: said so.
    let bad = format!("{prefix}:daily:{{a:bob}}");
    let _: () = client.set(&bad, "inf", None, None, false).await.unwrap();

    let (code, out, err) = run_cli(&["sweep", "--config", cfg, "--dry-run"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains('\x1b'),
        "an escape reached the terminal: {out:?}"
    );
    let starting = |p: &str| out.lines().filter(|l| l.starts_with(p)).count();
    assert_eq!(starting("without expiry after:"), 1, "{out}");
    assert_eq!(starting("repaired:"), 0, "a dry run repairs nothing: {out}");
    assert!(out.contains("without expiry after: 2\n"), "{out}");
    assert!(
        out.contains(&format!(
            "  {bad}  (invalid state (taken as absent by the limiter))\n"
        )),
        "{out}"
    );
    assert!(
        out.contains("{a:x}\\x0awithout expiry after: 0\\x0arepaired: 999"),
        "{out}"
    );
    assert!(out.contains("{a:\\x1b[2J\\x1b[H}"), "{out}");
    let whole = long.len();
    assert!(out.contains(&format!("…({whole} bytes)")), "{out}");
    assert!(
        out.lines().all(|l| l.len() < 400),
        "a line unbounded: {out}"
    );

    let (code, out, err) = run_cli(&["sweep", "--config", cfg, "--dry-run", "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    let v = json(&out);
    assert_eq!(v["before"], 2);
    assert_eq!(v["after"], 2);
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["keys"], serde_json::json!([ours, bad]));
    assert_eq!(v["invalid"], serde_json::json!([bad]));
    let skipped: Vec<&str> = v["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    assert!(
        skipped
            .iter()
            .all(|k| !k.contains(['\n', '\x1b']) && k.len() < 400),
        "{skipped:?}"
    );
    server.kill();
}

/// A decision record whose fields forge a line of `explain`'s report (a
/// `<- CHECK` of its own) and drive the terminal.
#[tokio::test]
async fn explain_prints_record_fields_escaped() {
    let server = RedisServer::start();
    let prefix = prefix("out-explain");
    let path = config_file(
        "explain.toml",
        &accounts(
            &server,
            &prefix,
            "\n[limits.acct.record]\nmax_age = \"1h\"\n",
        ),
    );
    let cfg = path.to_str().unwrap();
    let stream = format!("{prefix}:record:{{acct}}");
    // The caller as records name it.
    let (code, out, err) = run_cli(
        &["explain", "carol", "--limit", "acct", "--config", cfg],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let id = out
        .split("caller ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap()
        .to_owned();
    let forged = "i-1\n  2026-12-01T04:31:00.000Z  REFUSED 429    remaining 0  via redis  \
                  (previous answer: remaining 9)  <- CHECK: refused right after an answer with tokens left";
    for (allowed, remaining, via, instance) in [
        ("1", "0", "redis", "i-1"),
        ("0", "0", "redis\x1b[2J", forged),
    ] {
        let fields = [
            ("key", id.as_str()),
            ("plan", ""),
            ("allowed", allowed),
            ("remaining", remaining),
            ("degraded", "0"),
            ("via", via),
            ("instance", instance),
        ];
        let mut args = vec!["XADD", stream.as_str(), "*"];
        args.extend(fields.iter().flat_map(|(k, v)| [*k, *v]));
        server.cli(&args).unwrap();
    }
    server.cli(&["PEXPIRE", &stream, "600000"]).unwrap();

    let (code, out, err) = run_cli(
        &["explain", "carol", "--limit", "acct", "--config", cfg],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains('\x1b'), "{out:?}");
    assert!(out.contains("2 recorded, 1 admitted, 1 refused"), "{out}");
    // One line per decision (the admission, the refusal): the forged one
    // is inside the refusal's line, escaped.
    let decisions: Vec<&str> = out.lines().filter(|l| l.starts_with("  20")).collect();
    assert_eq!(decisions.len(), 2, "{out}");
    assert!(
        decisions[1].contains("instance i-1\\x0a  2026-12-01"),
        "{out}"
    );
    assert!(
        out.contains("every refusal followed an answer of remaining 0"),
        "{out}"
    );

    let (code, out, err) = run_cli(
        &[
            "explain", "carol", "--limit", "acct", "--config", cfg, "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["decisions"].as_array().unwrap().len(), 2);
    assert_eq!(v["decisions"][1]["via"], "redis\\x1b[2J");
    assert!(
        v["decisions"][1]["instance"]
            .as_str()
            .unwrap()
            .starts_with("i-1\\x0a")
    );
    server.kill();
}

/// Values the limiter takes as absent (it admits from a full bucket):
/// `inspect` and `top` say so, never `… of 1000 used`, `-inf of 10
/// tokens` or `EXHAUSTED`.
#[tokio::test]
async fn inspect_and_top_read_invalid_state_as_the_limiter_does() {
    let server = RedisServer::start();
    let prefix = prefix("out-invalid");
    let path = config_file("invalid.toml", &accounts(&server, &prefix, ""));
    let cfg = path.to_str().unwrap();
    let client = server.client().await;
    let values = ["99999999999999999999999", "1e400", "inf"];
    for (i, v) in values.iter().enumerate() {
        for limit in ["acct", "daily"] {
            let key = format!("{prefix}:{limit}:{{a:caller-{i}}}");
            let ex = Some(Expiration::PX(600_000));
            let _: () = client.set(&key, *v, ex, None, false).await.unwrap();
        }
    }
    for (i, v) in values.iter().enumerate() {
        let caller = format!("caller-{i}");
        let (code, out, err) = run_cli(&["inspect", &caller, "--config", cfg], &[]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            out.matches("invalid state (taken as absent by the limiter)")
                .count(),
            2,
            "{v}: {out}"
        );
        assert!(
            !out.contains("used in this window") && !out.contains("inf of"),
            "{v}: {out}"
        );
        let (code, out, err) = run_cli(&["inspect", &caller, "--config", cfg, "--json"], &[]);
        assert_eq!(code, 0, "{err}");
        let v = json(&out);
        for b in v["buckets"].as_array().unwrap() {
            assert_eq!(b["invalid"], true, "{b}");
        }
        assert_eq!(v["buckets"][0]["remaining"], 10.0);
        assert_eq!(v["buckets"][1]["remaining"], 1000.0);
    }
    // And the layer agrees: a full bucket.
    let app = ok_app(fleetlimit::Config::from_toml_file(&path).unwrap()).await;
    let res = send(
        &app,
        request("GET", "/", "10.0.0.1:1", &[("x-account", "caller-0")]),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 9);

    let (code, out, err) = run_cli(&["top", "--once", "--config", cfg], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("EXHAUSTED"), "{out}");
    // caller-0 was rewritten by its request: two invalid keys are left.
    assert!(
        out.contains("limit acct (token bucket of 10 refilled at 1/min): 3 keys in view, 0 exhausted, 2 with an invalid state (taken as absent by the limiter)"),
        "{out}"
    );
    let (code, out, err) = run_cli(&["top", "--once", "--json", "--config", cfg], &[]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["limits"][0]["invalid"], 2, "{v}");
    assert_eq!(v["limits"][1]["invalid"], 2, "{v}");
    server.kill();
}

/// `inspect` without `--limit` when one of the caller's keys holds
/// another type: every limit shown, that key named.
#[tokio::test]
async fn inspect_names_a_key_of_the_wrong_type() {
    let server = RedisServer::start();
    let prefix = prefix("out-type");
    let path = config_file("type.toml", &accounts(&server, &prefix, ""));
    let cfg = path.to_str().unwrap();
    let key = format!("{prefix}:acct:{{a:dave}}");
    server.cli(&["HSET", &key, "f", "v"]).unwrap();
    let daily = format!("{prefix}:daily:{{a:dave}}");
    server.cli(&["SET", &daily, "7", "PX", "600000"]).unwrap();
    let (code, out, err) = run_cli(&["inspect", "dave", "--config", cfg], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("WRONGTYPE"), "{out}");
    assert!(
        out.contains(&format!("acct  {key}\n    a hash, where fleetlimit writes a string: invalid state (taken as absent by the limiter)")),
        "{out}"
    );
    assert!(out.contains("7 of 1000 used in this window"), "{out}");
    let (code, out, _) = run_cli(&["reset", "dave", "--config", cfg, "--json"], &[]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)["deleted"], 2);
    server.kill();
}

/// A password pasted where the URL goes, in each of the three places, and
/// a Sentinel `node=` holding `user:pass@`: never printed.
#[test]
fn a_malformed_url_never_shows_its_secret() {
    let body =
        "[limits.a]\nkey = \"ip\"\ncapacity = 1\nrefill = \"1/s\"\n\n[default]\nlimits = [\"a\"]\n";
    let path = config_file("plain.toml", body);
    let cfg = path.to_str().unwrap();
    let (code, _, err) = run_cli(
        &["inspect", "x", "--config", cfg, "--redis", "Sup3rSecret"],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("Sup3rSecret"), "{err}");
    assert!(
        err.contains("--redis: cannot read the Redis URL \"<unparseable URL>\""),
        "{err}"
    );
    let (code, _, err) = run_cli(
        &["sweep", "--config", cfg],
        &[("REDIS_URL", "redis://u:Sup3rSecret@h:port")],
    );
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("Sup3rSecret"), "{err}");
    assert!(err.contains("\"redis://<unparseable URL>\""), "{err}");
    let in_file = config_file(
        "url.toml",
        &format!("[redis]\nurl = \"Sup3rSecret\"\n{body}"),
    );
    let (code, _, err) = run_cli(&["check-config", in_file.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("url.toml:2:7: cannot read the Redis URL \"<unparseable URL>\""),
        "{err}"
    );
    assert!(!err.contains("Sup3rSecret"), "{err}");
    let node =
        "redis-sentinel://h:26379?sentinelServiceName=m&node=admin:Sup3rSecret@h2:26380&node=bad";
    let sentinel = config_file("node.toml", &format!("[redis]\nurl = \"{node}\"\n{body}"));
    let (code, _, err) = run_cli(&["check-config", sentinel.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("Sup3rSecret"), "{err}");
    assert!(err.contains("node=***@h2:26380"), "{err}");
}

/// check-config in the file's own words: `1/min`, `reject`, `open`; a
/// valid file that limits nothing is warned about.
#[test]
fn check_config_speaks_toml() {
    let body = "[limits.a]\nkey = \"header:x-api-key\"\ncapacity = 10\nrefill = \"1/min\"\n\n\
                [limits.w]\nkey = \"ip\"\nalgorithm = \"sliding-window\"\nlimit = 5\nwindow = \"15min\"\n\n\
                [default]\nlimits = [\"a\", \"w\"]\non_redis_error = \"open\"\n";
    let path = config_file("words.toml", body);
    let (code, out, err) = run_cli(&["check-config", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "{err}");
    assert!(
        out.contains("limit a: key header:x-api-key (on_missing reject), token bucket of 10 refilled at 1/min\n"),
        "{out}"
    );
    assert!(out.contains("sliding window of 5 per 15min"), "{out}");
    assert!(
        out.contains("default: limits [a, w], cost 1, on_redis_error open\n"),
        "{out}"
    );
    assert!(!out.contains("0.01666"), "{out}");

    for (name, text) in [
        ("empty.toml", ""),
        (
            "limits-only.toml",
            "[limits.a]\nkey = \"ip\"\ncapacity = 1\nrefill = \"1/s\"\n",
        ),
    ] {
        let path = config_file(name, text);
        let (code, out, err) = run_cli(&["check-config", path.to_str().unwrap()], &[]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.starts_with(&format!("{}: ok, but it limits nothing\n", path.display())),
            "{out}"
        );
        assert!(
            err.contains("warning:") && err.contains("no request is limited"),
            "{err}"
        );
    }
}

/// `shed --for 1ms` says 1ms (not "0 s"); `sweep --default-ttl` below a
/// second (an expiry that deletes) is refused like 0s.
#[tokio::test]
async fn durations_are_said_as_written() {
    let server = RedisServer::start();
    let prefix = prefix("out-units");
    let path = config_file("units.toml", &accounts(&server, &prefix, ""));
    let cfg = path.to_str().unwrap();
    let (code, out, err) = run_cli(&["shed", "1.2", "--for", "1ms", "--config", cfg], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("= 1.2 for 1ms;"), "{out}");
    let (code, out, err) = run_cli(&["shed", "0.5", "--for", "90s", "--config", cfg], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("= 0.5 for 90s;"), "{out}");
    for ttl in ["0s", "1ms", "999ms"] {
        let (code, _, err) = run_cli(&["sweep", "--config", cfg, "--default-ttl", ttl], &[]);
        assert_eq!(code, 2, "{ttl}: {err}");
        assert!(err.contains("--default-ttl must be at least 1s"), "{err}");
    }
    let (code, _, err) = run_cli(
        &["sweep", "--config", cfg, "--default-ttl", "1s", "--dry-run"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    server.kill();
}
