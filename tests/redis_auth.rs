//! A password-protected Redis: the password never shows (check-config,
//! `describe()`, `{:?}`, start-up warnings, CLI errors), and a wrong one is
//! reported as an authentication failure.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::path::PathBuf;

use support::*;

const SECRET: &str = "s3cret";

const LIMITS: &str = r#"[limits.per-key]
key = "header:x-api-key"
capacity = 5
refill = "1/min"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "closed"
"#;

/// A server where the default user's password is `s3cret` and the ACL user
/// `app` has the password `app-s3cret`.
fn protected_server() -> RedisServer {
    let server = RedisServer::start_with(
        &["--requirepass", SECRET],
        &["-a", SECRET, "--no-auth-warning"],
    );
    server
        .cli(&["ACL", "SETUSER", "app", "on", ">app-s3cret", "~*", "+@all"])
        .expect("ACL SETUSER");
    server
}

fn config_file(name: &str, url: &str, prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetlimit-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "[redis]\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\ndeadline = \"500ms\"\n\n{LIMITS}"
        ),
    )
    .unwrap();
    path
}

fn run(args: &[&str]) -> (i32, String, String) {
    run_cli(args, &[])
}

#[test]
fn check_config_and_describe_hide_the_password() {
    for url in [
        format!("redis://app:app-{SECRET}@127.0.0.1:6379/0"),
        format!("redis://:{SECRET}@127.0.0.1:6379"),
        format!(
            "redis-sentinel://app:{SECRET}@127.0.0.1:26379?sentinelServiceName=m&sentinelPassword={SECRET}"
        ),
    ] {
        let path = config_file("describe.toml", &url, "p");
        let (code, out, err) = run(&["check-config", path.to_str().unwrap()]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains("store: redis redis"), "{out}");
        assert!(out.contains(":***@127.0.0.1:"), "{out}");
        assert!(!out.contains(SECRET) && !err.contains(SECRET), "{out}{err}");

        let cfg = fleetlimit::Config::from_toml_file(&path).unwrap();
        assert!(!cfg.describe().contains(SECRET), "{}", cfg.describe());
        let debug = format!("{cfg:?}");
        assert!(!debug.contains(SECRET), "{debug}");
        // The accessor still gives the real URL to whoever connects.
        assert_eq!(cfg.redis_url(), Some(url.as_str()));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_start_up_warning_hides_the_password() {
    // Nothing listens on the port: the "not reachable" warning names the URL.
    let url = format!("redis://app:{SECRET}@127.0.0.1:{}", free_port());
    let cfg = config_at(&url, &prefix("auth-down"), "50ms", LIMITS);
    let (_app, logs) = logged(ok_app(cfg)).await;
    assert!(logs.contains("Redis not reachable at start"), "{logs}");
    assert!(logs.contains("url=redis://app:***@127.0.0.1:"), "{logs}");
    assert!(!logs.contains(SECRET), "{logs}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_wrong_password_is_an_authentication_failure() {
    let server = protected_server();
    let prefix = prefix("auth-wrong");
    for (url, answer) in [
        (
            format!("redis://app:not-{SECRET}@127.0.0.1:{}", server.port),
            "WRONGPASS",
        ),
        (format!("redis://127.0.0.1:{}", server.port), "NOAUTH"),
    ] {
        let cfg = config_at(&url, &prefix, "500ms", LIMITS);
        let (app, logs) = logged(ok_app(cfg)).await;
        assert!(
            logs.contains("Redis refused the credentials at start"),
            "{logs}"
        );
        assert!(logs.contains("authentication failed"), "{logs}");
        assert!(logs.contains(answer), "{logs}");
        assert!(!logs.contains("Connection closed"), "{logs}");
        assert!(!logs.contains(SECRET), "{logs}");
        // Not connected: the closed route answers 503, nothing is written.
        let res = send(
            &app,
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", "a")]),
        )
        .await;
        assert_eq!(res.status(), 503);
        assert!(server.keys_with_pttl(&prefix).is_empty());

        // The CLI says the same, with its failure status.
        let path = config_file("wrong.toml", &url, &prefix);
        let (code, out, err) = run(&["inspect", "a", "--config", path.to_str().unwrap()]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(err.contains("authentication failed"), "{err}");
        assert!(err.contains(answer), "{err}");
        assert!(!err.contains("Connection closed"), "{err}");
        assert!(!format!("{out}{err}").contains(SECRET), "{out}{err}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_right_password_works() {
    let server = protected_server();
    for (name, url) in [
        (
            "acl-user",
            format!("redis://app:app-{SECRET}@127.0.0.1:{}", server.port),
        ),
        (
            "default-user",
            format!("redis://:{SECRET}@127.0.0.1:{}", server.port),
        ),
    ] {
        let prefix = prefix(&format!("auth-{name}"));
        let cfg = config_at(&url, &prefix, "500ms", LIMITS);
        let (app, logs) = logged(ok_app(cfg)).await;
        assert!(!logs.contains("WARN"), "{logs}");
        let req = || request("GET", "/", "127.0.0.1:1", &[("x-api-key", "caller")]);
        for left in (0..5).rev() {
            let res = send(&app, req()).await;
            assert_eq!(res.status(), 200);
            assert_eq!(header_u64(&res, "x-ratelimit-remaining"), left);
        }
        assert_eq!(send(&app, req()).await.status(), 429);
        server.assert_every_key_expires(&prefix);

        let path = config_file(&format!("{name}.toml"), &url, &prefix);
        let (code, out, err) = run(&["inspect", "caller", "--config", path.to_str().unwrap()]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains(&format!("{prefix}:per-key:")), "{out}");
        assert!(!format!("{out}{err}").contains(SECRET), "{out}{err}");
    }
}

/// `redis+unix://` (a Unix socket), with a password: decided by Redis, and
/// the password hidden as everywhere else.
#[tokio::test(flavor = "current_thread")]
async fn a_unix_socket_url_with_a_password() {
    let dir = std::env::temp_dir().join(format!("fleetlimit-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("redis.sock");
    let server = RedisServer::start_with(
        &[
            "--requirepass",
            SECRET,
            "--unixsocket",
            socket.to_str().unwrap(),
            "--unixsocketperm",
            "700",
        ],
        &["-a", SECRET, "--no-auth-warning"],
    );
    let prefix = prefix("auth-unix");
    // fred wants a host name next to credentials; it is not used.
    let url = format!("redis+unix://:{SECRET}@localhost{}", socket.display());
    let cfg = config_at(&url, &prefix, "500ms", LIMITS);
    assert!(
        cfg.describe().contains("redis+unix://:***@localhost/"),
        "{}",
        cfg.describe()
    );
    let (app, logs) = logged(ok_app(cfg)).await;
    assert!(!logs.contains("WARN"), "{logs}");
    let req = || request("GET", "/", "127.0.0.1:1", &[("x-api-key", "caller")]);
    for left in (0..5).rev() {
        let res = send(&app, req()).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), left);
    }
    assert_eq!(send(&app, req()).await.status(), 429);
    server.assert_every_key_expires(&prefix);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
