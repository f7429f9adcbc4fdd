//! The configuration bounds on a real Redis: a limit at the edge of what
//! validation accepts still decides exactly, and a request that fits
//! exactly is admitted whatever the scripts' ¼ µs rounding does.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use axum::Router;
use axum::routing::get;
use fleetlimit::RateLimitLayer;
use support::*;

/// Routes `/{name}` for each name, answering "ok", behind `cfg`'s layer.
async fn app(cfg: fleetlimit::Config, paths: &[&str]) -> Router {
    support::ok_routes(RateLimitLayer::new(cfg).await.unwrap(), paths)
}

fn get_as(path: &str, key: &str) -> http::Request<axum::body::Body> {
    request("GET", path, "127.0.0.1:1", &[("x-api-key", key)])
}

const DAY: u64 = 86_400;
/// The longest span a bucket may have: 3650 days.
const SPAN: u64 = 3650 * DAY;

#[tokio::test]
async fn the_largest_allowed_span_decides_exactly() {
    let server = RedisServer::start();
    let prefix = prefix("edge");
    // 3650 tokens, one a day: 10 years to fill, the most validation allows.
    // `/all` takes the whole bucket; `/both` adds a second limit, so it runs
    // the general script instead of the lean one.
    let cfg = redis_config(
        &server,
        &prefix,
        "500ms",
        r#"
[limits.decade]
key = "header:x-api-key"
capacity = 3650
refill = "1/d"

[limits.roomy]
key = "header:x-api-key"
capacity = 4000
refill = "1000/s"

[[routes]]
path = "/all"
limits = ["decade"]
cost = 3650
on_redis_error = "closed"

[[routes]]
path = "/one"
limits = ["decade"]
on_redis_error = "closed"

[[routes]]
path = "/both-all"
limits = ["decade", "roomy"]
cost = 3650
on_redis_error = "closed"

[[routes]]
path = "/both-one"
limits = ["decade", "roomy"]
on_redis_error = "closed"
"#,
    );
    let app = app(cfg, &["/all", "/one", "/both-all", "/both-one"]).await;
    for (all, one, key) in [
        ("/all", "/one", "lean"),
        ("/both-all", "/both-one", "general"),
    ] {
        // The whole bucket at once: admitted, nothing left, full in 10 years
        // (a full bucket holds one such request).
        let res = send(&app, get_as(all, key)).await;
        assert_eq!(res.status(), 200, "{all}");
        assert_eq!(header_u64(&res, "x-ratelimit-limit"), 1, "{all}");
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 0, "{all}");
        assert_eq!(header_u64(&res, "x-ratelimit-reset"), SPAN, "{all}");
        // One more token: a day away (less the milliseconds since).
        let res = send(&app, get_as(one, key)).await;
        assert_eq!(res.status(), 429, "{one}");
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 0, "{one}");
        assert_eq!(header_u64(&res, "retry-after"), DAY, "{one}");
        let reset = header_u64(&res, "x-ratelimit-reset");
        assert!((SPAN - 1..=SPAN).contains(&reset), "{one}: reset {reset}");
    }
    // The keys expire when their buckets are full again: in 10 years (PXAT
    // at the end of the second after that one, plus 1 ms).
    let keys = server.keys_with_pttl(&prefix);
    let decade: Vec<i64> = keys
        .iter()
        .filter(|(k, _)| k.contains(":decade:"))
        .map(|&(_, pttl)| pttl)
        .collect();
    assert_eq!(decade.len(), 2, "{keys:?}");
    for pttl in decade {
        let ms = SPAN as i64 * 1000;
        assert!((ms - 5_000..=ms + 2_001).contains(&pttl), "PTTL {pttl}");
    }
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn a_request_that_fits_exactly_is_admitted_whatever_the_rounding() {
    let server = RedisServer::start();
    let prefix = prefix("exact-fit");
    // A token every 2/3 s: 666666.67 µs, which the lean script's ¼ µs
    // arithmetic rounds up (so a full bucket of one token looked 0.08 µs
    // short); every 1/3 s, 333333.33 µs, which the general script rounds
    // down (0.99999975 tokens in a full bucket). Both refused every request
    // for ever; the in-process store admits the first.
    let cfg = redis_config(
        &server,
        &prefix,
        "500ms",
        r#"
[limits.two-thirds]
key = "header:x-api-key"
capacity = 1
refill = "3/2s"

[limits.third]
key = "header:x-api-key"
capacity = 1
refill = "3/s"

[limits.roomy]
key = "header:x-api-key"
capacity = 100
refill = "100/s"

[[routes]]
path = "/lean"
limits = ["two-thirds"]
on_redis_error = "closed"

[[routes]]
path = "/general"
limits = ["third", "roomy"]
on_redis_error = "closed"
"#,
    );
    let app = app(cfg.clone(), &["/lean", "/general"]).await;
    let local = app_without_redis(cfg).await;
    for path in ["/general", "/lean"] {
        for (store, app) in [("redis", &app), ("memory", &local)] {
            let res = send(app, get_as(path, "fits")).await;
            assert_eq!(
                res.status(),
                200,
                "{store} {path}: a full bucket of one token"
            );
            assert_eq!(
                header_u64(&res, "x-ratelimit-remaining"),
                0,
                "{store} {path}"
            );
            // Its one token is spent: the next is refused until it refills.
            let res = send(app, get_as(path, "fits")).await;
            assert_eq!(res.status(), 429, "{store} {path}");
            assert_eq!(
                header_u64(&res, "x-ratelimit-remaining"),
                0,
                "{store} {path}"
            );
            assert_eq!(header_u64(&res, "retry-after"), 1, "{store} {path}");
        }
    }
}

async fn app_without_redis(cfg: fleetlimit::Config) -> Router {
    app(cfg.without_redis(), &["/lean", "/general"]).await
}

/// The cost in `?cost=N`.
fn cost_of(req: &fleetlimit::RequestRef<'_>) -> u32 {
    req.uri()
        .query()
        .and_then(|q| q.strip_prefix("cost="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

#[tokio::test]
async fn any_computed_cost_is_answered_without_a_wrong_charge() {
    let server = RedisServer::start();
    let prefix = prefix("any-cost");
    // A cost function may answer any u32: far beyond what the bounds allow a
    // configured cost (the capacity). On the largest span, u32::MAX tokens
    // would be 3.7e20 µs: a check must neither overflow nor charge it.
    let cfg = redis_config(
        &server,
        &prefix,
        "500ms",
        r#"
[limits.decade]
key = "header:x-api-key"
capacity = 3650
refill = "1/d"

[limits.watched]
key = "header:x-api-key"
capacity = 3650
refill = "1/d"
mode = "shadow"

[[routes]]
path = "/enforced"
limits = ["decade"]
on_redis_error = "closed"

[[routes]]
path = "/shadow"
limits = ["watched"]
on_redis_error = "closed"
"#,
    );
    for (store, cfg) in [("redis", cfg.clone()), ("memory", cfg.without_redis())] {
        let layer = RateLimitLayer::new(cfg)
            .cost_fn("/enforced", cost_of)
            .cost_fn("/shadow", cost_of)
            .await
            .unwrap();
        let app = Router::new()
            .route("/enforced", get(|| async { "ok" }))
            .route("/shadow", get(|| async { "ok" }))
            .layer(layer);
        let huge = format!("?cost={}", u32::MAX);
        let key = format!("{store}-k");
        // Enforced: more than it can ever hold, 413, nothing taken.
        let res = send(&app, get_as(&format!("/enforced{huge}"), &key)).await;
        assert_eq!(res.status(), 413, "{store}");
        // Shadow: never refused, and not charged either (it has no room).
        let res = send(&app, get_as(&format!("/shadow{huge}"), &key)).await;
        assert_eq!(res.status(), 200, "{store}");
        for path in ["/enforced", "/shadow"] {
            let res = send(&app, get_as(&format!("{path}?cost=1"), &key)).await;
            assert_eq!(res.status(), 200, "{store} {path}");
            assert_eq!(
                header_u64(&res, "x-ratelimit-remaining"),
                3649,
                "{store} {path}: only this request's token was taken"
            );
        }
    }
    server.assert_every_key_expires(&prefix);
}
