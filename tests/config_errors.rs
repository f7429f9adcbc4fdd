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
fn a_redis_url_of_an_unknown_scheme() {
    let e = error_for(
        "scheme.toml",
        "\"redis://127.0.0.1:6379\"",
        "\"notaurl://x\"",
    );
    assert!(
        e.starts_with("scheme.toml:2:7: unsupported Redis URL scheme \"notaurl://\""),
        "{e}"
    );
    assert!(
        e.contains("accepted: redis://, rediss://, redis-cluster://, rediss-cluster://, redis-sentinel://, rediss-sentinel://"),
        "{e}"
    );
    // Also what fred cannot use: no port, no sentinel service name.
    let e = error_for(
        "port.toml",
        "\"redis://127.0.0.1:6379\"",
        "\"redis://127.0.0.1:port\"",
    );
    assert!(
        e.starts_with("port.toml:2:7: cannot read the Redis URL"),
        "{e}"
    );
    let e = error_for(
        "sentinel.toml",
        "\"redis://127.0.0.1:6379\"",
        "\"redis-sentinel://127.0.0.1:26379\"",
    );
    assert!(e.starts_with("sentinel.toml:2:7: bad Redis URL"), "{e}");
}

#[test]
fn a_tls_ca_file_needs_a_rediss_url_and_a_readable_file() {
    let e = error_for(
        "ca-plain.toml",
        "url = \"redis://127.0.0.1:6379\"",
        "url = \"redis://127.0.0.1:6379\"\ntls_ca_file = \"/nonexistent/ca.pem\"",
    );
    assert!(
        e.starts_with("ca-plain.toml:3:15: tls_ca_file is set, but the url \"redis://127.0.0.1:6379\" does not use TLS"),
        "{e}"
    );
    #[cfg(feature = "tls")]
    {
        let e = error_for(
            "ca-missing.toml",
            "url = \"redis://127.0.0.1:6379\"",
            "url = \"rediss://127.0.0.1:6379\"\ntls_ca_file = \"/nonexistent/ca.pem\"",
        );
        assert!(
            e.starts_with("ca-missing.toml:3:15: cannot read tls_ca_file /nonexistent/ca.pem"),
            "{e}"
        );
        let not_pem = file_with("not-pem.txt", "hello\n");
        let e = error_for(
            "ca-not-pem.toml",
            "url = \"redis://127.0.0.1:6379\"",
            &format!(
                "url = \"rediss://127.0.0.1:6379\"\ntls_ca_file = \"{}\"",
                not_pem.display()
            ),
        );
        assert!(e.starts_with("ca-not-pem.toml:3:15: tls_ca_file"), "{e}");
        assert!(e.contains("holds no certificate"), "{e}");
        let e = error_for(
            "cert-alone.toml",
            "url = \"redis://127.0.0.1:6379\"",
            "url = \"rediss://127.0.0.1:6379\"\ntls_client_cert = \"/nonexistent/c.pem\"",
        );
        assert_eq!(
            e,
            "cert-alone.toml:3:19: tls_client_cert needs tls_client_key (the certificate's private key)"
        );
        let e = error_for(
            "key-not-pem.toml",
            "url = \"redis://127.0.0.1:6379\"",
            &format!(
                "url = \"rediss://127.0.0.1:6379\"\ntls_client_cert = \"{0}\"\ntls_client_key = \"{0}\"",
                not_pem.display()
            ),
        );
        assert!(
            e.starts_with("key-not-pem.toml:3:19: tls_client_cert"),
            "{e}"
        );
    }
}
