//! The QUIC listener's certificate: a configured PEM chain and key, or a self-signed
//! certificate generated at startup when none is configured.

use std::io;
use std::path::Path;

use rustls::pki_types::PrivateKeyDer;
use tracing::warn;

use crate::config::QuicConfig;
use crate::transport::tls::{load_pair, CertifiedKey};

/// Loads `quic.cert_file`/`quic.key_file`, or generates a self-signed certificate for
/// `localhost` and the loopback addresses when neither is set. Errors name the key.
pub(crate) fn load(cfg: &QuicConfig) -> io::Result<CertifiedKey> {
    if cfg.cert_file.is_empty() {
        return self_signed();
    }
    let pair =
        load_pair("quic.cert_file", Path::new(&cfg.cert_file), "quic.key_file", Path::new(&cfg.key_file))?;
    Ok(pair)
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
