//! A key holding state fleetlimit did not write (another type, text, nan,
//! inf, a number out of the algorithm's range) is a fresh key for that key
//! alone: its requests get a normal decision and the key is rewritten with
//! valid state and an expiry. It never fails other keys' checks (coalesced
//! into the same script call), never counts toward the circuit breaker, and
//! a refused request is charged nowhere.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use fleetlimit::store::{Bucket, Check, RedisStore, Rule, Store, StoreFuture};
use fleetlimit::{RateLimitLayer, StoreError};
use support::stats::Parts;
use support::*;
use tokio::task::JoinSet;

/// Keys of `limit` under `prefix`.
fn keys_of(server: &RedisServer, prefix: &str, limit: &str) -> BTreeSet<String> {
    server
        .cli(&["--scan", "--pattern", &format!("{prefix}:{limit}:*")])
        .unwrap_or_default()
        .lines()
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Sends one request for `account` and returns the key of `limit` it
/// created (whatever the key layout).
async fn key_made_by(
    app: &Router,
    server: &RedisServer,
    prefix: &str,
    limit: &str,
    path: &str,
    account: &str,
) -> String {
    let before = keys_of(server, prefix, limit);
    let method = if path == "/sign-in" { "POST" } else { "GET" };
    let res = send(
        app,
        request(method, path, "127.0.0.1:1", &[("x-account", account)]),
    )
    .await;
    assert_eq!(res.status(), 200, "{path} {account}");
    let made: Vec<String> = keys_of(server, prefix, limit)
        .difference(&before)
        .cloned()
        .collect();
    assert_eq!(made.len(), 1, "{path} {account}: {made:?}");
    made.into_iter().next().unwrap()
}

/// Redis TIME in µs.
fn redis_now_us(server: &RedisServer) -> u64 {
    let t = server.cli(&["TIME"]).unwrap();
    let mut it = t.lines().map(|l| l.trim().parse::<u64>().unwrap());
    it.next().unwrap() * 1_000_000 + it.next().unwrap()
}

/// Replaces `key` with `value` (`None`: a hash), plus SET options.
fn poison(server: &RedisServer, key: &str, value: Option<&str>, opts: &[&str]) {
    server.cli(&["DEL", key]).unwrap();
    match value {
        None => assert_eq!(server.cli(&["HSET", key, "f", "1"]).unwrap().trim(), "1"),
        Some(v) => {
            let mut args = vec!["SET", key, v];
            args.extend_from_slice(opts);
            assert_eq!(server.cli(&args).unwrap().trim(), "OK", "SET {key} {v}");
        }
    }
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["PTTL", key]).unwrap().trim().parse().unwrap()
}

const SIGN_IN: &str = r#"
[limits.sign-in]
key = "account:x-account"
capacity = 10
refill = "10/h"

[[routes]]
path = "/sign-in"
methods = ["POST"]
limits = ["sign-in"]
on_redis_error = "closed"
"#;

/// The issue's reproduction: one account's key set to a hash, then 30
/// concurrent requests for it among 60 for fresh accounts (coalesced into
/// shared script calls, the default).
#[tokio::test]
async fn a_poisoned_key_fails_no_other_check_and_opens_no_breaker() {
    let server = RedisServer::start();
    let prefix = prefix("poison-batch");
    let cfg = redis_config(&server, &prefix, "2s", SIGN_IN);
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    let app = Router::new()
        .route("/sign-in", post(|| async { "ok" }))
        .layer(layer.clone());
    let key = key_made_by(&app, &server, &prefix, "sign-in", "/sign-in", "victim").await;
    poison(&server, &key, None, &[]);

    let mut set = JoinSet::new();
    for i in 0..90 {
        // Every third request is the poisoned account's, so the batches mix.
        let account = if i % 3 == 0 {
            "victim".to_owned()
        } else {
            format!("fresh-{i}")
        };
        let app = app.clone();
        set.spawn(async move {
            let res = send(
                &app,
                request(
                    "POST",
                    "/sign-in",
                    "127.0.0.1:1",
                    &[("x-account", &account)],
                ),
            )
            .await;
            (account, res.status().as_u16())
        });
    }
    let (mut victim, mut fresh) = (Vec::new(), Vec::new());
    while let Some(r) = set.join_next().await {
        let (account, status) = r.unwrap();
        if account == "victim" {
            victim.push(status);
        } else {
            fresh.push(status);
        }
    }
    assert_eq!(fresh.len(), 60);
    assert!(fresh.iter().all(|&s| s == 200), "fresh accounts: {fresh:?}");
    // A full bucket of 10 (the first request's charge was wiped with the
    // key), then refusals: a decision, not a failure.
    victim.sort_unstable();
    assert_eq!(
        victim.iter().filter(|&&s| s == 200).count(),
        10,
        "{victim:?}"
    );
    assert_eq!(
        victim.iter().filter(|&&s| s == 429).count(),
        20,
        "{victim:?}"
    );

    for i in 0..30 {
        let res = send(
            &app,
            request(
                "POST",
                "/sign-in",
                "127.0.0.1:1",
                &[("x-account", &format!("later-{i}"))],
            ),
        )
        .await;
        assert_eq!(
            res.status(),
            200,
            "clean request {i} after the poisoned batch"
        );
    }
    let stats = layer.breaker().unwrap();
    assert_eq!((stats.opened, stats.failures), (0, 0), "{stats:?}");

    // Valid state (a TAT in the near future) with an expiry.
    assert_eq!(server.cli(&["TYPE", &key]).unwrap().trim(), "string");
    let tat = server.tat(&key).unwrap();
    let now = redis_now_us(&server) as f64;
    assert!(tat > now && tat <= now + 3600e6, "TAT {tat}, now {now}");
    let ttl = pttl(&server, &key);
    assert!(ttl > 0 && ttl <= 3_602_001, "PTTL {ttl}");
    server.assert_every_key_expires(&prefix);
}

/// One route per algorithm; "/general" counts two token buckets, so its
/// requests take the general script rather than the lean one.
const ALGORITHMS: &str = r#"
[limits.lean]
key = "account:x-account"
capacity = 5
refill = "5/h"

[limits.general]
key = "account:x-account"
capacity = 5
refill = "5/h"

[limits.roomy]
key = "account:x-account"
capacity = 1000
refill = "1000/h"

[limits.fixed]
key = "account:x-account"
algorithm = "fixed-window"
limit = 5
window = "10min"

[limits.sliding]
key = "account:x-account"
algorithm = "sliding-window"
limit = 5
window = "10min"

[[routes]]
path = "/lean"
limits = ["lean"]
on_redis_error = "closed"

[[routes]]
path = "/general"
limits = ["general", "roomy"]
on_redis_error = "closed"

[[routes]]
path = "/fixed"
limits = ["fixed"]
on_redis_error = "closed"

[[routes]]
path = "/sliding"
limits = ["sliding"]
on_redis_error = "closed"
"#;

/// Every kind of state fleetlimit never writes, for every algorithm: the
/// request is decided as on a fresh key (200, 4 of 5 left) and the key then
/// holds the state of that one request, with an expiry.
#[tokio::test]
async fn garbage_state_is_a_fresh_key_rewritten_with_an_expiry() {
    let server = RedisServer::start();
    let prefix = prefix("poison-table");
    let cfg = redis_config(&server, &prefix, "2s", ALGORITHMS);
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    let app = Router::new()
        .route("/lean", get(|| async { "ok" }))
        .route("/general", get(|| async { "ok" }))
        .route("/fixed", get(|| async { "ok" }))
        .route("/sliding", get(|| async { "ok" }))
        .layer(layer.clone());

    let now_us = redis_now_us(&server);
    let window_idx = now_us / 1000 / 600_000;
    // A TAT eleven days ahead (a burst spans an hour) whose key expires in a
    // minute, or never: not a TAT fleetlimit writes.
    let far_tat = (now_us + 1_000_000_000_000).to_string();
    let mut bucket_garbage: Vec<(Option<String>, Vec<&str>)> = [
        "nan", "inf", "-inf", "1e400", "-1e400", "garbage", "", "12abc", "1e300",
    ]
    .iter()
    .map(|v| (Some((*v).to_owned()), vec![]))
    .collect();
    bucket_garbage.push((None, vec![]));
    bucket_garbage.push((Some(far_tat.clone()), vec!["PX", "60000"]));
    bucket_garbage.push((Some(far_tat), vec![]));
    let mut fixed_garbage: Vec<(Option<String>, Vec<&str>)> = [
        "nan",
        "inf",
        "1e400",
        "-5",
        "2.5",
        "garbage",
        "007",
        "+3",
        " 3",
        "99999999999999999999",
    ]
    .iter()
    .map(|v| (Some((*v).to_owned()), vec![]))
    .collect();
    fixed_garbage.push((None, vec![]));
    // An expiry beyond the window: fleetlimit never sets one.
    fixed_garbage.push((Some("3".into()), vec!["EX", "1000000"]));
    let mut sliding_garbage: Vec<(Option<String>, Vec<&str>)> = vec![
        "nan nan nan".to_owned(),
        "garbage".to_owned(),
        "1 2".to_owned(),
        format!("{window_idx} nan 0"),
        format!("{window_idx} inf 0"),
        format!("{window_idx} -5 0"),
        format!("{window_idx} 1e400 0"),
        format!("{window_idx} 0 -inf"),
        format!("{window_idx} 0 -3"),
        format!("{} 9 9", window_idx + 1000),
        format!("{window_idx}.5 0 0"),
    ]
    .into_iter()
    .map(|v| (Some(v), vec![]))
    .collect();
    sliding_garbage.push((None, vec![]));

    let cases = [
        ("/lean", "lean", &bucket_garbage),
        ("/general", "general", &bucket_garbage),
        ("/fixed", "fixed", &fixed_garbage),
        ("/sliding", "sliding", &sliding_garbage),
    ];
    let mut n = 0;
    for (path, limit, garbage) in cases {
        for (value, opts) in garbage.iter() {
            n += 1;
            let account = format!("{limit}-{n}");
            let key = key_made_by(&app, &server, &prefix, limit, path, &account).await;
            poison(&server, &key, value.as_deref(), opts);
            let what = format!("{path} holding {value:?} {opts:?}");
            let res = send(
                &app,
                request("GET", path, "127.0.0.1:1", &[("x-account", &account)]),
            )
            .await;
            assert_eq!(res.status(), 200, "{what}");
            assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 4, "{what}");

            assert_eq!(
                server.cli(&["TYPE", &key]).unwrap().trim(),
                "string",
                "{what}"
            );
            let raw = server.get_bytes(&key).unwrap_or_default();
            let stored = String::from_utf8_lossy(&raw).trim().to_owned();
            let ttl = pttl(&server, &key);
            let now = redis_now_us(&server) as f64;
            match limit {
                "fixed" => {
                    assert_eq!(stored, "1", "{what}");
                    assert!(ttl > 0 && ttl <= 600_000, "{what}: PTTL {ttl}");
                }
                "sliding" => {
                    let parts: Vec<&str> = stored.split(' ').collect();
                    assert_eq!(parts.len(), 3, "{what}: {stored}");
                    assert_eq!((parts[1], parts[2]), ("1", "0"), "{what}: {stored}");
                    assert!(ttl > 0 && ttl <= 1_200_000, "{what}: PTTL {ttl}");
                }
                _ => {
                    // One token of 5 at 5/h taken from a full bucket: the
                    // TAT is 12 minutes ahead.
                    let tat = fleetlimit::store::RedisStore::read_tat(&raw)
                        .unwrap_or_else(|| panic!("{what}: {raw:?}"));
                    assert!(
                        tat > now + 700e6 && tat <= now + 720e6,
                        "{what}: TAT {tat}, now {now}"
                    );
                    assert!(ttl > 700_000 && ttl <= 722_001, "{what}: PTTL {ttl}");
                }
            }
        }
    }
    let stats = layer.breaker().unwrap();
    assert_eq!((stats.opened, stats.failures), (0, 0), "{stats:?}");
    server.assert_every_key_expires(&prefix);
}

/// A TAT further ahead than this limit's burst, but backed by the key's
/// expiry (written when the limit had a larger burst): kept, so lowering a
/// limit does not forgive what was spent.
#[tokio::test]
async fn a_far_tat_backed_by_its_expiry_is_kept() {
    let server = RedisServer::start();
    let prefix = prefix("poison-far");
    let cfg = redis_config(&server, &prefix, "2s", ALGORITHMS);
    let app = Router::new()
        .route("/lean", get(|| async { "ok" }))
        .route("/general", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(cfg).await.unwrap());
    for (path, limit) in [("/lean", "lean"), ("/general", "general")] {
        let key = key_made_by(&app, &server, &prefix, limit, path, "spent").await;
        // Two hours ahead (a burst spans one), expiring just after it, as a
        // write under a 10-token burst would leave it.
        let tat = redis_now_us(&server) + 7_200_000_000;
        let at = (tat.div_ceil(1_000_000) * 1000 + 1).to_string();
        poison(&server, &key, Some(&tat.to_string()), &["PXAT", &at]);
        let res = send(
            &app,
            request("GET", path, "127.0.0.1:1", &[("x-account", "spent")]),
        )
        .await;
        assert_eq!(res.status(), 429, "{path}");
        assert_eq!(
            server.cli(&["GET", &key]).unwrap().trim(),
            tat.to_string(),
            "{path}: the state stays"
        );
    }
}

const TWO_LIMITS: &str = r#"
refused_cache_keys = 0

[limits.tokens]
key = "account:x-account"
capacity = 5
refill = "5/h"

[limits.once]
key = "account:x-account"
algorithm = "fixed-window"
limit = 1
window = "10min"

[[routes]]
path = "/"
limits = ["tokens", "once"]
on_redis_error = "closed"
"#;

/// All or nothing in the general script: when the second limit refuses,
/// the first is not charged, whether its key was valid or poisoned.
#[tokio::test]
async fn a_refused_request_is_charged_nowhere() {
    let server = RedisServer::start();
    let prefix = prefix("poison-refused");
    let cfg = redis_config(&server, &prefix, "2s", TWO_LIMITS);
    let layer = RateLimitLayer::new(cfg).await.unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    let tokens = key_made_by(&app, &server, &prefix, "tokens", "/", "acct").await;
    let once: Vec<String> = keys_of(&server, &prefix, "once").into_iter().collect();
    let [once] = once.as_slice() else {
        panic!("{once:?}")
    };
    let tat = server.get_bytes(&tokens).unwrap();

    let hit = || {
        send(
            &app,
            request("GET", "/", "127.0.0.1:1", &[("x-account", "acct")]),
        )
    };
    let res = hit().await;
    assert_eq!(res.status(), 429);
    assert_eq!(
        server.get_bytes(&tokens).unwrap(),
        tat,
        "charged on a refusal"
    );

    // The first limit's key poisoned: a full bucket, still not charged.
    poison(&server, &tokens, None, &[]);
    let res = hit().await;
    assert_eq!(res.status(), 429);
    assert_eq!(server.cli(&["EXISTS", &tokens]).unwrap().trim(), "0");
    assert_eq!(server.cli(&["GET", once]).unwrap().trim(), "1");
    let stats = layer.breaker().unwrap();
    assert_eq!(stats.failures, 0, "{stats:?}");
}

/// Defence in depth: a check whose numbers Redis refuses (here a refill so
/// slow that its expiry is no integer) fails alone; the checks coalesced
/// with it are decided, each charged once.
#[tokio::test]
async fn a_failing_check_does_not_fail_its_batch() {
    let server = RedisServer::start();
    let store = server
        .coalescing_store(std::time::Duration::from_secs(2))
        .await;
    let bucket = |key: &str, refill_per_sec: f64| Check {
        slot: None,
        cost: 1.0,
        buckets: vec![Bucket {
            key: key.into(),
            rule: Rule::TokenBucket {
                capacity: 5.0,
                refill_per_sec,
            },
            shadow: false,
        }],
    };
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    // The first check finds the store idle and makes a call of its own;
    // the other eight, queued behind it before the batcher runs, are one
    // batch.
    let futures: Vec<StoreFuture> = (0..9)
        .map(|i| {
            if i == 4 {
                store.check(&bucket("bad", 1e-300))
            } else {
                store.check(&bucket(&format!("good-{i}"), 1.0 / 3600.0))
            }
        })
        .collect();
    let mut answers = Vec::new();
    for f in futures {
        answers.push(f.await);
    }
    for (i, a) in answers.iter().enumerate() {
        if i == 4 {
            assert!(matches!(a, Err(StoreError::Script(_))), "{a:?}");
        } else {
            let o = a.as_ref().unwrap_or_else(|e| panic!("check {i}: {e}"));
            assert!(o.allowed, "check {i}");
            // Charged once: 4 left, plus under 0.1 refilled (1/h) unless
            // the test took six minutes.
            let left = tokens(&server, &format!("good-{i}"), 5.0, 1.0 / 3600.0);
            assert!((4.0..4.1).contains(&left), "check {i}: {left} tokens left");
        }
    }
    // The first check's own call; in the batch, the call that stopped at
    // the bad check, then one for the rest.
    assert_eq!(server.script_calls(), 3);
}

/// A store whose checks of one key fail with a script error (as a key's
/// data would make them), all others going to Redis.
#[derive(Debug)]
struct OneBadKey {
    redis: RedisStore,
    bad: &'static str,
}

impl Store for OneBadKey {
    fn check(&self, check: &Check) -> StoreFuture {
        if check.buckets.iter().any(|b| b.key.contains(self.bad)) {
            return Box::pin(async {
                Err(StoreError::Script(
                    "WRONGTYPE Operation against a key holding the wrong kind of value".into(),
                ))
            });
        }
        self.redis.check(check)
    }
}

/// Script errors are not availability errors: a stream of them for one key
/// opens no breaker, and other keys keep their Redis decisions.
#[tokio::test]
async fn script_errors_do_not_open_the_breaker() {
    let server = RedisServer::start();
    let prefix = prefix("poison-breaker");
    let cfg = redis_config(&server, &prefix, "2s", SIGN_IN);
    let redis = server
        .store(
            std::time::Duration::from_secs(2),
            std::time::Duration::from_secs(5),
            false,
        )
        .await;
    let store = Arc::new(OneBadKey {
        redis,
        bad: "broken",
    });
    let layer = RateLimitLayer::with_store(cfg, store).await.unwrap();
    let app = Router::new()
        .route("/sign-in", post(|| async { "ok" }))
        .layer(layer.clone());
    for _ in 0..20 {
        let res = send(
            &app,
            request(
                "POST",
                "/sign-in",
                "127.0.0.1:1",
                &[("x-account", "broken")],
            ),
        )
        .await;
        // The key's own answer is the route's policy (closed).
        assert_eq!(res.status(), 503);
    }
    for i in 0..20 {
        let res = send(
            &app,
            request(
                "POST",
                "/sign-in",
                "127.0.0.1:1",
                &[("x-account", &format!("fine-{i}"))],
            ),
        )
        .await;
        assert_eq!(res.status(), 200, "request {i}");
        assert!(header(&res, "x-ratelimit-remaining").is_some());
    }
    let stats = layer.breaker().unwrap();
    assert_eq!((stats.opened, stats.failures), (0, 0), "{stats:?}");
}
