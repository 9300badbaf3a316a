//! TLS for the broker's listeners: the rustls `ServerConfig` built from `[tls]` (PEM files,
//! client-certificate verification, versions), a [`Reloadable`] holder that swaps it when the
//! files change or on SIGHUP, and the user name a client certificate carries.
//!
//! The TLS and WSS listeners take their config from here; the QUIC listener loads its own
//! certificate files (`[quic]`) with the same `load_pair`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{ClientAuth, TlsConfig, TlsVersion};

/// A TLS configuration that could not be loaded; the message names the key and the file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

impl From<TlsError> for io::Error {
    fn from(e: TlsError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, e.0)
    }
}

/// The configured file under `key`, or an error naming the key.
fn path<'a>(key: &str, value: &'a Option<PathBuf>) -> Result<&'a Path, TlsError> {
    value.as_deref().ok_or_else(|| TlsError(format!("{key}: not set")))
}

fn load_certs(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |e: &dyn std::fmt::Display| TlsError(format!("{key}: {}: {e}", path.display()));
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    if certs.is_empty() {
        return Err(bad(&"no PEM certificate in the file"));
    }
    Ok(certs)
}

/// A certificate chain and its private key.
pub(crate) type CertifiedKey = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// The PEM certificate chain at `cert` and its private key at `key`; errors name the config
/// key (`cert_key`, `key_key`) and the file.
pub(crate) fn load_pair(
    cert_key: &str,
    cert: &Path,
    key_key: &str,
    key: &Path,
) -> Result<CertifiedKey, TlsError> {
    let certs = load_certs(cert_key, cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError(format!("{key_key}: {}: {e}", key.display())))?;
    Ok((certs, key))
}

/// Builds the server config `[tls]` describes (ring provider, TLS 1.2 and 1.3 unless
/// `min_version` is 1.3, client certificates as `client_auth` says, no ALPN).
pub fn server_config(cfg: &TlsConfig) -> Result<Arc<ServerConfig>, TlsError> {
    let cert_path = path("tls.cert", &cfg.cert)?;
    let key_path = path("tls.key", &cfg.key)?;
    let (certs, key) = load_pair("tls.cert", cert_path, "tls.key", key_path)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match cfg.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError(format!("tls.min_version: {e}")))?;
    let builder = match cfg.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        mode => {
            let ca_path = path("tls.client_ca", &cfg.client_ca)?;
            let mut roots = RootCertStore::empty();
            for ca in load_certs("tls.client_ca", ca_path)? {
                roots.add(ca).map_err(|e| TlsError(format!("tls.client_ca: {}: {e}", ca_path.display())))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier =
                if mode == ClientAuth::Optional { verifier.allow_unauthenticated() } else { verifier };
            let verifier = verifier
                .build()
                .map_err(|e| TlsError(format!("tls.client_ca: {}: {e}", ca_path.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(certs, key).map_err(|e| {
        TlsError(format!("tls.cert/tls.key: {} and {}: {e}", cert_path.display(), key_path.display()))
    })?;
    Ok(Arc::new(config))
}

/// The user name a verified client certificate carries: its subject CN, else its first DNS or
/// e-mail subject alternative name.
pub fn certificate_username(der: &[u8]) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    if let Some(cn) = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()) {
        return Some(cn.to_string());
    }
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|name| match name {
        GeneralName::DNSName(n) | GeneralName::RFC822Name(n) => Some(n.to_string()),
        _ => None,
    })
}

/// The current server config, replaced when the certificate files change or on SIGHUP. New
/// handshakes use the new config; established connections keep theirs.
#[derive(Debug)]
pub struct Reloadable {
    cfg: TlsConfig,
    current: RwLock<Arc<ServerConfig>>,
}

impl Reloadable {
    /// Loads `cfg`; an error names the key and the file.
    pub fn load(cfg: &TlsConfig) -> Result<Arc<Reloadable>, TlsError> {
        let current = RwLock::new(server_config(cfg)?);
        Ok(Arc::new(Reloadable { cfg: cfg.clone(), current }))
    }

    /// The config for the next handshake.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.read().clone()
    }

    /// Loads the files again; on failure the old config stays in force.
    pub fn reload(&self) -> Result<(), TlsError> {
        *self.current.write() = server_config(&self.cfg)?;
        Ok(())
    }

    fn reload_and_log(&self, why: &str) {
        match self.reload() {
            Ok(()) => info!("TLS certificates reloaded ({why})"),
            Err(e) => warn!("TLS certificates not reloaded ({why}), keeping the old ones: {e}"),
        }
    }

    /// Modification times of the configured files (`None` for one that cannot be read).
    fn mtimes(&self) -> Vec<Option<SystemTime>> {
        [&self.cfg.cert, &self.cfg.key, &self.cfg.client_ca]
            .into_iter()
            .flatten()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    }

    /// Reloads on SIGHUP and, every `tls.reload_interval_secs`, when a file's modification
    /// time changed; until `shutdown`.
    pub async fn watch(self: Arc<Self>, shutdown: CancellationToken) {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!("cannot watch SIGHUP for TLS reloads: {e}");
                None
            }
        };
        let interval = Duration::from_secs(self.cfg.reload_interval_secs);
        let mut seen = self.mtimes();
        loop {
            let poll = async {
                if interval.is_zero() {
                    std::future::pending::<()>().await
                }
                tokio::time::sleep(interval).await
            };
            let hup = async {
                match hangup.as_mut() {
                    Some(s) => s.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = hup => {
                    seen = self.mtimes();
                    self.reload_and_log("SIGHUP");
                }
                _ = poll => {
                    let now = self.mtimes();
                    if now != seen {
                        seen = now;
                        self.reload_and_log("files changed");
                    }
                }
            }
        }
    }
}
