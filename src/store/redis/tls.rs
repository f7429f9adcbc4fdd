//! TLS to Redis (`rediss://`, cargo feature `tls`): a rustls client on
//! ring, trusting the system's roots plus the CA file of the configuration,
//! and presenting a client certificate when one is configured.

use std::sync::Arc;

use fred::types::config::TlsConnector;

use crate::config::RedisSettings;
use crate::config::pem::{read_certs, read_key};

/// The connector fred uses for every connection of a `rediss` pool. The
/// server's certificate must chain to a system root or to `tls_ca_file`,
/// and name the host of the URL.
pub(crate) fn connector(r: &RedisSettings) -> Result<TlsConnector, String> {
    let mut roots = rustls::RootCertStore::empty();
    // A system certificate rustls cannot use is skipped: the CA file may be
    // all this deployment needs.
    let (_added, _skipped) =
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(file) = &r.tls_ca_file {
        for cert in read_certs("tls_ca_file", file)? {
            roots
                .add(cert)
                .map_err(|e| format!("tls_ca_file {}: {e}", file.display()))?;
        }
    }
    if roots.is_empty() {
        return Err("no CA certificate to check the Redis server against: \
                    the system has none and no tls_ca_file is set"
            .into());
    }
    // The provider by name: `ClientConfig::builder()` would panic if some
    // other crate in the build enabled a second one (aws-lc-rs).
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots);
    let config = match (&r.tls_client_cert, &r.tls_client_key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(read_certs("tls_client_cert", cert)?, read_key(key)?)
            .map_err(|e| format!("tls_client_cert {}: {e}", cert.display()))?,
        _ => builder.with_no_client_auth(),
    };
    Ok(TlsConnector::from(config))
}
