//! fleetlimit concurrency example: a slow endpoint whose requests in flight
//! are capped per API key, over the whole fleet.
//!
//! ```text
//! cargo run --example concurrency                      # in-process slots
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example concurrency
//! curl -i -H 'x-api-key: demo' 'http://127.0.0.1:3000/search?ms=2000'
//! ```
//!
//! `GET /search?ms=N` answers after N ms (2000 by default): six of them at
//! once with one key, and the sixth is refused with `429` and a
//! `Retry-After` until one of the five ends. `FLEETLIMIT_ADDR` sets the
//! address (default `127.0.0.1:3000`); the config path is the first
//! argument, else `FLEETLIMIT_CONFIG`, else the bundled
//! `examples/concurrency.toml`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::RawQuery;
use axum::routing::get;
use fleetlimit::{Config, RateLimitLayer};

/// A search that takes `ms` milliseconds (the query's `ms=N`).
async fn search(RawQuery(query): RawQuery) -> String {
    let ms = query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("ms=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    format!("search results after {ms} ms\n")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        // Colour for a terminal only: not escape codes in a file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "fleetlimit=info".into()),
        )
        .init();

    let path = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("FLEETLIMIT_CONFIG").ok())
        .unwrap_or_else(|| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/concurrency.toml").to_owned()
        });
    let mut cfg = Config::from_toml_file(&path)?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        cfg = cfg.try_with_redis_url(url)?;
    }
    let store = match cfg.redis_url() {
        Some(url) => format!("Redis at {}", fleetlimit::redact_url(url)),
        None => "the in-process store (set REDIS_URL to use Redis)".to_owned(),
    };

    let app = Router::new()
        .route("/search", get(search))
        .layer(RateLimitLayer::new(cfg).await?);

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit concurrency example on http://{} using {store}",
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
