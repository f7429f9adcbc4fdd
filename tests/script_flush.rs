//! `SCRIPT FLUSH` in the middle of traffic: NOSCRIPT is recovered with
//! EVAL inside the same request, so no request fails or falls back.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use support::*;

const LIMITS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 100
refill = "1/d"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "closed"
"#;

#[tokio::test]
async fn script_flush_mid_traffic_loses_nothing() {
    let server = RedisServer::start();
    let prefix = prefix("flush");
    // A generous deadline isolates the flush from machine noise: any
    // fallback on this closed route would be a 503.
    // The refused-key cache is off, so every request (and every flush)
    // reaches Redis.
    let body = format!("refused_cache_keys = 0\n{LIMITS}");
    let app = ok_app(redis_config(&server, &prefix, "500ms", &body)).await;
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();

    let mut counts = std::collections::BTreeMap::new();
    for i in 0..300 {
        if i % 40 == 20 {
            assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).unwrap().trim(), "OK");
        }
        let res = send(
            &app,
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", "flushy")]),
        )
        .await;
        *counts.entry(res.status().as_u16()).or_insert(0) += 1;
    }
    assert_eq!(counts.get(&200), Some(&100), "{counts:?}");
    assert_eq!(counts.get(&429), Some(&200), "{counts:?}");
    assert_eq!(counts.len(), 2, "no 503, no 500: {counts:?}");
    // Each of the 7 flushes cost exactly one EVAL (the NOSCRIPT recovery,
    // which caches the script again for the calls after it).
    assert_eq!(server.calls_of("eval"), 7);
    // A fresh key after the last flush runs the cached script.
    let fresh = send(
        &app,
        request("GET", "/", "127.0.0.1:1", &[("x-api-key", "fresh")]),
    )
    .await;
    assert_eq!(fresh.status(), 200);
    // (Requests one at a time: each call carries one check, and runs the
    // one-check script.)
    let sha = fleetlimit::store::RedisStore::one_check_script_sha();
    assert_eq!(server.cli(&["SCRIPT", "EXISTS", &sha]).unwrap().trim(), "1");
    server.assert_every_key_expires(&prefix);
}
