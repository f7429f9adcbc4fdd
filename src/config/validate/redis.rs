//! `[redis]` checked: the URL (see `redis_url::check`), its TLS files, the
//! pool and the connect timeout; for a `[redis]` section, the builder's
//! Redis settings and a URL given to `Config::try_with_redis_url` alike.

use super::Validator;
use crate::config::redis::{RedisSettings, RedisSpans};
use crate::config::redis_url::{self, redact_url};
use crate::config::ConfigError;

/// The longest `batch_window`: a wait every coalesced check pays, so a few
/// round trips at most.
const MAX_BATCH_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);

impl Validator<'_> {
    /// TLS files only with a `rediss` URL, a client certificate with its
    /// key, each readable and holding what it should.
    pub(in crate::config) fn redis(
        &self,
        r: &RedisSettings,
        spans: &RedisSpans,
    ) -> Result<(), ConfigError> {
        let at = |span: &super::Span, msg: String| self.err(span.clone(), msg);
        let target =
            redis_url::check(&r.url, cfg!(feature = "tls")).map_err(|e| at(&spans.url, e))?;
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
            use crate::config::pem;
            if let Some(f) = &r.tls_ca_file {
                pem::read_certs("tls_ca_file", f).map_err(|e| at(&spans.ca_file, e))?;
            }
            if let Some(f) = &r.tls_client_cert {
                pem::read_certs("tls_client_cert", f).map_err(|e| at(&spans.client_cert, e))?;
            }
            if let Some(f) = &r.tls_client_key {
                pem::read_key(f).map_err(|e| at(&spans.client_key, e))?;
            }
        }
        self.at_least_one("pool_size", r.pool_size, spans.pool_size.clone())?;
        let span = spans.connect_timeout.clone();
        self.longer_than_zero("connect_timeout", r.connect_timeout, span.clone())?;
        self.not_too_long("connect_timeout", r.connect_timeout, span)?;
        if let Some(w) = r.batch_window {
            let span = spans.batch_window.clone();
            self.longer_than_zero("batch_window", w, span.clone())?;
            if w > MAX_BATCH_WINDOW {
                return Err(at(
                    &span,
                    format!(
                        "batch_window is {w:?}: at most {MAX_BATCH_WINDOW:?} (every coalesced \
                         check waits this long before its call goes out)"
                    ),
                ));
            }
            if !r.coalesce {
                return Err(at(
                    &span,
                    "batch_window needs coalesce = true (it is how long a coalesced check \
                     waits for company)"
                        .into(),
                ));
            }
        }
        Ok(())
    }
}
