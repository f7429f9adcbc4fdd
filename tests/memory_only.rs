//! A build without the `redis` feature: the in-process store decides, and a
//! configuration that asks for Redis is refused where it says so.
#![cfg(not(feature = "redis"))]

use crate::support;

use axum::Router;
use axum::routing::get;
use fleetlimit::{Config, RateLimitLayer};
use support::{request, send};

const LIMITS: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 2
refill = "1/min"

[[routes]]
path = "/"
limits = ["per-key"]
"#;

#[test]
fn a_redis_section_is_a_configuration_error_naming_the_feature() {
    let toml = format!("[redis]\nurl = \"redis://127.0.0.1:6379\"\n{LIMITS}");
    let err = Config::from_toml_str(&toml).unwrap_err().to_string();
    assert!(err.contains("line 2"), "{err}");
    assert!(err.contains("feature `redis`"), "{err}");
}

/// Checked when the new configuration is made, as the file's `url` is.
#[test]
fn a_redis_url_set_in_code_fails_the_build_not_a_request() {
    let err = Config::from_toml_str(LIMITS)
        .unwrap()
        .try_with_redis_url("redis://127.0.0.1:6379")
        .unwrap_err()
        .to_string();
    assert!(err.contains("feature `redis`"), "{err}");
}

#[tokio::test]
async fn the_in_process_store_decides() {
    let cfg = Config::from_toml_str(LIMITS).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(cfg).await.unwrap());
    let req = || request("GET", "/", "10.0.0.1:1000", &[("x-api-key", "k1")]);
    let codes = [
        send(&app, req()).await.status(),
        send(&app, req()).await.status(),
        send(&app, req()).await.status(),
    ];
    assert_eq!(codes.map(|c| c.as_u16()), [200, 200, 429]);
    let other = send(
        &app,
        request("GET", "/", "10.0.0.1:1000", &[("x-api-key", "k2")]),
    )
    .await;
    assert_eq!(other.status(), 200);
}
