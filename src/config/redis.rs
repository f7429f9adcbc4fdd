//! The Redis store's settings, and the checks of its URL and TLS files.

use std::path::PathBuf;
use std::time::Duration;

use super::redis_url::{self, redact_url};
use super::validate::Span;
use super::ConfigError;

/// Settings of the Redis store.
#[derive(Clone)]
pub(crate) struct RedisSettings {
    pub(crate) url: String,
    pub(crate) pool_size: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) coalesce: bool,
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
            tls_ca_file: None,
            tls_client_cert: None,
            tls_client_key: None,
        }
    }
}

/// Where the `[redis]` fields that [`check_redis`] checks were written.
#[derive(Clone, Debug, Default)]
pub(super) struct RedisSpans {
    pub(super) url: Span,
    pub(super) ca_file: Span,
    pub(super) client_cert: Span,
    pub(super) client_key: Span,
}

/// A Redis URL (see `redis_url::check`) and its TLS settings: files only
/// with a `rediss` URL, a client certificate with its key, each readable
/// and holding what it should.
pub(super) fn check_redis(
    src: &str,
    r: &RedisSettings,
    spans: &RedisSpans,
) -> Result<(), ConfigError> {
    let at = |span: &Span, msg: String| ConfigError::at(src, span.clone(), msg);
    let target = redis_url::check(&r.url, cfg!(feature = "tls")).map_err(|e| at(&spans.url, e))?;
    let files = [
        ("tls_ca_file", &r.tls_ca_file, &spans.ca_file),
        ("tls_client_cert", &r.tls_client_cert, &spans.client_cert),
        ("tls_client_key", &r.tls_client_key, &spans.client_key),
    ];
    for (name, file, span) in files {
        if file.is_some() && !target.tls {
            return Err(at(
                span,
                format!(
                    "{name} is set, but the url {:?} does not use TLS (rediss://)",
                    redact_url(&r.url)
                ),
            ));
        }
    }
    match (&r.tls_client_cert, &r.tls_client_key) {
        (Some(_), None) => {
            return Err(at(
                &spans.client_cert,
                "tls_client_cert needs tls_client_key (the certificate's private key)".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(at(
                &spans.client_key,
                "tls_client_key needs tls_client_cert".into(),
            ))
        }
        _ => {}
    }
    #[cfg(feature = "tls")]
    {
        if let Some(f) = &r.tls_ca_file {
            super::pem::read_certs("tls_ca_file", f).map_err(|e| at(&spans.ca_file, e))?;
        }
        if let Some(f) = &r.tls_client_cert {
            super::pem::read_certs("tls_client_cert", f).map_err(|e| at(&spans.client_cert, e))?;
        }
        if let Some(f) = &r.tls_client_key {
            super::pem::read_key(f).map_err(|e| at(&spans.client_key, e))?;
        }
    }
    Ok(())
}
