//! The embedded default: with no Redis configured the same layer limits
//! from in-process buckets. Local logic, so the clock is tokio's paused one.

use crate::support;

use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use fleetlimit::{Account, Config, RateLimitLayer};
use support::*;

const CONFIG: &str = r#"
[limits.per-key]
key = "header:x-api-key"
on_missing = "ip"
capacity = 5
refill = "1/s"

[limits.per-account]
key = "account:x-account"
capacity = 3
refill = "3/min"

[[routes]]
path = "/"
methods = ["GET"]
limits = ["per-key"]

[[routes]]
path = "/sign-in"
methods = ["POST"]
limits = ["per-account"]

[[routes]]
path = "/search"
limits = ["per-key"]
cost = 2
"#;

async fn app() -> Router {
    let cfg = Config::from_toml_str(CONFIG).unwrap();
    assert!(cfg.redis_url().is_none());
    Router::new()
        .route("/", get(|| async { "ok" }).post(|| async { "posted" }))
        .route("/sign-in", post(|| async { "welcome" }))
        .route("/search", get(|| async { "results" }))
        .layer(RateLimitLayer::new(cfg).await.unwrap())
}

#[tokio::test(start_paused = true)]
async fn admits_refuses_and_refills_on_the_clock() {
    let app = app().await;
    let req = || request("GET", "/", "127.0.0.1:1", &[("x-api-key", "k")]);
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let res = send(&app, req()).await;
        assert_eq!(res.status(), 200);
        remaining.push(header_u64(&res, "x-ratelimit-remaining"));
    }
    assert_eq!(remaining, [4, 3, 2, 1, 0]);
    let refused = send(&app, req()).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(header_u64(&refused, "retry-after"), 1);
    assert_eq!(header_u64(&refused, "x-ratelimit-reset"), 5);

    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(
        send(&app, req()).await.status(),
        429,
        "not a whole token yet"
    );
    tokio::time::advance(Duration::from_millis(2)).await;
    assert_eq!(send(&app, req()).await.status(), 200);
    tokio::time::advance(Duration::from_secs(60)).await;
    let full = send(&app, req()).await;
    assert_eq!(
        header_u64(&full, "x-ratelimit-remaining"),
        4,
        "refill is capped at capacity"
    );
}

#[tokio::test(start_paused = true)]
async fn cost_and_methods() {
    let app = app().await;
    let search = || request("GET", "/search", "127.0.0.1:1", &[("x-api-key", "c")]);
    // Whole searches of 2 left: 3 tokens are one, 1 token is none.
    let r = send(&app, search()).await;
    assert_eq!(header_u64(&r, "x-ratelimit-remaining"), 1);
    assert_eq!(header_u64(&r, "x-ratelimit-limit"), 2);
    let r = send(&app, search()).await;
    assert_eq!(header_u64(&r, "x-ratelimit-remaining"), 0);
    let r = send(&app, search()).await;
    assert_eq!(r.status(), 429, "1 token left, the search costs 2");
    // POST / is not the limited GET / route and there is no default.
    for _ in 0..10 {
        let r = send(
            &app,
            request("POST", "/", "127.0.0.1:1", &[("x-api-key", "c")]),
        )
        .await;
        assert_eq!(r.status(), 200);
        assert!(header(&r, "x-ratelimit-limit").is_none());
    }
}

#[tokio::test(start_paused = true)]
async fn the_account_extension_wins_over_the_header() {
    let app = app().await;
    let sign_in = |ext: Option<&str>, hdr: &str| {
        let mut r = request("POST", "/sign-in", "127.0.0.1:1", &[("x-account", hdr)]);
        if let Some(a) = ext {
            r.extensions_mut().insert(Account::new(a));
        }
        r
    };
    // Three attempts for "alice" via the extension, whatever the header says.
    for i in 0..3 {
        assert_eq!(
            send(&app, sign_in(Some("alice"), &format!("h{i}")))
                .await
                .status(),
            200
        );
    }
    assert_eq!(send(&app, sign_in(Some("alice"), "h9")).await.status(), 429);
    // Without the extension the header is the account.
    assert_eq!(send(&app, sign_in(None, "bob")).await.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn missing_api_key_falls_back_to_ip() {
    let app = app().await;
    let anon = |peer: &str| request("GET", "/", peer, &[]);
    for _ in 0..5 {
        assert_eq!(send(&app, anon("192.0.2.1:1")).await.status(), 200);
    }
    assert_eq!(send(&app, anon("192.0.2.1:2")).await.status(), 429);
    assert_eq!(
        send(&app, anon("192.0.2.2:1")).await.status(),
        200,
        "another IP"
    );
    // IPv6 clients are grouped by /64.
    for i in 0..5 {
        assert_eq!(
            send(&app, anon(&format!("[2001:db8:0:1::{i}]:1")))
                .await
                .status(),
            200
        );
    }
    assert_eq!(
        send(&app, anon("[2001:db8:0:1:ffff::1]:1")).await.status(),
        429,
        "same /64"
    );
}
