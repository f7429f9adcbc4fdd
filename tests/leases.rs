//! Hot-key token leases against a real Redis: a hot key takes tokens in
//! batches and spends them locally; the fleet never admits more than the
//! limit, strands at most a batch per instance, and saves Redis calls.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

mod support;

use support::*;

fn limits(lease: &str) -> String {
    format!(
        r#"
[limits.hot]
key = "header:x-api-key"
capacity = 100
refill = "1/d"
{lease}

[[routes]]
path = "/"
limits = ["hot"]
on_redis_error = "closed"
"#
    )
}

/// Three instances, 300 requests for one key in turn; (admitted, calls,
/// `X-RateLimit-Remaining` of the last admitted request).
async fn run(server: &RedisServer, prefix: &str, lease: &str) -> (usize, u64, u64) {
    let mut apps = Vec::new();
    for _ in 0..3 {
        let cfg = redis_config(server, prefix, "500ms", &limits(lease));
        apps.push(ok_app(cfg).await);
    }
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    let mut admitted = 0;
    let mut last_remaining = u64::MAX;
    for i in 0..300 {
        let res = send(
            &apps[i % 3],
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", "hot")]),
        )
        .await;
        let s = res.status().as_u16();
        assert!(s == 200 || s == 429, "{s}");
        if s == 200 {
            admitted += 1;
            last_remaining = header_u64(&res, "x-ratelimit-remaining");
        }
    }
    (admitted, server.script_calls(), last_remaining)
}

#[tokio::test]
async fn leases_never_over_admit_and_save_redis_calls() {
    let server = RedisServer::start();
    let (plain, plain_calls, last_remaining) = run(&server, &prefix("no-lease"), "").await;
    assert_eq!(plain, 100);
    assert_eq!(
        last_remaining, 0,
        "the 100th admitted request empties the bucket"
    );
    let prefix = prefix("lease");
    let (leased, leased_calls, _) =
        run(&server, &prefix, "lease_batch = 10\nlease_above = 5").await;
    println!("without leases: {plain} admitted, {plain_calls} script calls; with leases: {leased} admitted, {leased_calls} calls");
    // Never more than the limit: leased tokens are charged before they are
    // spent. At most one batch per instance can be stranded or early.
    assert!(leased <= 100, "{leased}");
    assert!(leased >= 100 - 3 * 10, "{leased}");
    assert!(
        leased_calls * 2 <= plain_calls,
        "leases save Redis calls: {leased_calls} vs {plain_calls}"
    );
    server.assert_every_key_expires(&prefix);
}
