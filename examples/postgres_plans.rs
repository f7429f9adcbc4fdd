//! Plans from PostgreSQL: an axum server whose callers' limits follow a
//! table, read through the plan cache (an upgrade applies within 2 s).
//!
//! ```text
//! psql postgres://postgres@127.0.0.1:5432/test -c \
//!   "CREATE TABLE fleetlimit_plans (subject text PRIMARY KEY, plan text NOT NULL);
//!    INSERT INTO fleetlimit_plans VALUES ('demo-pro', 'pro');"
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --features postgres --example postgres_plans
//! curl -i -H 'x-api-key: demo-pro' http://127.0.0.1:3000/   # x-ratelimit-limit: 100
//! curl -i -H 'x-api-key: anyone' http://127.0.0.1:3000/     # x-ratelimit-limit: 10
//! ```
//!
//! `FLEETLIMIT_ADDR` sets the address (default `127.0.0.1:3000`),
//! `REDIS_URL` a Redis to share the counts with other instances,
//! `FLEETLIMIT_PLANS_TABLE` another table than `fleetlimit_plans`.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use fleetlimit::plan::PostgresPlans;
use fleetlimit::{Config, RateLimitLayer};

const CONFIG: &str = r#"
[limits.api]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 10
window = "60s"

[plans.pro.api]
limit = 100

[plan_cache]
ttl = "2s"

[[routes]]
path = "/"
limits = ["api"]
"#;

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

    let mut cfg = Config::from_toml_str(CONFIG)?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        cfg = cfg.try_with_redis_url(url)?;
    }
    let db = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    // Lazy: the server starts even while the database is down (callers get
    // the base numbers, and the failures are logged).
    let table =
        std::env::var("FLEETLIMIT_PLANS_TABLE").unwrap_or_else(|_| "fleetlimit_plans".to_owned());
    let plans = PostgresPlans::connect(&db)?.table(&table)?;

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(cfg).plan_resolver(plans).await?);

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit postgres_plans on http://{} (plans from {})",
        listener.local_addr()?,
        fleetlimit::redact_url(&db)
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
