//! The Redis store's settings (checked in `validate/redis.rs`).

use std::path::PathBuf;
use std::time::Duration;

use super::redis_url::redact_url;

/// Settings of the Redis store.
#[derive(Clone)]
pub(crate) struct RedisSettings {
    pub(crate) url: String,
    pub(crate) pool_size: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) coalesce: bool,
    /// How long a coalesced check waits for company (`None`: it does not
    /// wait, see `store/redis/batch.rs`).
    pub(crate) batch_window: Option<Duration>,
    /// PEM file of the CA(s) a `rediss://` server's certificate is checked
    /// against, besides the system's roots.
    pub(crate) tls_ca_file: Option<PathBuf>,
    /// PEM certificate chain and private key this client presents, for a
    /// server with `tls-auth-clients yes`.
    pub(crate) tls_client_cert: Option<PathBuf>,
    pub(crate) tls_client_key: Option<PathBuf>,
}

// By hand: the URL may carry a password, and `{:?}` ends up in logs.
impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("coalesce", &self.coalesce)
            .field("batch_window", &self.batch_window)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_client_cert", &self.tls_client_cert)
            .field("tls_client_key", &self.tls_client_key)
            .finish()
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            pool_size: 4,
            connect_timeout: Duration::from_secs(2),
            coalesce: true,
            batch_window: None,
            tls_ca_file: None,
            tls_client_cert: None,
            tls_client_key: None,
        }
    }
}
