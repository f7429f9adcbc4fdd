//! fleetlimit metrics: the limiter's counters on `/metrics`, in the
//! Prometheus text format (feature `metrics`; docs/metrics.md lists them).
//!
//! ```text
//! cargo run --example metrics --features metrics                 # in-process buckets
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example metrics --features metrics
//! curl -i -H 'x-api-key: demo' http://127.0.0.1:3000/
//! curl http://127.0.0.1:3000/metrics
//! ```
//!
//! `FLEETLIMIT_ADDR` sets the address (default `127.0.0.1:3000`); the config
//! path is the first argument, else `FLEETLIMIT_CONFIG`, else the bundled
//! `examples/metrics.toml`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use fleetlimit::{Config, RateLimitLayer};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

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

    // The recorder first: the layer registers its handles with the
    // recorder installed when it is built and first used.
    let prometheus = PrometheusBuilder::new()
        // A Prometheus histogram (buckets), not a summary, for store calls:
        // ~0.1 ms to the 5 ms default deadline and beyond.
        .set_buckets_for_metric(
            Matcher::Full("fleetlimit_store_call_duration_seconds".into()),
            &[
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
            ],
        )?
        .install_recorder()?;
    // The exporter's own housekeeping (it has no task of its own here).
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });

    let path = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("FLEETLIMIT_CONFIG").ok())
        .unwrap_or_else(|| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/metrics.toml").to_owned()
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
        .route("/", get(|| async { "hello from fleetlimit\n" }))
        .route("/checkout", get(|| async { "checked out\n" }))
        .route("/search", get(|| async { "search results\n" }))
        // Not listed in the configuration: never limited.
        .route("/metrics", get(move || async move { prometheus.render() }))
        .layer(RateLimitLayer::new(cfg).await?);

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit metrics example on http://{} using {store}; scrape /metrics",
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
