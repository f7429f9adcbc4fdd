//! Reading the PEM files of the TLS settings: the configuration checks them
//! at start-up, and the Redis store's TLS connector loads them.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificates of a PEM file (one or more `BEGIN CERTIFICATE` blocks);
/// `field` names the setting in errors.
pub(crate) fn read_certs(field: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {field} {shown}: {e}"))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{field} {shown}: not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{field} {shown} holds no certificate (expected PEM \"BEGIN CERTIFICATE\" blocks)"
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let shown = path.display();
    let pem =
        std::fs::read(path).map_err(|e| format!("cannot read tls_client_key {shown}: {e}"))?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("tls_client_key {shown}: no PEM private key: {e}"))
}
