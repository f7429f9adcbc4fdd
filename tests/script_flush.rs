//! `SCRIPT FLUSH` in the middle of traffic: NOSCRIPT is recovered with
//! EVAL inside the same request, so no request fails or falls back.

mod support;

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
    let cfg = redis_config(&server, &prefix, "500ms", LIMITS);
    let app = ok_app(cfg).await;

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
    // After the last flush the refused key is answered from the refused-key
    // cache; a fresh key goes to Redis, and EVAL caches the script again.
    let fresh = send(
        &app,
        request("GET", "/", "127.0.0.1:1", &[("x-api-key", "fresh")]),
    )
    .await;
    assert_eq!(fresh.status(), 200);
    let sha = fleetlimit::store::RedisStore::lean_script_sha();
    assert_eq!(server.cli(&["SCRIPT", "EXISTS", &sha]).unwrap().trim(), "1");
    server.assert_every_key_expires(&prefix);
}
