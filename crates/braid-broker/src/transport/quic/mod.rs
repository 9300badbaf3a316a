//! MQTT over QUIC (quinn), compatible with EMQX's multi-stream design: the first
//! bidirectional stream a client opens is the control stream (CONNECT, CONNACK, PINGREQ,
//! DISCONNECT, ...), every further one is a data stream carrying plain MQTT packets whose
//! replies and subscriptions' deliveries go back on the same stream. See `docs/quic.md`.

mod certificate;
mod connection;
mod pacer;
mod stream;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;
use tracing::info;

use pacer::Pacer;

use crate::broker::Broker;
use crate::config::Config;
use crate::transport::admission::Admission;

/// ALPN protocol id of MQTT over QUIC (the one EMQX and its clients use).
pub const ALPN: &[u8] = b"mqtt";

/// The bound QUIC endpoint and how its connections are paced.
#[derive(Debug, Clone)]
pub(crate) struct Listener {
    pub endpoint: quinn::Endpoint,
    pacer: Arc<Pacer>,
}

/// Binds the QUIC endpoint `listeners.quic` with the configured (or a self-signed)
/// certificate, 0-RTT, migration and pacing as configured.
pub(crate) fn bind(config: &Config) -> io::Result<Listener> {
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
    let idle = quinn::IdleTimeout::try_from(Duration::from_secs(cfg.idle_timeout_secs))
        .map_err(|_| invalid(&"quic.idle_timeout_secs: too large"))?;
    server.transport_config(Arc::new(pacer::transport_config(idle)));
    let pacing = cfg.pacing.parse().map_err(|e: String| invalid(&format_args!("quic.pacing: {e}")))?;
    let addr = config.listeners.quic;
    let cannot = |e: io::Error| {
        // Most often a second broker on the same machine, on the default port.
        let hint = match e.kind() {
            io::ErrorKind::AddrInUse => {
                "; another broker on this machine? Set listeners.quic to another address \
                 (--set listeners.quic=0.0.0.0:0 takes a free port) or --set quic.enabled=false"
            }
            _ => "",
        };
        io::Error::new(e.kind(), format!("listeners.quic: cannot listen on {addr}: {e}{hint}"))
    };
    let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
    let socket = runtime.wrap_udp_socket(std::net::UdpSocket::bind(addr).map_err(cannot)?).map_err(cannot)?;
    let (pacer, socket) = Pacer::new(pacing, socket, server.clone(), idle);
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        Some(server),
        socket,
        runtime,
    )
    .map_err(cannot)?;
    Ok(Listener { endpoint, pacer: Arc::new(pacer) })
}

/// Accepts QUIC connections until shutdown, within the connection limits every listener
/// shares; each is served in a task of `connections`.
pub(crate) async fn accept(
    listener: Listener,
    broker: Arc<Broker>,
    connections: TaskTracker,
    admission: Arc<Admission>,
) {
    let Listener { endpoint, pacer } = listener;
    match endpoint.local_addr() {
        Ok(addr) => info!(transport = "quic", %addr, "listening for MQTT"),
        Err(e) => info!(transport = "quic", error = %e, "listening for MQTT (local address unknown)"),
    }
    loop {
        admission.pace().await;
        tokio::select! {
            _ = broker.shutdown().cancelled() => break,
            incoming = endpoint.accept() => match incoming {
                Some(incoming) if !admission.admit() => incoming.refuse(),
                Some(incoming) => {
                    connections.spawn(connection::serve(broker.clone(), incoming, pacer.clone()));
                }
                None => break,
            },
        }
    }
}
