//! An authentication middleware in front of fleetlimit: it turns the
//! caller's bearer token into an [`Account`] extension, which limits keyed
//! by `"account"` count by. `GET /reports` costs 5; a cached report needs
//! only 1, so its handler gives the other 4 back ([`Refund`]).
//!
//! ```text
//! cargo run --example auth
//! curl -i -H 'authorization: Bearer tok-alice' http://127.0.0.1:3000/reports
//! curl -i -H 'authorization: Bearer tok-alice' 'http://127.0.0.1:3000/reports?cached=1'
//! ```
//!
//! `FLEETLIMIT_ADDR` sets the address (default `127.0.0.1:3000`);
//! `REDIS_URL` puts the buckets in Redis.

use std::net::SocketAddr;

use axum::extract::{Query, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use fleetlimit::{Account, Config, RateLimitLayer, Refund};

const POLICY: &str = r#"
[limits.per-account]
key = "account"               # the Account extension the middleware sets
capacity = 10
refill = "10/min"

[[routes]]
path = "/reports"
limits = ["per-account"]
cost = 5                      # charged up front...
refund = true                 # ...and the handler may give some back
"#;

/// The fake token table: bearer token → account id.
fn account_of(token: &str) -> Option<&'static str> {
    match token {
        "tok-alice" => Some("acct_alice"),
        "tok-bob" => Some("acct_bob"),
        _ => None,
    }
}

/// Authenticates before the limiter runs, so the limiter counts by who the
/// caller is, not by what it claims in a header.
async fn authenticate(mut req: Request, next: Next) -> Result<Response, StatusCode> {
    let token = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let account = token.and_then(account_of).ok_or(StatusCode::UNAUTHORIZED)?;
    req.extensions_mut().insert(Account::new(account));
    Ok(next.run(req).await)
}

#[derive(serde::Deserialize)]
struct ReportQuery {
    cached: Option<u8>,
}

async fn report(
    Extension(account): Extension<Account>,
    Extension(refund): Extension<Refund>,
    q: Query<ReportQuery>,
) -> String {
    if q.cached == Some(1) {
        // An error means the store could not be reached: the units stay
        // spent, the strict side.
        let _ = refund.give_back(4).await;
        format!("cached report for {}\n", account.0)
    } else {
        format!("fresh report for {}\n", account.0)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = Config::from_toml_str(POLICY)?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        cfg = cfg.try_with_redis_url(url)?;
    }
    let app = Router::new()
        .route("/reports", get(report))
        .layer(RateLimitLayer::new(cfg).await?)
        // Added last, so it runs first: the limiter sees the Account.
        .layer(middleware::from_fn(authenticate));

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit auth example on http://{}",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
