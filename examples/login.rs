//! fleetlimit login defence: `POST /login` behind a ladder of limits that
//! count failed sign-ins only, refusing per IP and per IP+account, and
//! asking for a challenge (never locking out) per account and when the
//! whole site sees too many failures.
//!
//! ```text
//! cargo run --example login                      # in-process buckets
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example login
//! curl -i -X POST -H 'x-account: alice' -H 'x-password: correct-horse' http://127.0.0.1:3000/login
//! ```
//!
//! A challenged request is answered `401` with a `challenge-required`
//! problem body unless it carries `x-captcha: solved` (a stand-in for a
//! real CAPTCHA or e-mailed code). `FLEETLIMIT_ADDR` sets the address
//! (default `127.0.0.1:3000`); the config path is the first argument, else
//! the bundled `examples/login.toml`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use fleetlimit::{Challenge, Config, RateLimitLayer};

/// The fake user store: account → password.
type Users = Arc<HashMap<&'static str, &'static str>>;

async fn login(
    State(users): State<Users>,
    challenge: Option<Extension<Challenge>>,
    headers: HeaderMap,
) -> Response {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(Extension(challenge)) = challenge {
        // Past a `challenge` limit: prove you are a person first.
        if text("x-captcha") != Some("solved") {
            return challenge.required().into_response();
        }
    }
    let (Some(account), Some(password)) = (text("x-account"), text("x-password")) else {
        return (StatusCode::UNAUTHORIZED, "account and password, please\n").into_response();
    };
    if users.get(account) == Some(&password) {
        format!("welcome, {account}\n").into_response()
    } else {
        // 401: counted by every limit of the ladder.
        (StatusCode::UNAUTHORIZED, "wrong account or password\n").into_response()
    }
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
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/examples/login.toml").to_owned());
    let mut cfg = Config::from_toml_file(&path)?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        cfg = cfg.try_with_redis_url(url)?;
    }
    let store = match cfg.redis_url() {
        Some(url) => format!("Redis at {}", fleetlimit::redact_url(url)),
        None => "the in-process store (set REDIS_URL to use Redis)".to_owned(),
    };

    let users: Users = Arc::new(HashMap::from([("alice", "correct-horse")]));
    let app = Router::new()
        .route("/login", post(login))
        .with_state(users)
        .layer(RateLimitLayer::new(cfg).await?);

    let addr = std::env::var("FLEETLIMIT_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "fleetlimit login example on http://{} using {store}",
        listener.local_addr()?
    );
    println!("config: {path}");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
