//! MQTT over QUIC (quinn), compatible with EMQX's multi-stream design: the first
//! bidirectional stream a client opens is the control stream (CONNECT, CONNACK, PINGREQ,
//! DISCONNECT, ...), every further one is a data stream carrying plain MQTT packets whose
//! replies and subscriptions' deliveries go back on the same stream. See `docs/quic.md`.

mod certificate;
mod connection;
mod stream;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;
use tracing::info;

use crate::admission::Admission;
use crate::broker::Broker;
use crate::config::Config;

/// ALPN protocol id of MQTT over QUIC (the one EMQX and its clients use).
pub const ALPN: &[u8] = b"mqtt";

/// Binds the QUIC endpoint `listeners.quic` with the configured (or a self-signed)
/// certificate, 0-RTT and migration as configured.
pub(crate) fn bind(config: &Config) -> io::Result<quinn::Endpoint> {
    let cfg = &config.quic;
    let (chain, key) = certificate::load(cfg)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let invalid =
        |e: &dyn std::fmt::Display| io::Error::new(io::ErrorKind::InvalidInput, format!("quic: {e}"));
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| invalid(&e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| invalid(&format_args!("quic.cert_file/quic.key_file: {e}")))?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    if cfg.zero_rtt {
        // QUIC allows only 0 or u32::MAX here.
        tls.max_early_data_size = u32::MAX;
    }
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| invalid(&e))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server.migration(cfg.migration);
    let mut transport = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(Duration::from_secs(cfg.idle_timeout_secs))
        .map_err(|_| invalid(&"quic.idle_timeout_secs: too large"))?;
    transport.max_idle_timeout(Some(idle));
    server.transport_config(Arc::new(transport));
    let addr = config.listeners.quic;
    quinn::Endpoint::server(server, addr)
        .map_err(|e| io::Error::new(e.kind(), format!("listeners.quic: cannot listen on {addr}: {e}")))
}

/// Accepts QUIC connections until shutdown, within the connection limits every listener
/// shares; each is served in a task of `connections`.
pub(crate) async fn accept(
    endpoint: quinn::Endpoint,
    broker: Arc<Broker>,
    connections: TaskTracker,
    admission: Arc<Admission>,
) {
    let addr: Option<SocketAddr> = endpoint.local_addr().ok();
    info!(transport = "quic", addr = ?addr, "listening for MQTT");
    loop {
        admission.pace().await;
        tokio::select! {
            _ = broker.shutdown.cancelled() => break,
            incoming = endpoint.accept() => match incoming {
                Some(incoming) if !admission.admit() => incoming.refuse(),
                Some(incoming) => {
                    connections.spawn(connection::serve(broker.clone(), incoming));
                }
                None => break,
            },
        }
    }
}
