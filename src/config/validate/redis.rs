//! `[redis]` checked: the URL (see `redis_url::check`), its TLS files, the
//! pool and the connect timeout; for a `[redis]` section, the builder's
//! Redis settings and a URL given to `Config::try_with_redis_url` alike.

use super::{Place, Validator};
use crate::config::ConfigError;
use crate::config::redis::RedisSettings;
use crate::config::redis_url::{self, redact_url};

/// The longest `batch_window`: a wait every coalesced check pays, so a few
/// round trips at most.
const MAX_BATCH_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);

impl Validator<'_> {
    /// TLS files only with a `rediss` URL, a client certificate with its
    /// key, each readable and holding what it should.
    pub(in crate::config) fn redis(&self, r: &RedisSettings) -> Result<(), ConfigError> {
        let place = |field: &str| Place::of(&["redis", field]);
        let at = |field: &str, msg: String| self.err(place(field), msg);
        let target = redis_url::check(&r.url, cfg!(feature = "tls")).map_err(|e| at("url", e))?;
        let files = [
            ("tls_ca_file", &r.tls_ca_file),
            ("tls_client_cert", &r.tls_client_cert),
            ("tls_client_key", &r.tls_client_key),
        ];
        for (name, file) in files {
            if file.is_some() && !target.tls {
                return Err(at(
                    name,
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
                    "tls_client_cert",
                    "tls_client_cert needs tls_client_key (the certificate's private key)".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(at(
                    "tls_client_key",
                    "tls_client_key needs tls_client_cert".into(),
                ));
            }
            _ => {}
        }
        #[cfg(feature = "tls")]
        {
            use crate::config::pem;
            if let Some(f) = &r.tls_ca_file {
                pem::read_certs("tls_ca_file", f).map_err(|e| at("tls_ca_file", e))?;
            }
            if let Some(f) = &r.tls_client_cert {
                pem::read_certs("tls_client_cert", f).map_err(|e| at("tls_client_cert", e))?;
            }
            if let Some(f) = &r.tls_client_key {
                pem::read_key(f).map_err(|e| at("tls_client_key", e))?;
            }
        }
        self.at_least_one("pool_size", r.pool_size, place("pool_size"))?;
        let timeout = place("connect_timeout");
        self.longer_than_zero("connect_timeout", r.connect_timeout, timeout.clone())?;
        self.not_too_long("connect_timeout", r.connect_timeout, timeout)?;
        if let Some(w) = r.batch_window {
            self.longer_than_zero("batch_window", w, place("batch_window"))?;
            if w > MAX_BATCH_WINDOW {
                return Err(at(
                    "batch_window",
                    format!(
                        "batch_window is {w:?}: at most {MAX_BATCH_WINDOW:?} (every coalesced \
                         check waits this long before its call goes out)"
                    ),
                ));
            }
            if !r.coalesce {
                return Err(at(
                    "batch_window",
                    "batch_window needs coalesce = true (it is how long a coalesced check \
                     waits for company)"
                        .into(),
                ));
            }
        }
        Ok(())
    }
}
