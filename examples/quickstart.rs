//! fleetlimit quickstart: an axum server with three rate-limited routes.
//!
//! ```text
//! cargo run --example quickstart                      # in-process buckets
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart
//! curl -i -H 'x-api-key: demo' http://127.0.0.1:3000/
//! ```
//!
//! `FLEETLIMIT_ADDR` sets the address (default `127.0.0.1:3000`); the config
//! path is the first argument, else `FLEETLIMIT_CONFIG`, else the bundled
//! `examples/quickstart.toml`.

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::Router;
use fleetlimit::{Config, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "fleetlimit=info".into()),
        )
        .init();

    let path = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("FLEETLIMIT_CONFIG").ok())
        .unwrap_or_else(|| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/quickstart.toml").to_owned()
        });
    let mut cfg = Config::from_toml_file(&path)?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        cfg = cfg.with_redis_url(url);
    }
    let store = match cfg.redis_url() {
        Some(url) => format!("Redis at {}", fleetlimit::redact_url(url)),
        None => "the in-process store (set REDIS_URL to use Redis)".to_owned(),
    };

    let app = Router::new()
        .route("/", get(|| async { "hello from fleetlimit\n" }))
        .route("/sign-in", post(|| async { "signed in\n" }))
        .route("/search", get(|| async { "search results\n" }))
        .layer(RateLimitLayer::new(cfg).await?);

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit quickstart on http://{} using {store}",
        listener.local_addr()?
    );
    println!("config: {path}");
    // ConnectInfo gives the limiter each client's address.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
