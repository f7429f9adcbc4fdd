//! Every token-bucket key outlives its bucket's state, by one to two
//! seconds: the key expires 1 ms after the end of the second (Redis time)
//! after the one in which its bucket is full again (so a key requested
//! about once a second is rewritten in place, not expired and created
//! again). The lean script keeps the TTL it finds
//! (`KEEPTTL`) while the bucket's TAT stays in the same second, so these
//! tests check the exact expiry after every write, from both scripts.
//!
//! Each test first charges `HEADROOM` tokens (`/charge`), so the key's TAT,
//! and with it its expiry, stays at least `HEADROOM ÷ refill` = 2 s ahead of
//! Redis's clock: a test process stalled on a busy machine still finds the
//! key it reads (a bucket just 10 ms from full would expire under it).
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use axum::Router;
use fleetlimit::RateLimitLayer;
use support::*;

// 10 ms per token: a request moves the TAT by 10 ms, so most writes stay
// in the same second (and keep their TTL), and 150 of them cross at least
// one second boundary (and set it again).
const LIMITS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 600
refill = "100/s"

[limits.other]
key = "header:x-api-key"
capacity = 1000
refill = "1000/s"

[limits.thirds]
key = "header:x-api-key"
capacity = 30
refill = "3/s"

[[routes]]
path = "/thirds"
limits = ["thirds"]
on_redis_error = "closed"

[[routes]]
path = "/lean"
limits = ["per-key"]
on_redis_error = "closed"

[[routes]]
path = "/general"
limits = ["per-key", "other"]
on_redis_error = "closed"

[[routes]]
path = "/charge"
limits = ["per-key"]
cost = 200
on_redis_error = "closed"
"#;

/// Tokens `/charge` takes: 2 s of refill at 100/s.
const HEADROOM: u64 = 200;
const CAPACITY: f64 = 600.0;

async fn app(server: &RedisServer, prefix: &str) -> Router {
    let cfg = redis_config(server, prefix, "500ms", LIMITS);
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    support::ok_routes(layer, ["/lean", "/general", "/charge", "/thirds"])
}

/// The key's TAT (µs of Redis time) and its absolute expiry (ms), read in
/// one atomic call.
fn tat_and_expiry(server: &RedisServer, key: &str) -> (f64, i64) {
    // The value's bytes in hex (it may hold a newline), decoded by the
    // library's own reader.
    let script = "local v = redis.call('GET', KEYS[1]) or '' \
        return { (v:gsub('.', function(c) return string.format('%02x', c:byte()) end)), \
        redis.call('PEXPIRETIME', KEYS[1]) }";
    let out = server.cli(&["EVAL", script, "1", key]).unwrap();
    let mut lines = out.lines().map(str::trim);
    let hex = lines.next().unwrap_or("");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .filter_map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    let tat = fleetlimit::store::RedisStore::read_tat(&bytes);
    let at = lines.next().unwrap_or("").parse();
    (
        tat.unwrap_or_else(|| panic!("the key holds a TAT: {out:?}")),
        at.unwrap_or_else(|_| panic!("PEXPIRETIME: {out:?}")),
    )
}

/// Charges `HEADROOM` tokens of the key `k`'s bucket.
async fn charge(app: &Router) {
    let res = send(
        app,
        request("GET", "/charge", "127.0.0.1:1", &[("x-api-key", "k")]),
    )
    .await;
    assert_eq!(res.status(), 200);
    // Whole requests of `HEADROOM` left.
    assert_eq!(
        header_u64(&res, "x-ratelimit-remaining"),
        (CAPACITY as u64 - HEADROOM) / HEADROOM
    );
}

/// What the rule says the expiry of a key holding `tat` is.
fn expected_expiry(tat: f64) -> i64 {
    ((tat / 1e6).ceil() as i64 + 1) * 1000 + 1
}

#[tokio::test]
async fn the_kept_ttl_is_always_the_end_of_the_second_after_the_bucket_is_full() {
    let server = RedisServer::start();
    let prefix = prefix("keepttl");
    let app = app(&server, &prefix).await;
    let key = header_key(&prefix, "per-key", "k");
    charge(&app).await;
    let mut expiries = std::collections::BTreeSet::new();
    for i in 0..150 {
        let res = send(
            &app,
            request("GET", "/lean", "127.0.0.1:1", &[("x-api-key", "k")]),
        )
        .await;
        assert_eq!(res.status(), 200, "request {i}");
        let (tat, expiry) = tat_and_expiry(&server, &key);
        assert_eq!(expiry, expected_expiry(tat), "request {i}: TAT {tat}");
        // The key outlives its state (a missing key is a full bucket)...
        assert!(expiry as f64 * 1000.0 > tat, "request {i}");
        // ...by at most two seconds.
        assert!((expiry as f64 * 1000.0 - tat) <= 2_001_000.0, "request {i}");
        expiries.insert(expiry);
    }
    // 1.5 s of TAT taken in 10 ms steps: the expiry was kept within a
    // second and moved when the TAT left it.
    assert!(expiries.len() >= 2, "{expiries:?}");
    assert!(expiries.len() < 50, "{expiries:?}");
    let left = tokens(&server, &key, CAPACITY, 100.0);
    assert!((250.0..=CAPACITY).contains(&left), "{left}");
}

#[tokio::test]
async fn both_scripts_follow_one_expiry_rule_on_a_shared_key() {
    let server = RedisServer::start();
    let prefix = prefix("shared-expiry");
    let app = app(&server, &prefix).await;
    let key = header_key(&prefix, "per-key", "k");
    charge(&app).await;
    for i in 0..30 {
        // Alternate: one limit (the lean script), two limits (the general
        // driver, lua/decide.lua), both charging the same per-key bucket.
        let path = if i % 2 == 0 { "/lean" } else { "/general" };
        let res = send(
            &app,
            request("GET", path, "127.0.0.1:1", &[("x-api-key", "k")]),
        )
        .await;
        assert_eq!(res.status(), 200, "request {i} on {path}");
        let (tat, expiry) = tat_and_expiry(&server, &key);
        assert_eq!(expiry, expected_expiry(tat), "request {i} on {path}");
    }
    let left = tokens(&server, &key, CAPACITY, 100.0);
    assert!((370.0..=CAPACITY).contains(&left), "{left}");
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn a_key_left_without_expiry_gets_one_at_its_next_request() {
    let server = RedisServer::start();
    let prefix = prefix("leaked");
    let app = app(&server, &prefix).await;
    let key = header_key(&prefix, "per-key", "k");
    // Something else wrote the key without a TTL (a stale TAT: long full).
    server.cli(&["SET", &key, "1000000"]).unwrap();
    assert_eq!(server.cli(&["PTTL", &key]).unwrap().trim(), "-1");
    // A stale TAT is a full bucket: the charge leaves capacity − HEADROOM.
    charge(&app).await;
    let (tat, expiry) = tat_and_expiry(&server, &key);
    assert_eq!(expiry, expected_expiry(tat));
    server.assert_every_key_expires(&prefix);
}

// 3 a second: a token is 333,333⅓ µs, a check's cost a whole number of
// quarter µs, so TATs fall on every quarter. The script writes each one
// exactly: the 8 bytes of the double, never a rounded text.
#[tokio::test]
async fn a_tat_in_quarter_microseconds_is_written_exactly() {
    let server = RedisServer::start();
    let prefix = prefix("quarters");
    let app = app(&server, &prefix).await;
    let key = header_key(&prefix, "thirds", "k");
    let mut fractions = std::collections::BTreeSet::new();
    let started = std::time::Instant::now();
    for i in 0..8 {
        let res = send(
            &app,
            request("GET", "/thirds", "127.0.0.1:1", &[("x-api-key", "k")]),
        )
        .await;
        assert_eq!(res.status(), 200, "request {i}");
        let raw = server.get_bytes(&key).unwrap();
        assert_eq!(raw.len(), 8, "request {i}: {raw:?}");
        let (tat, expiry) = tat_and_expiry(&server, &key);
        assert_eq!(
            (tat * 4.0).fract(),
            0.0,
            "request {i}: {tat} is not a whole number of quarter µs"
        );
        assert_eq!(expiry, expected_expiry(tat), "request {i}: TAT {tat}");
        fractions.insert((tat.fract() * 4.0) as u8);
    }
    // Eight steps of a third of a second from a whole `now`: some TAT was
    // not whole.
    assert!(fractions.iter().any(|&f| f != 0), "{fractions:?}");
    // 8 taken; what refilled since the first is at most 3 a second.
    let left = tokens(&server, &key, 30.0, 3.0);
    let refilled = 3.0 * started.elapsed().as_secs_f64();
    assert!(
        left >= 22.0 - 1e-6 && left <= 22.0 + refilled + 1e-6,
        "{left}"
    );
}
