//! The examples beyond the quickstart keep working: each binary `cargo
//! test` builds, driven over real HTTP, in-process and against the Redis
//! topology it shows (standalone, Cluster, Sentinel).
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use support::example::Example;
use support::{RedisCluster, RedisServer, SentinelSetup};

/// `examples/builder.rs`: limits and routes from code. `/api` has a burst
/// of 10 per API key (under a daily 100); `/export` 3 per IP in a minute.
fn drive_builder(ex: &Example) {
    let k = [("x-api-key", "k")];
    let mut want = vec![200; 10];
    want.push(429);
    assert_eq!(ex.statuses("GET", "/api", &k, 11), want);
    let (_, raw) = ex.http("GET", "/api", &k);
    assert!(raw.contains(r#""limit":"per-key""#), "{raw}");
    assert_eq!(ex.statuses("GET", "/export", &[], 4), [200, 200, 200, 429]);
}

#[test]
fn builder_example_in_process() {
    let ex = Example::start("builder", &[], &[]);
    assert!(ex.banner.contains("in-process store"), "{}", ex.banner);
    drive_builder(&ex);
}

#[test]
fn builder_example_on_redis() {
    let server = RedisServer::start();
    let ex = Example::start("builder", &[], &[("REDIS_URL", &server.url())]);
    assert!(ex.banner.contains("using Redis at"), "{}", ex.banner);
    drive_builder(&ex);
    // per-key and daily for "k", exports for the client IP.
    assert_eq!(server.keys_with_pttl("rl").len(), 3);
    server.assert_every_key_expires("rl");
}

/// `examples/cost.rs`: `?pages=N` spends N of 10, `/export` 5, and a cost
/// above the capacity is `413` without charging anything.
#[test]
fn cost_example_charges_what_each_request_costs() {
    let ex = Example::start("cost", &[], &[]);
    let a = [("x-api-key", "a")];
    assert_eq!(ex.http("GET", "/search?pages=11", &a).0, 413);
    assert_eq!(ex.http("GET", "/search?pages=4", &a).0, 200);
    assert_eq!(ex.http("GET", "/search?pages=4", &a).0, 200);
    // 2 left: 4 pages do not fit, 2 do.
    assert_eq!(ex.http("GET", "/search?pages=4", &a).0, 429);
    assert_eq!(ex.http("GET", "/search?pages=2", &a).0, 200);
    let b = [("x-api-key", "b")];
    assert_eq!(ex.statuses("GET", "/export", &b, 3), [200, 200, 429]);
}

/// `examples/auth.rs`: the middleware's `Account` is the key (no token:
/// the middleware's own 401); a fresh report spends 5 of 10, a cached one
/// gives 4 back, so 6 cached reports fit where 2 fresh ones do.
#[test]
fn auth_example_counts_by_account_and_refunds_cached_reports() {
    let server = RedisServer::start();
    let ex = Example::start("auth", &[], &[("REDIS_URL", &server.url())]);
    assert_eq!(ex.http("GET", "/reports", &[]).0, 401);
    let alice = [("authorization", "Bearer tok-alice")];
    assert_eq!(ex.statuses("GET", "/reports", &alice, 3), [200, 200, 429]);
    let bob = [("authorization", "Bearer tok-bob")];
    let (status, raw) = ex.http("GET", "/reports?cached=1", &bob);
    assert_eq!(status, 200, "{raw}");
    assert!(raw.contains("cached report for acct_bob"), "{raw}");
    // 10 units hold 2 reports of 5: the headers count requests.
    assert!(raw.contains("x-ratelimit-limit: 2"), "{raw}");
    let mut want = vec![200; 5];
    want.push(429);
    assert_eq!(ex.statuses("GET", "/reports?cached=1", &bob, 6), want);
    server.assert_every_key_expires("rl");
}

/// `examples/cluster.rs` on a 3-primary cluster: per tenant 3, everyone 5.
/// A request the per-tenant limit refuses takes nothing from `everyone`
/// (its slot group is given back), so a second tenant gets exactly 2.
/// With its file's route (`closed`) at a deadline of 2 s rather than 5 ms:
/// this test counts admissions, and a debug build's first calls (scripts
/// loaded on each primary, two slot groups in turn) on a busy machine
/// outlast 5 ms and would be answered 503 by the policy.
#[test]
fn cluster_example_limits_per_tenant_and_for_everyone() {
    let cluster = RedisCluster::start();
    let toml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/cluster.toml"
    ))
    .unwrap();
    assert!(
        toml.contains("deadline = \"5ms\""),
        "examples/cluster.toml's deadline moved"
    );
    let path = cluster.nodes[0].dir().join("cluster.toml");
    std::fs::write(
        &path,
        toml.replace("deadline = \"5ms\"", "deadline = \"2s\""),
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let ex = Example::start("cluster", &[path], &[("REDIS_URL", &cluster.url())]);
    assert!(ex.banner.contains("redis-cluster://"), "{}", ex.banner);
    let acme = [("x-tenant", "acme")];
    assert_eq!(ex.statuses("GET", "/", &acme, 5), [200, 200, 200, 429, 429]);
    let beta = [("x-tenant", "beta")];
    assert_eq!(ex.statuses("GET", "/", &beta, 2), [200, 200]);
    let (status, raw) = ex.http("GET", "/", &beta);
    assert_eq!(status, 429, "{raw}");
    assert!(raw.contains(r#""limit":"everyone""#), "{raw}");
    cluster.assert_every_key_expires("rl");
}

/// `examples/sentinel.rs`: the primary found through the sentinels.
#[test]
fn sentinel_example_limits_through_the_sentinels_primary() {
    let setup = SentinelSetup::start();
    let ex = Example::start("sentinel", &[], &[("REDIS_URL", &setup.url())]);
    assert!(ex.banner.contains("redis-sentinel://"), "{}", ex.banner);
    let k = [("x-api-key", "k")];
    assert_eq!(ex.statuses("GET", "/", &k, 5), [200, 200, 200, 200, 429]);
    assert_eq!(setup.primary.keys_with_pttl("rl").len(), 1);
    setup.primary.assert_every_key_expires("rl");
}

/// `examples/custom_key.rs`: per tenant 3 (two users of `acme` share its
/// bucket), another tenant unaffected, no tenant → `on_missing = "reject"`
/// (401 with `WWW-Authenticate`); `/t/{tenant}/items` 2 per tenant in the
/// path, an invalid one 400.
fn drive_custom_key(ex: &Example) {
    let ann = [("authorization", "Bearer tok-acme-ann")];
    let bob = [("authorization", "Bearer tok-acme-bob")];
    assert_eq!(ex.statuses("GET", "/reports", &ann, 2), [200, 200]);
    let (status, raw) = ex.http("GET", "/reports", &bob);
    assert_eq!(status, 200, "{raw}");
    assert!(raw.contains("reports of acme"), "{raw}");
    let (status, raw) = ex.http("GET", "/reports", &ann);
    assert_eq!(status, 429, "{raw}");
    assert!(raw.contains(r#""limit":"per-tenant""#), "{raw}");
    let globex = [("authorization", "Bearer tok-globex")];
    assert_eq!(
        ex.statuses("GET", "/reports", &globex, 4),
        [200, 200, 200, 429]
    );
    let (status, raw) = ex.http("GET", "/reports", &[]);
    assert_eq!(status, 401, "{raw}");
    assert!(raw.contains("urn:fleetlimit:missing-key"), "{raw}");
    assert!(raw.contains("www-authenticate: apikey"), "{raw}");
    assert!(raw.contains(r#"custom key \"tenant\""#), "{raw}");
    // The middleware's own 401 for a token it does not know.
    let (status, raw) = ex.http("GET", "/reports", &[("authorization", "Bearer nope")]);
    assert_eq!(status, 401, "{raw}");
    assert!(!raw.contains("urn:fleetlimit"), "{raw}");

    assert_eq!(ex.statuses("GET", "/t/acme/items", &[], 3), [200, 200, 429]);
    assert_eq!(ex.statuses("GET", "/t/globex/items", &[], 2), [200, 200]);
    let (status, raw) = ex.http("GET", "/t/ACME/items", &[]);
    assert_eq!(status, 400, "{raw}");
    assert!(raw.contains("urn:fleetlimit:invalid-key"), "{raw}");
}

#[test]
fn custom_key_example_in_process() {
    let ex = Example::start("custom_key", &[], &[]);
    assert!(ex.banner.contains("in-process store"), "{}", ex.banner);
    drive_custom_key(&ex);
}

#[test]
fn custom_key_example_on_redis() {
    let server = RedisServer::start();
    let ex = Example::start("custom_key", &[], &[("REDIS_URL", &server.url())]);
    assert!(ex.banner.contains("using Redis at"), "{}", ex.banner);
    drive_custom_key(&ex);
    // acme and globex per token, acme and globex per path: keyed digests,
    // no tenant readable in a key name.
    let keys = server.keys_with_pttl("rl");
    assert_eq!(keys.len(), 4, "{keys:?}");
    for (k, _) in &keys {
        assert!(
            k.contains(":{c#") && !k.contains("acme") && !k.contains("globex"),
            "{k}"
        );
    }
    server.assert_every_key_expires("rl");
}
