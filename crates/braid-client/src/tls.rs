//! TLS for the client: the rustls `ClientConfig` a [`TlsOptions`] describes (ring provider,
//! TLS 1.2 and 1.3), and the handshake.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::TlsOptions;

fn invalid(what: &str, path: &Path, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{what} {}: {e}", path.display()))
}

fn load_certs(what: &str, path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| invalid(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, path, e))?;
    if certs.is_empty() {
        return Err(invalid(what, path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn roots(opts: &TlsOptions) -> io::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    match &opts.ca_file {
        Some(path) => {
            for ca in load_certs("CA file", path)? {
                roots.add(ca).map_err(|e| invalid("CA file", path, e))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "no CA certificates in the system store",
                ));
            }
        }
    }
    Ok(roots)
}

/// The client config for `opts`, built once per process for the same options: thousands of
/// bench clients share one, and with it the TLS session cache that makes reconnects cheap.
fn client_config(opts: &TlsOptions) -> io::Result<Arc<ClientConfig>> {
    static CONFIGS: OnceLock<Mutex<HashMap<TlsOptions, Arc<ClientConfig>>>> = OnceLock::new();
    let mut configs = CONFIGS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(config) = configs.get(opts) {
        return Ok(config.clone());
    }
    let config = build_client_config(opts)?;
    configs.insert(opts.clone(), config.clone());
    Ok(config)
}

/// Builds the client config `opts` describes.
fn build_client_config(opts: &TlsOptions) -> io::Result<Arc<ClientConfig>> {
    rustls_config(opts, rustls::DEFAULT_VERSIONS).map(Arc::new)
}

/// A rustls client configuration for `opts` allowing `versions` (QUIC asks for TLS 1.3 only
/// and adds its ALPN).
pub(crate) fn rustls_config(
    opts: &TlsOptions,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> io::Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(io::Error::other)?;
    let builder = if opts.insecure {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
    } else {
        builder.with_root_certificates(roots(opts)?)
    };
    let config = match (&opts.cert, &opts.key) {
        (Some(cert), Some(key)) => {
            let chain = load_certs("client certificate", cert)?;
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid("client key", key, e))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| invalid("client certificate", cert, e))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a client certificate needs both the certificate and its key",
            ))
        }
    };
    Ok(config)
}

/// Runs the TLS handshake on `stream` to `host` (or `opts.server_name`): for MQTT over TLS,
/// and for other protocols that share the options (`braid ctl`'s HTTPS).
pub async fn connect(stream: TcpStream, host: &str, opts: &TlsOptions) -> io::Result<TlsStream<TcpStream>> {
    let name = opts.server_name.as_deref().unwrap_or(host);
    let name = ServerName::try_from(name.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("TLS server name {name:?}: {e}")))?;
    TlsConnector::from(client_config(opts)?).connect(name, stream).await
}

/// Accepts any certificate and name (`TlsOptions::insecure`), still checking that the server
/// holds the certificate's key. For connections authenticated by other means (Braid's cluster
/// links prove a shared secret over the TLS session's exported keys).
#[derive(Debug)]
pub struct AnyServer(pub Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
