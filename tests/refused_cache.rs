//! The refused-key cache: once Redis refuses a key, this instance answers
//! that key by itself until its Retry-After, so a client looping on a
//! refused key costs Redis about one call per refusal window, not one per
//! request; the answers stay the same 429 with honest headers.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::time::Duration;

use support::*;

const LIMITS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 2
refill = "1/2s"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "closed"
"#;

#[tokio::test]
async fn a_looping_client_costs_redis_one_call_per_window() {
    let server = RedisServer::start();
    let prefix = prefix("refused-cache");
    let cfg = redis_config(&server, &prefix, "500ms", LIMITS);
    let app = ok_app(cfg).await;
    let req = || request("GET", "/", "127.0.0.1:1", &[("x-api-key", "looper")]);

    for _ in 0..2 {
        assert_eq!(send(&app, req()).await.status(), 200);
    }
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    let mut retry = Vec::new();
    for _ in 0..200 {
        let res = send(&app, req()).await;
        assert_eq!(res.status(), 429);
        assert_eq!(header_u64(&res, "x-ratelimit-limit"), 2);
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 0);
        assert!(header_u64(&res, "x-ratelimit-reset") >= 1);
        retry.push(header_u64(&res, "retry-after"));
    }
    assert_eq!(server.script_calls(), 1, "one Redis call for 200 refusals");
    assert!(retry.iter().all(|&r| (1..=2).contains(&r)), "{retry:?}");

    // Another key is not affected, and goes to Redis.
    let other = send(
        &app,
        request("GET", "/", "127.0.0.1:1", &[("x-api-key", "polite")]),
    )
    .await;
    assert_eq!(other.status(), 200);
    assert_eq!(server.script_calls(), 2);

    // After Retry-After the key goes to Redis again and is admitted.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(send(&app, req()).await.status(), 200);
    assert_eq!(server.script_calls(), 3);
    server.assert_every_key_expires(&prefix);
}
