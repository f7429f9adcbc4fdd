//! The README's promise: `cargo run --example quickstart` serves the three
//! routes on a bare machine, and uses Redis when `REDIS_URL` is set.
//! Runs the example binary that `cargo test` builds, over real HTTP.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

mod support;

use support::example::Example;
use support::RedisServer;

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
