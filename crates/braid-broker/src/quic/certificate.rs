//! The QUIC listener's certificate: a configured PEM chain and key, or a self-signed
//! certificate generated at startup when none is configured.

use std::io;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tracing::warn;

use crate::config::QuicConfig;

/// A certificate chain and its private key.
pub(crate) type CertifiedKey = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// Loads `quic.cert_file`/`quic.key_file`, or generates a self-signed certificate for
/// `localhost` and the loopback addresses when neither is set. Errors name the key.
pub(crate) fn load(cfg: &QuicConfig) -> io::Result<CertifiedKey> {
    if cfg.cert_file.is_empty() {
        return self_signed();
    }
    let invalid = |key: &str, path: &str, e: &dyn std::fmt::Display| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{key}: cannot load {path}: {e}"))
    };
    let chain = CertificateDer::pem_file_iter(&cfg.cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| invalid("quic.cert_file", &cfg.cert_file, &e))?;
    if chain.is_empty() {
        return Err(invalid("quic.cert_file", &cfg.cert_file, &"no CERTIFICATE block in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(&cfg.key_file)
        .map_err(|e| invalid("quic.key_file", &cfg.key_file, &e))?;
    Ok((chain, key))
}

fn self_signed() -> io::Result<CertifiedKey> {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    let cert = rcgen::generate_simple_self_signed(names)
        .map_err(|e| io::Error::other(format!("quic: cannot generate a self-signed certificate: {e}")))?;
    warn!(
        "quic: no quic.cert_file configured: using a self-signed certificate for localhost generated at \
         startup; clients must skip verification (braid --insecure) or be given a real certificate"
    );
    let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der()).map_err(io::Error::other)?;
    Ok((vec![cert.cert.der().clone()], key))
}
