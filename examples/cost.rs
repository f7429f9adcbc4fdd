//! Requests that cost more than one: `GET /search?pages=N` spends N tokens
//! (a cost function reads the query), `GET /export` a fixed 5 from the
//! policy.
//!
//! ```text
//! cargo run --example cost
//! curl -i -H 'x-api-key: demo' 'http://127.0.0.1:3000/search?pages=4'
//! curl -i -H 'x-api-key: demo' 'http://127.0.0.1:3000/export'
//! ```
//!
//! `FLEETLIMIT_ADDR` sets the address (default `127.0.0.1:3000`);
//! `REDIS_URL` puts the buckets in Redis.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use fleetlimit::{Config, RateLimitLayer};

const POLICY: &str = r#"
[limits.per-key]
key = "header:x-api-key"
capacity = 10
refill = "10/min"

[[routes]]
path = "/search"
limits = ["per-key"]          # cost: from the cost function below

[[routes]]
path = "/export"
limits = ["per-key"]
cost = 5
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = Config::from_toml_str(POLICY)?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        cfg = cfg.try_with_redis_url(url)?;
    }
    let layer = RateLimitLayer::new(cfg)
        // ?pages=N costs N (1 without it, and 0 counts as 1). A cost above
        // the capacity (10) is answered 413 without charging anything.
        .cost_fn("/search", |req| {
            req.uri()
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("pages=")))
                .and_then(|n| n.parse().ok())
                .unwrap_or(1)
        })
        .await?;
    let app = Router::new()
        .route("/search", get(|| async { "results\n" }))
        .route("/export", get(|| async { "export.csv\n" }))
        .layer(layer);

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit cost example on http://{}",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
