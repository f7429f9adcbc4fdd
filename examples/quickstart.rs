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
//! `examples/quickstart.toml`. Edit the file and `kill -HUP <pid>`: the new
//! limits apply from the next request, without a restart (a file with an
//! error is reported and the running limits kept). The file is read off
//! the runtime's workers under a timeout, once it has stopped changing; a
//! file that would limit nothing or remove more than half of the limits
//! and routes (an empty or half-written one) is refused: `kill -USR1
//! <pid>` applies it anyway.

use std::io::IsTerminal;
use std::net::SocketAddr;

use axum::Router;
use axum::routing::{get, post};
use fleetlimit::{Config, ConfigError, RateLimitLayer};

/// The configuration on Redis when `REDIS_URL` is set, its URL checked as
/// the file's would be.
fn on_env_redis(cfg: Config) -> Result<Config, ConfigError> {
    match std::env::var("REDIS_URL") {
        Ok(url) => cfg.try_with_redis_url(url),
        Err(_) => Ok(cfg),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        // Colour for a terminal only: not escape codes in a file or a pipe.
        .with_ansi(std::io::stdout().is_terminal())
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
    let cfg = on_env_redis(Config::from_toml_file(&path)?)?;
    let store = match cfg.redis_url() {
        Some(url) => format!("Redis at {}", fleetlimit::redact_url(url)),
        None => "the in-process store (set REDIS_URL to use Redis)".to_owned(),
    };

    let layer = RateLimitLayer::new(cfg).await?;
    // Listening before the banner: from then on SIGHUP reloads rather than
    // ends the process.
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup())?;
        let mut forced = signal(SignalKind::user_defined1())?;
        let reload = layer.reload_handle().map(on_env_redis);
        let path = path.clone();
        tokio::spawn(async move {
            loop {
                let force = tokio::select! {
                    Some(()) = hangups.recv() => false,
                    Some(()) = forced.recv() => true,
                    else => break,
                };
                // Read on a thread of its own, under a timeout: a path that
                // blocks never stops the service answering.
                match reload.clone().force(force).reload_file(&path).await {
                    Ok(changes) => println!("reloaded {path}: {changes}"),
                    Err(e @ fleetlimit::reload::ReloadError::Drastic { .. }) => println!(
                        "reload failed, the running limits are kept: {e} \
                         (`kill -USR1 {}` applies it)",
                        std::process::id()
                    ),
                    Err(e) => println!("reload failed, the running limits are kept: {e}"),
                }
            }
        });
    }

    let app = Router::new()
        .route("/", get(|| async { "hello from fleetlimit\n" }))
        .route("/sign-in", post(|| async { "signed in\n" }))
        .route("/search", get(|| async { "search results\n" }))
        .layer(layer);

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
