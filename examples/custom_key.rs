//! Keys the application computes (`key = "custom:<name>"`): a limit per
//! tenant, where the tenant comes from the caller's token (an auth
//! middleware puts a `Tenant` extension), and one per tenant named in the
//! path (`/t/{tenant}/items`).
//!
//! ```text
//! cargo run --example custom_key
//! curl -i -H 'authorization: Bearer tok-acme-ann' http://127.0.0.1:3000/reports
//! curl -i -H 'authorization: Bearer tok-acme-bob' http://127.0.0.1:3000/reports   # same tenant, same bucket
//! curl -i http://127.0.0.1:3000/reports                                           # no tenant: 401
//! curl -i http://127.0.0.1:3000/t/acme/items
//! curl -i http://127.0.0.1:3000/t/ACME!/items                                     # invalid tenant: 400
//! ```
//!
//! `FLEETLIMIT_ADDR` sets the address (default `127.0.0.1:3000`);
//! `REDIS_URL` puts the buckets in Redis (tenants stored as keyed digests,
//! `rl:per-tenant:{c#…}`, like API keys).

use std::net::SocketAddr;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use fleetlimit::{Config, KeyAnswer, RateLimitLayer, RequestRef};

const POLICY: &str = r#"
[limits.per-tenant]
key = "custom:tenant"         # the `key_fn` named "tenant" below
on_missing = "reject"         # a request without a tenant: 401
capacity = 3
refill = "3/min"

[limits.per-path-tenant]
key = "custom:path-tenant"
capacity = 2
refill = "2/min"

[[routes]]
path = "/reports"
limits = ["per-tenant"]

[[routes]]
path = "/t/{tenant}/items"
limits = ["per-path-tenant"]
"#;

/// The caller's tenant, as the authentication middleware found it.
#[derive(Clone, Debug)]
struct Tenant(String);

/// The fake token table: bearer token → tenant. Two users of one tenant
/// share its bucket.
fn tenant_of(token: &str) -> Option<&'static str> {
    match token {
        "tok-acme-ann" | "tok-acme-bob" => Some("acme"),
        "tok-globex" => Some("globex"),
        _ => None,
    }
}

/// Verifies the token (here: looks it up) before the limiter runs, so the
/// limiter counts by the tenant the token proves, not by what a client
/// claims. No token passes through without a tenant (the limiter then
/// answers `on_missing`); a bad one is this middleware's own 401.
async fn authenticate(mut req: Request, next: Next) -> Result<Response, StatusCode> {
    let token = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if let Some(token) = token {
        let tenant = tenant_of(token).ok_or(StatusCode::UNAUTHORIZED)?;
        req.extensions_mut().insert(Tenant(tenant.to_owned()));
    }
    Ok(next.run(req).await)
}

/// The tenant of `/t/{tenant}/...`: lowercase letters, digits and `-`, at
/// most 32; anything else is invalid (400), never a bucket of its own.
fn path_tenant<'r>(req: &RequestRef<'r>) -> KeyAnswer<'r> {
    let Some(rest) = req.uri().path().strip_prefix("/t/") else {
        return KeyAnswer::Missing;
    };
    let tenant = rest.split('/').next().unwrap_or("");
    let valid = (1..=32).contains(&tenant.len())
        && tenant
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if valid {
        tenant.into()
    } else {
        KeyAnswer::Invalid
    }
}

async fn reports(Extension(tenant): Extension<Tenant>) -> String {
    format!("reports of {}\n", tenant.0)
}

async fn items() -> &'static str {
    "items\n"
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = Config::from_toml_str(POLICY)?;
    let store = match std::env::var("REDIS_URL") {
        Ok(url) => {
            cfg = cfg.try_with_redis_url(url.clone())?;
            format!("Redis at {}", fleetlimit::redact_url(&url))
        }
        Err(_) => "the in-process store".to_owned(),
    };
    let limiter = RateLimitLayer::new(cfg)
        // Synchronous, on the request path: it only reads what the
        // middleware left in the extensions.
        .key_fn("tenant", |req| {
            req.extensions()
                .get::<Tenant>()
                .map(|t| t.0.as_str())
                .into()
        })
        .key_fn("path-tenant", path_tenant)
        .await?;
    let app = Router::new()
        .route("/reports", get(reports))
        .route("/t/{tenant}/items", get(items))
        .layer(limiter)
        // Added last, so it runs first: the limiter sees the Tenant.
        .layer(middleware::from_fn(authenticate));

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit custom key example on http://{} using {store}",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
