//! Plans: a caller's numbers follow its plan within the cache TTL, and its
//! usage so far is kept across an upgrade or a downgrade.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use fleetlimit::RateLimitLayer;
use fleetlimit::plan::PlanResolver;
use std::future::Future;
use std::pin::Pin;

use support::*;

/// What a resolver's lookup fails with: any error, boxed.
type PlanError = Box<dyn std::error::Error + Send + Sync>;

const LIMITS: &str = r#"
[limits.api]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 100
window = "60s"

[plans.basic.api]
limit = 100

[plans.pro.api]
limit = 500

[plan_assignments]
"static-pro-key" = "pro"

[plan_cache]
ttl = "200ms"

[[routes]]
path = "/"
limits = ["api"]
on_redis_error = "closed"
"#;

/// The user's database, in miniature.
#[derive(Clone, Default)]
struct Accounts(Arc<Mutex<HashMap<String, String>>>);

impl PlanResolver for Accounts {
    fn resolve<'a>(
        &'a self,
        key: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<String>, PlanError>> + Send + 'a>> {
        let plan = self.0.lock().unwrap().get(key).cloned();
        Box::pin(async move { Ok(plan) })
    }
}

async fn admitted(app: &Router, key: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let res = send(
            app,
            request("GET", "/", "127.0.0.1:1", &[("x-api-key", key)]),
        )
        .await;
        let s = res.status().as_u16();
        assert!(s == 200 || s == 429, "{s}");
        ok += usize::from(s == 200);
    }
    ok
}

#[tokio::test]
async fn upgrade_raises_the_ceiling_and_downgrade_does_not_forgive() {
    let server = RedisServer::start();
    let prefix = prefix("plans");
    let cfg = redis_config(&server, &prefix, "500ms", LIMITS);
    let accounts = Accounts::default();
    accounts
        .0
        .lock()
        .unwrap()
        .insert("k".into(), "basic".into());
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(cfg)
            .plan_resolver(accounts.clone())
            .await
            .unwrap(),
    );

    assert_eq!(admitted(&app, "k", 120).await, 100, "basic: 100 per window");

    // Upgrade mid-window: within the cache TTL the ceiling is 500, and the
    // 100 already used still count.
    accounts.0.lock().unwrap().insert("k".into(), "pro".into());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let res = send(
        &app,
        request("GET", "/", "127.0.0.1:1", &[("x-api-key", "k")]),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(header_u64(&res, "x-ratelimit-limit"), 500);
    assert_eq!(header_u64(&res, "x-ratelimit-remaining"), 399);
    assert_eq!(
        admitted(&app, "k", 450).await,
        399,
        "pro: 500 in the same window, counting the 101"
    );

    // Downgrade: back to 100, and the 500 used are not forgiven.
    accounts
        .0
        .lock()
        .unwrap()
        .insert("k".into(), "basic".into());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let res = send(
        &app,
        request("GET", "/", "127.0.0.1:1", &[("x-api-key", "k")]),
    )
    .await;
    assert_eq!(res.status(), 429);
    assert_eq!(header_u64(&res, "x-ratelimit-limit"), 100);
    assert!(
        header_u64(&res, "retry-after") > 50,
        "until the window ends"
    );

    // The static table works without a resolver call.
    assert_eq!(admitted(&app, "static-pro-key", 150).await, 150);
    // An unknown caller gets the limit's base numbers.
    assert_eq!(admitted(&app, "nobody", 120).await, 100);
    server.assert_every_key_expires(&prefix);
}

/// A resolver that fails (the database is down): every request gets the
/// base numbers, none a 500, and the error is logged — not as "no plan".
#[tokio::test(flavor = "current_thread")]
async fn a_failing_resolver_gives_the_base_numbers_and_is_logged() {
    async fn database_down(_key: String) -> Result<Option<String>, PlanError> {
        Err("connection refused".into())
    }
    let server = RedisServer::start();
    let prefix = prefix("plans-down");
    let cfg = redis_config(&server, &prefix, "500ms", LIMITS);
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(cfg)
            .plan_resolver(database_down)
            .await
            .unwrap(),
    );
    let (ok, logs) = logged(admitted(&app, "k", 120)).await;
    assert_eq!(ok, 100, "the base numbers: 100 per window");
    assert!(
        logs.contains("plan resolver failed") && logs.contains("connection refused"),
        "{logs}"
    );
    // The static table still answers.
    assert_eq!(admitted(&app, "static-pro-key", 120).await, 120);
}
