//! A bad configuration fails at start-up with what and where:
//! `file:line:column: message`.

use std::path::PathBuf;

use fleetlimit::Config;

const GOOD: &str = r#"[redis]
url = "redis://127.0.0.1:6379"

[limits.per-key]
key = "header:x-api-key"
capacity = 5
refill = "1/s"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "open"
"#;

fn file_with(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetlimit-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

/// Loads `GOOD` with one substitution; returns the error's text.
fn error_for(name: &str, from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from}");
    let path = file_with(name, &GOOD.replace(from, to));
    let err = Config::from_toml_file(&path).unwrap_err();
    assert_eq!(err.file(), Some(path.as_path()));
    err.to_string().replace(&path.display().to_string(), name)
}

#[test]
fn the_good_file_loads() {
    let cfg = Config::from_toml_file(file_with("good.toml", GOOD)).unwrap();
    assert_eq!(cfg.redis_url(), Some("redis://127.0.0.1:6379"));
    assert_eq!(cfg.deadline(), std::time::Duration::from_millis(5));
}

#[test]
fn unknown_field() {
    let e = error_for("unknown-field.toml", "capacity = 5", "capacty = 5");
    assert!(
        e.starts_with("unknown-field.toml:6:1: unknown field `capacty`, expected one of"),
        "{e}"
    );
}

#[test]
fn unknown_top_level_section() {
    let e = error_for("unknown-section.toml", "[redis]", "[rediss]");
    assert!(e.starts_with("unknown-section.toml:1:"), "{e}");
    assert!(e.contains("unknown field `rediss`"), "{e}");
}

#[test]
fn unknown_limit_name() {
    let e = error_for(
        "unknown-limit.toml",
        "limits = [\"per-key\"]",
        "limits = [\"per-kee\"]",
    );
    assert_eq!(
        e,
        "unknown-limit.toml:11:11: unknown limit \"per-kee\" (defined: per-key)"
    );
}

#[test]
fn rate_with_an_unknown_unit() {
    let e = error_for("fortnight.toml", "\"1/s\"", "\"10/fortnight\"");
    assert!(
        e.starts_with(
            "fortnight.toml:7:10: invalid rate \"10/fortnight\": unknown time unit \"fortnight\""
        ),
        "{e}"
    );
}

#[test]
fn zero_capacity() {
    let e = error_for("zero.toml", "capacity = 5", "capacity = 0");
    assert_eq!(
        e,
        "zero.toml:6:12: limit \"per-key\": capacity must be at least 1"
    );
}

#[test]
fn other_mistakes_are_located_too() {
    let e = error_for("policy.toml", "\"open\"", "\"ajar\"");
    assert!(
        e.starts_with("policy.toml:12:18: unknown variant `ajar`"),
        "{e}"
    );
    let e = error_for("key.toml", "\"header:x-api-key\"", "\"cookie:sid\"");
    assert!(
        e.starts_with("key.toml:5:7: unknown key source \"cookie:sid\""),
        "{e}"
    );
    let e = error_for("cost.toml", "on_redis_error = \"open\"", "cost = 6");
    assert!(
        e.starts_with("cost.toml:12:8: cost 6 is more than limit \"per-key\" can ever hold"),
        "{e}"
    );
    let e = error_for(
        "deadline.toml",
        "url = \"redis://127.0.0.1:6379\"",
        "deadline = \"5 parsecs\"",
    );
    assert!(e.starts_with("deadline.toml:2:12: invalid duration"), "{e}");
    let e = error_for("syntax.toml", "capacity = 5", "capacity = ");
    assert!(e.starts_with("syntax.toml:6:"), "{e}");
}

#[test]
fn a_missing_file_names_the_file() {
    let err = Config::from_toml_file("/nonexistent/fleetlimit.toml").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("/nonexistent/fleetlimit.toml: cannot read the configuration"),
        "{err}"
    );
}

#[test]
fn a_breaker_window_not_above_the_deadline() {
    let e = error_for(
        "window.toml",
        "url = \"redis://127.0.0.1:6379\"",
        "url = \"redis://127.0.0.1:6379\"\ndeadline = \"50ms\"\n\n[breaker]\nwindow = \"50ms\"\n",
    );
    assert!(
        e.starts_with(
            "window.toml:6:10: [breaker] window (50ms) must be longer than the deadline (50ms)"
        ),
        "{e}"
    );
}
