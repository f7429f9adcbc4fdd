//! fleetlimit configured in code, without a TOML file: the same limits,
//! routes and failure policies as the file would give, checked by the same
//! `build()`.
//!
//! ```text
//! cargo run --example builder
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example builder
//! curl -i -H 'x-api-key: demo' http://127.0.0.1:3000/api
//! ```
//!
//! `FLEETLIMIT_ADDR` sets the address (default `127.0.0.1:3000`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use fleetlimit::configuration::{FailurePolicy, KeySource, LimitConfig, Rate, RouteConfig};
use fleetlimit::{Config, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = Config::builder()
        .deadline(Duration::from_millis(5))
        .fleet_size(2)
        // 10 requests at once, then 1 a second, per API key (no key: per IP).
        .limit(
            "per-key",
            LimitConfig::token_bucket(KeySource::header("x-api-key"), 10, Rate::per_second(1))
                .missing_by_ip(),
        )
        // And at most 100 a day per key, counted in calendar windows.
        .limit(
            "daily",
            LimitConfig::fixed_window(
                KeySource::header("x-api-key"),
                100,
                Duration::from_secs(86_400),
            )
            .missing_by_ip(),
        )
        // Exports: 3 per client IP in any sliding minute.
        .limit(
            "exports",
            LimitConfig::sliding_window(KeySource::ClientIp, 3, Duration::from_secs(60)),
        )
        .route(
            "/api",
            RouteConfig::new(["per-key", "daily"]).on_redis_error(FailurePolicy::Local),
        )
        .route(
            "/export",
            RouteConfig::new(["exports"]).on_redis_error(FailurePolicy::Closed),
        );
    if let Ok(url) = std::env::var("REDIS_URL") {
        cfg = cfg.redis_url(url);
    }
    let cfg = cfg.build()?;
    let store = match cfg.redis_url() {
        Some(url) => format!("Redis at {}", fleetlimit::redact_url(url)),
        None => "the in-process store (set REDIS_URL to use Redis)".to_owned(),
    };

    let app = Router::new()
        .route("/api", get(|| async { "api\n" }))
        .route("/export", get(|| async { "export.csv\n" }))
        .layer(RateLimitLayer::new(cfg).await?);

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit builder example on http://{} using {store}",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
