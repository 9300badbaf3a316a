//! The transport of a node's links: TCP with TLS 1.3. The node listens on `cluster.listen` for
//! its peers and dials theirs. The certificate is a self-signed one made at start and not
//! verified by the dialer: a link is authenticated by the cluster's secret, proven over the TLS
//! session's exported keys (see [`super::handshake`]).
//!
//! Why not QUIC, which the client-facing listeners offer: a link is one long-lived bulk stream
//! each way between two nodes on a LAN, where head-of-line blocking between streams does not
//! arise (acknowledgements travel the other way, never behind bulk data). Measured on loopback
//! (bench/CLUSTER.md), quinn spent more CPU per forwarded message than the Redis path it
//! replaces (its packets' encryption and bookkeeping in user space, and its driver tasks),
//! where the kernel's TCP segments and acknowledges at no cost to the process.

use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{PrivateKeyDer, ServerName};
use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::ClusterError;
use braid_broker::config::ClusterConfig;

/// ALPN protocol id of a link.
const ALPN: &[u8] = b"braid-cluster/1";

/// A link's TLS stream, either side. Reads from the socket go through a buffer of
/// [`READ_BUFFER`] bytes: rustls asks for at most a few KiB at a time, which would be a
/// system call for every few messages.
pub(crate) type LinkStream = tokio_rustls::TlsStream<BufReader<TcpStream>>;

/// How much a link reads from its socket at once.
const READ_BUFFER: usize = 256 << 10;

/// The node's listening socket and its TLS configurations.
pub(crate) struct Endpoint {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    /// How long sent data may stay unacknowledged by the peer's TCP before the connection is
    /// given up (`cluster.link_timeout_ms`).
    timeout: Duration,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("listener", &self.listener).finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Binds `config.listen`.
    pub(crate) fn bind(config: &ClusterConfig) -> Result<Endpoint, ClusterError> {
        let bad = |e: &dyn std::fmt::Display| ClusterError::Config(format!("cluster.listen: {e}"));
        let addr: SocketAddr = config.listen.parse().map_err(|e| bad(&e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cert = rcgen::generate_simple_self_signed(vec![config.node.clone()]).map_err(|e| bad(&e))?;
        let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der()).map_err(|e| bad(&e))?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad(&e))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .map_err(|e| bad(&e))?;
        server.alpn_protocols = vec![ALPN.to_vec()];
        let mut client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad(&e))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(braid_client::AnyServer(provider)))
            .with_no_client_auth();
        client.alpn_protocols = vec![ALPN.to_vec()];
        let socket = std::net::TcpListener::bind(addr)
            .map_err(|e| bad(&format_args!("cannot listen on {addr}: {e}")))?;
        socket.set_nonblocking(true).map_err(|e| bad(&e))?;
        let listener = TcpListener::from_std(socket).map_err(|e| bad(&e))?;
        Ok(Endpoint {
            listener,
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
            timeout: Duration::from_millis(config.link_timeout_ms),
        })
    }

    /// The address bound.
    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next peer's TCP connection.
    pub(crate) async fn accept(&self) -> std::io::Result<(TcpStream, SocketAddr)> {
        let (stream, from) = self.listener.accept().await?;
        self.tune(&stream);
        Ok((stream, from))
    }

    /// Its TLS handshake, as the listening side.
    pub(crate) async fn accept_tls(&self, stream: TcpStream) -> std::io::Result<LinkStream> {
        Ok(self.acceptor.accept(BufReader::with_capacity(READ_BUFFER, stream)).await?.into())
    }

    /// Connects to `addr`, the link to node `node`, and makes the TLS handshake.
    pub(crate) async fn connect(&self, addr: SocketAddr, node: &str) -> std::io::Result<LinkStream> {
        let stream = TcpStream::connect(addr).await?;
        self.tune(&stream);
        let name = ServerName::try_from(node.to_string()).map_err(std::io::Error::other)?;
        Ok(self.connector.connect(name, BufReader::with_capacity(READ_BUFFER, stream)).await?.into())
    }

    /// No delay for small frames (acknowledgements), and a peer that stops acknowledging what
    /// was sent (a cut, a dead machine) ends the connection after the link timeout.
    fn tune(&self, stream: &TcpStream) {
        let _ = stream.set_nodelay(true);
        let socket = socket2::SockRef::from(stream);
        let _ = socket.set_tcp_user_timeout(Some(self.timeout));
        let keepalive =
            socket2::TcpKeepalive::new().with_time(self.timeout / 2).with_interval(self.timeout / 4);
        let _ = socket.set_tcp_keepalive(&keepalive);
    }
}

/// The keys both ends of `stream` export from its TLS session.
pub(crate) fn exported(stream: &LinkStream, label: &[u8]) -> Result<[u8; 32], String> {
    let keys = match stream {
        tokio_rustls::TlsStream::Client(s) => s.get_ref().1.export_keying_material([0u8; 32], label, None),
        tokio_rustls::TlsStream::Server(s) => s.get_ref().1.export_keying_material([0u8; 32], label, None),
    };
    keys.map_err(|e| e.to_string())
}

/// The address other nodes dial: `cluster.advertise`, or the bound address, with an
/// unspecified IP replaced by this host's address towards Redis (the interface its peers,
/// which reach the same Redis, most likely reach it on).
pub(crate) fn advertise(config: &ClusterConfig, bound: SocketAddr) -> Result<String, ClusterError> {
    if !config.advertise.is_empty() {
        return Ok(config.advertise.clone());
    }
    if !bound.ip().is_unspecified() {
        return Ok(bound.to_string());
    }
    let cannot = |e: &dyn std::fmt::Display| {
        ClusterError::Config(format!(
            "cluster.advertise: cannot tell this host's address for {} ({e}): set cluster.advertise",
            config.listen
        ))
    };
    let redis = config.redis.first().ok_or_else(|| cannot(&"no Redis URL"))?;
    let host = redis_host(redis).ok_or_else(|| cannot(&"the Redis URL names no host"))?;
    let towards =
        host.to_socket_addrs().map_err(|e| cannot(&e))?.next().ok_or_else(|| cannot(&"no address"))?;
    let probe =
        UdpSocket::bind(if towards.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }).map_err(|e| cannot(&e))?;
    probe.connect(towards).map_err(|e| cannot(&e))?;
    let ip = probe.local_addr().map_err(|e| cannot(&e))?.ip();
    Ok(SocketAddr::new(ip, bound.port()).to_string())
}

/// `host:port` of a `redis://` URL.
fn redis_host(url: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    Some(format!("{}:{}", url.host_str()?, url.port().unwrap_or(6379)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redis_host_is_read_from_the_url() {
        assert_eq!(redis_host("redis://:pw@10.0.0.5:7000/0").as_deref(), Some("10.0.0.5:7000"));
        assert_eq!(redis_host("rediss://redis.example.com").as_deref(), Some("redis.example.com:6379"));
        assert_eq!(redis_host("redis://u:p@h:1").as_deref(), Some("h:1"));
    }
}
