//! MQTT over QUIC: the connection (ALPN `mqtt`, TLS 1.3 on rustls with ring), its control
//! stream, and data streams. Client configurations are kept per trust setting for the life of
//! the process, so a reconnect resumes the TLS session and may send CONNECT as 0-RTT data.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use braid_pacing::{PacedSocket, Pacing};

/// ALPN protocol id of MQTT over QUIC.
const ALPN: &[u8] = b"mqtt";
/// Send priority of the control stream: above every data stream.
const CONTROL_PRIORITY: i32 = i32::MAX;
/// QUIC-level keep alive, so an idle MQTT connection with a long keep alive is not dropped by
/// the QUIC idle timeout (60 s on Braid).
const QUIC_KEEP_ALIVE: Duration = Duration::from_secs(10);

/// How a QUIC connection is secured.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct QuicOptions {
    /// Trust the server certificate without verifying it (for self-signed test brokers only).
    pub insecure: bool,
    /// PEM file of CA certificates to verify the server with; default: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Name to verify the certificate for; default the host connected to.
    pub server_name: Option<String>,
    /// How datagrams are paced (default [`Pacing::Adaptive`]: only once heavy loss shows a
    /// policer on the path; see `docs/quic.md`).
    pub pacing: Pacing,
}

/// An open QUIC connection: its first stream (the control stream) and the connection.
pub(crate) struct Opened {
    pub conn: QuicConn,
    pub send: quinn::SendStream,
    pub recv: quinn::RecvStream,
}

/// A QUIC connection, and whether its first stream went out as 0-RTT data.
pub(crate) struct QuicConn {
    pub connection: quinn::Connection,
    /// Resolves to false if the server refused the 0-RTT data (then the stream is dead, and
    /// CONNECT must go again on a new one).
    pub zero_rtt: Option<quinn::ZeroRttAccepted>,
}

impl QuicConn {
    /// After a failed CONNECT exchange: a new control stream if the failure was the server
    /// refusing 0-RTT data (the connection itself goes on in 1-RTT).
    pub(crate) async fn reopen_after_rejected_0rtt(
        &mut self,
    ) -> Option<(quinn::SendStream, quinn::RecvStream)> {
        let accepted = self.zero_rtt.take()?.await;
        if accepted {
            return None;
        }
        let (send, recv) = self.connection.open_bi().await.ok()?;
        let _ = send.set_priority(CONTROL_PRIORITY);
        Some((send, recv))
    }
}

/// Connects to `host:port` and opens the control stream. Sends 0-RTT when the server resumes a
/// session this process had with it.
pub(crate) async fn open(host: &str, port: u16, q: &QuicOptions) -> io::Result<Opened> {
    let addr = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address")))?;
    let mut config = client_config(q)?;
    let bind: SocketAddr = if addr.is_ipv6() { "[::]:0".parse() } else { "0.0.0.0:0".parse() }
        .map_err(|e| io::Error::other(format!("{e}")))?;
    let endpoint = paced_endpoint(bind, q.pacing, &mut config)?;
    let name = q.server_name.as_deref().unwrap_or(host);
    let connecting = endpoint.connect_with(config, addr, name).map_err(io::Error::other)?;
    let (connection, zero_rtt) = match connecting.into_0rtt() {
        Ok((connection, accepted)) => (connection, Some(accepted)),
        Err(connecting) => (connecting.await.map_err(io::Error::other)?, None),
    };
    let (send, recv) = connection.open_bi().await.map_err(io::Error::other)?;
    // PINGREQ and DISCONNECT must not wait behind data streams.
    let _ = send.set_priority(CONTROL_PRIORITY);
    Ok(Opened { conn: QuicConn { connection, zero_rtt }, send, recv })
}

/// A client endpoint on `bind` whose socket is paced as `pacing` says; an adaptive pace gets
/// its rate from the congestion controller `config` is given for this connection.
fn paced_endpoint(
    bind: SocketAddr,
    pacing: Pacing,
    config: &mut quinn::ClientConfig,
) -> io::Result<quinn::Endpoint> {
    let mut transport = transport_config();
    let Some(pace) = pacing.configure(&mut transport) else { return quinn::Endpoint::client(bind) };
    config.transport_config(Arc::new(transport));
    let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
    let socket = runtime.wrap_udp_socket(std::net::UdpSocket::bind(bind)?)?;
    let socket = Arc::new(PacedSocket::new(socket, pace));
    quinn::Endpoint::new_with_abstract_socket(quinn::EndpointConfig::default(), None, socket, runtime)
}

/// Transport settings of every client connection.
fn transport_config() -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(QUIC_KEEP_ALIVE));
    transport
}

/// The client configuration for `q`, built once per process (it carries the session tickets).
fn client_config(q: &QuicOptions) -> io::Result<quinn::ClientConfig> {
    static CONFIGS: OnceLock<Mutex<HashMap<QuicOptions, quinn::ClientConfig>>> = OnceLock::new();
    let mut configs = CONFIGS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = configs.get(q) {
        return Ok(c.clone());
    }
    let opts = crate::TlsOptions {
        ca_file: q.ca_file.clone(),
        insecure: q.insecure,
        server_name: q.server_name.clone(),
        ..Default::default()
    };
    let mut tls = crate::tls::rustls_config(&opts, &[&rustls::version::TLS13])?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.enable_early_data = true;
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(io::Error::other)?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport_config()));
    configs.insert(q.clone(), config.clone());
    Ok(config)
}
