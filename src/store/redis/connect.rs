//! Connecting: fred's configuration from fleetlimit's Redis settings, the
//! pool with its reconnect policy, and the wait for the first connection.

use std::time::Duration;

use fred::clients::Pool;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::Builder;
use fred::types::config::{Config as FredConfig, ReconnectPolicy, Server};
use tokio::sync::broadcast::{Receiver as BroadcastReceiver, error::RecvError};

use crate::config::{RedisSettings, redact_url, redis_url};
use crate::store::StoreError;

/// fred's configuration for `settings`: the URL checked and its TLS set up
/// by fleetlimit (fred only sees the plain URL), so every connection to
/// Redis — the pool, the reset listener — is made the same way. The flag
/// says whether TLS is on.
pub(crate) fn fred_config(settings: &RedisSettings) -> Result<(FredConfig, bool), StoreError> {
    let target =
        redis_url::check(&settings.url, cfg!(feature = "tls")).map_err(StoreError::Unavailable)?;
    #[allow(unused_mut)]
    let mut config = FredConfig::from_url(&target.plain_url).map_err(|e| {
        StoreError::Unavailable(format!(
            "bad Redis URL {:?}: {}",
            redact_url(&settings.url),
            // fred's text may quote the URL: its secrets never printed.
            redis_url::scrub(e.details(), &settings.url)
        ))
    })?;
    #[cfg(feature = "tls")]
    if target.tls {
        let connector = super::tls::connector(settings).map_err(StoreError::Unavailable)?;
        config.tls = Some(connector.into());
    }
    Ok((config, target.tls))
}

/// A pool with the store's settings, not connected yet.
pub(crate) fn build_pool(
    config: FredConfig,
    pool_size: usize,
    deadline: Duration,
    connect_timeout: Duration,
) -> Result<Pool, StoreError> {
    Builder::from_config(config)
        .with_performance_config(|p| {
            // Safety net for anything sent without per-call options.
            p.default_command_timeout = deadline.max(Duration::from_millis(1));
        })
        .with_connection_config(|c| {
            c.connection_timeout = connect_timeout;
            c.max_command_attempts = 1;
            c.internal_command_timeout = connect_timeout;
        })
        // Without a policy a pool never reconnects after Redis restarts.
        .set_policy(ReconnectPolicy::new_exponential(0, 20, 1_000, 2))
        .build_pool(pool_size.max(1))
        .map_err(|e| StoreError::Unavailable(e.to_string()))
}

/// Why the pool was not connected when start-up stopped waiting.
#[derive(Debug)]
pub(crate) enum Startup {
    /// Redis answered `WRONGPASS` or `NOAUTH`: the URL's credentials.
    Auth(String),
    /// Nothing usable within the connect timeout (refused, TLS, silence).
    Unreachable(String),
}

impl From<Startup> for StoreError {
    fn from(s: Startup) -> Self {
        match s {
            Startup::Auth(e) | Startup::Unreachable(e) => StoreError::Unavailable(e),
        }
    }
}

/// A connection error that retrying will not fix: refused credentials, an
/// untrusted certificate.
fn final_error(e: &FredError) -> Option<Startup> {
    if *e.kind() == ErrorKind::Auth {
        return Some(Startup::Auth(format!(
            "authentication failed: {} (check the user and password of the Redis URL)",
            e.details()
        )));
    }
    // rustls' verdict, as fred passes it on inside an IO error.
    if e.details().contains("InvalidCertificate") {
        return Some(Startup::Unreachable(format!(
            "TLS: the Redis server's certificate is not trusted ({}); check tls_ca_file \
             and the host of the URL",
            e.details()
        )));
    }
    None
}

/// Waits for the pool's first connection, at most `timeout`; stops early on
/// an error retrying will not fix (see `final_error`).
pub(crate) async fn wait_connected(
    pool: &Pool,
    mut errors: BroadcastReceiver<(FredError, Option<Server>)>,
    timeout: Duration,
    tls: bool,
) -> Result<(), Startup> {
    let connected = pool.wait_for_connect();
    tokio::pin!(connected);
    let timer = tokio::time::sleep(timeout);
    tokio::pin!(timer);
    let mut last: Option<FredError> = None;
    let mut listening = true;
    loop {
        let next_error = async {
            if listening {
                errors.recv().await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            r = &mut connected => {
                return r.map_err(|e| {
                    final_error(&e).unwrap_or_else(|| Startup::Unreachable(e.to_string()))
                });
            }
            () = &mut timer => {
                let mut why = last.map_or_else(|| "no answer".to_owned(), |e| e.to_string());
                // A plaintext port never answers a TLS handshake; whether
                // fred's own connect timeout fired first is a race.
                if tls {
                    why.push_str(" (does the port of the rediss:// URL serve TLS?)");
                }
                return Err(Startup::Unreachable(format!(
                    "no connection within {timeout:?}: {why}"
                )));
            }
            e = next_error => match e {
                Ok((e, _)) => match final_error(&e) {
                    Some(stop) => return Err(stop),
                    None => last = Some(e),
                },
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => listening = false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_up_stops_at_errors_retrying_cannot_fix() {
        let e = FredError::new(ErrorKind::Auth, "WRONGPASS invalid username-password pair");
        let Some(Startup::Auth(why)) = final_error(&e) else {
            panic!("not an authentication failure");
        };
        assert!(why.starts_with("authentication failed: WRONGPASS"), "{why}");
        let e = FredError::new(
            ErrorKind::IO,
            "Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }",
        );
        assert!(matches!(final_error(&e), Some(Startup::Unreachable(w)) if w.starts_with("TLS: ")));
        let e = FredError::new(ErrorKind::IO, "Connection refused");
        assert!(
            final_error(&e).is_none(),
            "refused: keep waiting, Redis may come up"
        );
    }
}
