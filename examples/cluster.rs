//! fleetlimit on a Redis Cluster: one route limited per tenant and for
//! everyone together (see `examples/cluster.toml`).
//!
//! ```text
//! REDIS_URL='redis-cluster://127.0.0.1:7000' cargo run --example cluster
//! curl -i -H 'x-tenant: acme' http://127.0.0.1:3000/
//! ```
//!
//! `FLEETLIMIT_ADDR` sets the address (default `127.0.0.1:3000`); the
//! config path is the first argument, else the bundled `cluster.toml`.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use fleetlimit::{Config, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/cluster.toml").to_owned()
    });
    let mut cfg = Config::from_toml_file(&path)?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        cfg = cfg.try_with_redis_url(url)?;
    }
    // A Redis that is down at start-up is no error: the pool keeps
    // reconnecting and the route's on_redis_error answers meanwhile.
    let layer = RateLimitLayer::new(cfg.clone()).await?;
    let app = Router::new()
        .route("/", get(|| async { "hello from the cluster\n" }))
        .layer(layer);

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit cluster example on http://{} using {}",
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
