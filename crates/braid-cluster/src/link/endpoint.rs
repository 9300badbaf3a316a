//! The QUIC endpoint of a node's links: it listens on `cluster.listen` for its peers and dials
//! them from the same socket. TLS 1.3 encrypts every link; the certificate is a self-signed one
//! made at start and not verified by the dialer: a link is authenticated by the cluster's
//! secret, proven over the TLS session's exported keys (see [`super::handshake`]).

use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use crate::ClusterError;
use braid_broker::config::ClusterConfig;

/// ALPN protocol id of a link.
const ALPN: &[u8] = b"braid-cluster/1";

/// The largest UDP payload over IPv4.
const MAX_UDP_PAYLOAD: u16 = 65_507;

/// Bytes a stream may have in flight unacknowledged: a link carries a whole node's traffic.
const STREAM_WINDOW: u32 = 16 << 20;

/// Binds `config.listen` as a QUIC server and client endpoint.
pub(crate) fn bind(config: &ClusterConfig) -> Result<quinn::Endpoint, ClusterError> {
    let bad = |e: &dyn std::fmt::Display| ClusterError::Config(format!("cluster.listen: {e}"));
    let addr: SocketAddr = config.listen.parse().map_err(|e| bad(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cert = rcgen::generate_simple_self_signed(vec![config.node.clone()]).map_err(|e| bad(&e))?;
    let key =
        rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).map_err(|e| bad(&e))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| bad(&e))?
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .map_err(|e| bad(&e))?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| bad(&e))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let transport = Arc::new(transport(config));
    server.transport_config(transport.clone());

    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| bad(&e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(braid_client::AnyServer(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| bad(&e))?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(transport);

    let socket = UdpSocket::bind(addr).map_err(|e| bad(&format_args!("cannot listen on {addr}: {e}")))?;
    let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
    let mut endpoint = quinn::Endpoint::new(quinn::EndpointConfig::default(), Some(server), socket, runtime)
        .map_err(|e| bad(&format_args!("cannot listen on {addr}: {e}")))?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

/// Every link's transport settings: a peer silent for `link_timeout_ms` is gone (keep-alives
/// at a quarter of that keep a quiet link up), and wide windows.
fn transport(config: &ClusterConfig) -> quinn::TransportConfig {
    let timeout = Duration::from_millis(config.link_timeout_ms);
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(quinn::IdleTimeout::try_from(timeout).ok());
    t.keep_alive_interval(Some(timeout / 4));
    t.stream_receive_window(STREAM_WINDOW.into());
    t.receive_window((4 * STREAM_WINDOW).into());
    t.send_window(4 * u64::from(STREAM_WINDOW));
    // Packets as large as the path takes (found by probing, up to a loopback's 64 KiB): each
    // packet costs its own encryption and bookkeeping, so fewer, larger ones cost less CPU.
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    t.max_concurrent_uni_streams(4u32.into());
    t.max_concurrent_bidi_streams(4u32.into());
    t
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
