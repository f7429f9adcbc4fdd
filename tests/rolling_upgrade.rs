//! A rolling upgrade across the token bucket's stored format: earlier code
//! wrote a TAT as decimal text, this code writes 8 bytes and reads both
//! (lua/token_bucket.lua). The old release is its own lean script,
//! `support/lean_text_tat.lua`, run on the same Redis.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use fleetlimit::RateLimitLayer;
use fleetlimit::store::RedisStore;
use support::*;

/// The lean script of the release before the 8-byte TAT.
const OLD: &str = include_str!("support/lean_text_tat.lua");

/// One token of `tokens` in µs (5 an hour), and its burst with the slack,
/// as the old release's client sent them.
const PER_US: f64 = 720e6;
const OLD_ARGS: [&str; 2] = ["720000000", "3600000000.5"];

const BODY: &str = r#"
refused_cache_keys = 0

[limits.tokens]
key = "header:x-api-key"
capacity = 5
refill = "5/h"

[limits.daily]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 100
window = "1d"

[[routes]]
path = "/"
limits = ["tokens"]
on_redis_error = "closed"

[[routes]]
path = "/both"
limits = ["tokens", "daily"]
on_redis_error = "closed"
"#;

/// One charge by an instance of the old release: its answer (4 × (TAT −
/// now) after the charge, −1 − that when refused).
fn old_charge(server: &RedisServer, key: &str) -> i64 {
    let out = server
        .cli(&["EVAL", OLD, "1", key, "", OLD_ARGS[0], OLD_ARGS[1]])
        .unwrap();
    out.lines().next().unwrap().trim().parse().unwrap()
}

fn redis_now_us(server: &RedisServer) -> f64 {
    let t = server.cli(&["TIME"]).unwrap();
    let mut it = t.lines().map(|l| l.trim().parse::<f64>().unwrap());
    it.next().unwrap() * 1e6 + it.next().unwrap()
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["PTTL", key]).unwrap().trim().parse().unwrap()
}

fn get(path: &str, api_key: &str) -> http::Request<axum::body::Body> {
    request("GET", path, "127.0.0.1:1", &[("x-api-key", api_key)])
}

#[tokio::test]
async fn buckets_the_old_release_wrote_keep_their_tokens_and_expiry() {
    let server = RedisServer::start();
    let prefix = prefix("upgrade-text");
    let key = |api: &str| header_key(&prefix, "tokens", api);
    // The old release charges three callers: 3, 5 (all) and 3 tokens.
    for (api, charges) in [("three", 3), ("spent", 5), ("both", 3), ("a", 2), ("b", 2)] {
        for _ in 0..charges {
            assert!(old_charge(&server, &key(api)) >= 0);
        }
        let raw = server.get_bytes(&key(api)).unwrap();
        let text = String::from_utf8(raw).unwrap();
        assert!(
            text.len() > 8,
            "decimal text, as the old release writes: {text}"
        );
        let tat: f64 = text.parse().unwrap();
        assert!(tat > redis_now_us(&server), "{api}: {text}");
        assert!(pttl(&server, &key(api)) > 0, "{api}: an expiry");
    }
    let spent_before = server.get_bytes(&key("spent")).unwrap();
    let spent_ttl = pttl(&server, &key("spent"));

    let cfg = redis_config(&server, &prefix, "2s", BODY);
    let app = support::ok_routes(RateLimitLayer::new(cfg).await.unwrap(), ["/", "/both"]);

    // The one-check script: 5 − 3 − 1 left, and the TAT one token later,
    // written as 8 bytes with an expiry no earlier than it.
    let old_tat = server.tat(&key("three")).unwrap();
    let res = send(&app, get("/", "three")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 1);
    let raw = server.get_bytes(&key("three")).unwrap();
    assert_eq!(raw.len(), 8, "{raw:?}");
    let tat = server.tat(&key("three")).unwrap();
    assert_eq!(tat, old_tat + PER_US, "one token after the old TAT");
    let ahead_ms = (tat - redis_now_us(&server)) / 1000.0;
    let ttl = pttl(&server, &key("three")) as f64;
    assert!(
        ttl >= ahead_ms && ttl <= ahead_ms + 2_002.0,
        "PTTL {ttl}, TAT ahead {ahead_ms} ms"
    );

    // A bucket the old release emptied stays empty, untouched.
    let res = send(&app, get("/", "spent")).await;
    assert_eq!(res.status(), 429);
    let retry: u64 = header_u64(&res, "retry-after");
    assert!(retry > 600 && retry <= 720, "Retry-After {retry}");
    assert_eq!(server.get_bytes(&key("spent")).unwrap(), spent_before);
    assert!(pttl(&server, &key("spent")) <= spent_ttl);

    // The general script (two limits) reads the text alike.
    let res = send(&app, get("/both", "both")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 1);
    assert_eq!(server.get_bytes(&key("both")).unwrap().len(), 8);

    // So does the lean script, two checks in one call (the layer's batch),
    // each of its bucket: 3 tokens spent after it, 4 × (TAT − now) each.
    let lean = RedisStore::lean_script_sha();
    let inc = PER_US.to_string();
    let burst = format!("{}.5", 5.0 * PER_US);
    let out = server
        .cli(&[
            "EVALSHA",
            &lean,
            "2",
            &key("a"),
            &key("b"),
            "",
            &inc,
            &burst,
            &inc,
            &burst,
        ])
        .unwrap();
    let answers: Vec<f64> = out.lines().map(|l| l.trim().parse().unwrap()).collect();
    for x in &answers[..2] {
        let ahead = x / 4.0;
        assert!(
            ahead <= 3.0 * PER_US && ahead > 3.0 * PER_US - 60e6,
            "{answers:?}"
        );
    }
    server.assert_every_key_expires(&prefix);
}

/// A fleet running both releases: an old instance cannot read the 8-byte
/// TAT, takes the bucket for full and writes its text over it (what
/// docs/operations.md's upgrade note is about); the new code then honours
/// that text.
#[tokio::test]
async fn an_old_reader_takes_a_new_value_for_a_full_bucket() {
    let server = RedisServer::start();
    let prefix = prefix("upgrade-mixed");
    let key = header_key(&prefix, "tokens", "mixed");
    let cfg = redis_config(&server, &prefix, "2s", BODY);
    let app = support::ok_routes(RateLimitLayer::new(cfg).await.unwrap(), ["/", "/both"]);
    for left in (2..5).rev() {
        let res = send(&app, get("/", "mixed")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), left);
    }
    assert_eq!(server.get_bytes(&key).unwrap().len(), 8);

    // The old instance: one token taken from a full bucket (TAT − now is
    // exactly one token), the three the new code charged forgotten.
    assert_eq!(old_charge(&server, &key), 4 * PER_US as i64);
    let text = String::from_utf8(server.get_bytes(&key).unwrap()).unwrap();
    assert!(text.parse::<f64>().is_ok(), "{text}");

    // The new code reads that text: 5 − 1 − 1 left.
    let res = send(&app, get("/", "mixed")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 3);
    assert_eq!(server.get_bytes(&key).unwrap().len(), 8);
    server.assert_every_key_expires(&prefix);
}
