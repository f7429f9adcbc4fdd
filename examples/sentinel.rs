//! fleetlimit behind Redis Sentinel: one route limited per API key, which
//! keeps limiting through a failover (see `examples/sentinel.toml`).
//!
//! ```text
//! REDIS_URL='redis-sentinel://127.0.0.1:26379?sentinelServiceName=mymaster' cargo run --example sentinel
//! curl -i -H 'x-api-key: demo' http://127.0.0.1:3000/
//! ```
//!
//! `FLEETLIMIT_ADDR` sets the address (default `127.0.0.1:3000`); the
//! config path is the first argument, else the bundled `sentinel.toml`.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use fleetlimit::{Config, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/sentinel.toml").to_owned()
    });
    let mut cfg = Config::from_toml_file(&path)?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        cfg = cfg.try_with_redis_url(url)?;
    }
    // A Redis that is down at start-up is no error: the pool keeps
    // reconnecting and the route's on_redis_error answers meanwhile.
    let layer = RateLimitLayer::new(cfg.clone()).await?;
    let app = Router::new()
        .route("/", get(|| async { "hello from behind Sentinel\n" }))
        .layer(layer);

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit sentinel example on http://{} using {}",
        listener.local_addr()?,
        fleetlimit::redact_url(cfg.redis_url().unwrap_or("no Redis"))
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
