//! The README's promise: `cargo run --example quickstart` serves the three
//! routes on a bare machine, and uses Redis when `REDIS_URL` is set.
//! Runs the example binary that `cargo test` builds, over real HTTP.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use support::RedisServer;
use support::example::Example;

/// The quickstart with its bundled configuration, using Redis at
/// `redis_url` if given.
fn start(redis_url: Option<&str>) -> Example {
    match redis_url {
        Some(url) => Example::start("quickstart", &[], &[("REDIS_URL", url)]),
        None => Example::start("quickstart", &[], &[]),
    }
}

fn exercise(ex: &Example, tag: &str) {
    let key = format!("key-{tag}");
    assert_eq!(
        ex.statuses("GET", "/", &[("x-api-key", &key)], 6),
        [200, 200, 200, 200, 200, 429]
    );
    let (_, raw) = ex.http("GET", "/", &[("x-api-key", &key)]);
    assert!(raw.contains("retry-after: 1"), "{raw}");
    let acct = format!("acct-{tag}");
    assert_eq!(
        ex.statuses("POST", "/sign-in", &[("x-account", &acct)], 4),
        [200, 200, 200, 429]
    );
    assert_eq!(ex.http("POST", "/sign-in", &[]).0, 401, "no account");
    let search = format!("search-{tag}");
    assert_eq!(
        ex.statuses("GET", "/search", &[("x-api-key", &search)], 3),
        [200, 200, 429],
        "cost 2 of 5"
    );
}

#[test]
fn quickstart_runs_without_redis() {
    let ex = start(None);
    assert!(
        ex.banner.contains("using the in-process store"),
        "{}",
        ex.banner
    );
    exercise(&ex, "memory");
}

#[test]
fn quickstart_uses_redis_when_redis_url_is_set() {
    let server = RedisServer::start();
    let ex = start(Some(&server.url()));
    assert!(
        ex.banner
            .contains(&format!("using Redis at {}", server.url())),
        "{}",
        ex.banner
    );
    exercise(&ex, "redis");
    let keys = server.keys_with_pttl("rl");
    assert_eq!(keys.len(), 3, "{keys:?}");
    server.assert_every_key_expires("rl");
}

/// Edit the file, `kill -HUP`: the new limit applies without a restart. A
/// broken file on the next SIGHUP is reported and the limit kept.
fn reloads_on_sighup(redis_url: Option<&str>, tag: &str) {
    let dir = std::env::temp_dir().join(format!(
        "fleetlimit-quickstart-{}-{tag}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("quickstart.toml");
    let bundled = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/quickstart.toml");
    let original = std::fs::read_to_string(bundled).unwrap();
    std::fs::write(&path, &original).unwrap();
    let path_arg = path.to_str().unwrap();
    let ex = match redis_url {
        Some(url) => Example::start("quickstart", &[path_arg], &[("REDIS_URL", url)]),
        None => Example::start("quickstart", &[path_arg], &[]),
    };
    let hup = || {
        let pid = ex.pid().to_string();
        let status = std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap();
        assert!(status.success());
    };
    let wait = std::time::Duration::from_secs(10);
    let key = format!("before-{tag}");
    assert_eq!(ex.statuses("GET", "/", &[("x-api-key", &key)], 1), [200]);

    // per-key: a burst of 5 becomes 2.
    let edited = original.replacen("capacity = 5\n", "capacity = 2\n", 1);
    assert_ne!(edited, original);
    std::fs::write(&path, edited).unwrap();
    hup();
    let line = ex.line_starting("reload", wait);
    assert_eq!(
        line,
        format!("reloaded {path_arg}: limits changed: per-key")
    );
    let key = format!("after-{tag}");
    assert_eq!(
        ex.statuses("GET", "/", &[("x-api-key", &key)], 3),
        [200, 200, 429]
    );
    let (_, raw) = ex.http("GET", "/", &[("x-api-key", "another")]);
    assert!(raw.contains("x-ratelimit-limit: 2"), "{raw}");

    // A broken file: reported, and the running limits are kept.
    std::fs::write(&path, "[limits.per-key\n").unwrap();
    hup();
    let line = ex.line_starting("reload", wait);
    assert!(
        line.starts_with("reload failed, the running limits are kept: ")
            && line.contains("quickstart.toml:1:"),
        "{line}"
    );
    let key = format!("broken-{tag}");
    assert_eq!(
        ex.statuses("GET", "/", &[("x-api-key", &key)], 3),
        [200, 200, 429]
    );
    assert_eq!(ex.http("POST", "/sign-in", &[]).0, 401, "still routed");
    drop(ex);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quickstart_reloads_its_file_on_sighup() {
    reloads_on_sighup(None, "memory");
}

#[test]
fn quickstart_reloads_on_sighup_with_redis_too() {
    let server = RedisServer::start();
    reloads_on_sighup(Some(&server.url()), "redis");
}
