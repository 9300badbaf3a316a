//! How to connect: [`ClientOptions`] and its parts.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use braid_proto::{Bytes, Properties, ProtocolVersion, QoS};

pub use crate::quic::QuicOptions;

/// The network transport. Every transport carries the same MQTT; only how bytes reach the
/// server differs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// MQTT over plain TCP.
    #[default]
    Tcp,
    /// MQTT over TLS (usually port 8883).
    Tls(TlsOptions),
    /// MQTT over WebSocket at `path` (usually `/mqtt`, subprotocol `mqtt`); over TLS (WSS)
    /// when `tls` is set.
    WebSocket {
        /// The HTTP path of the MQTT endpoint.
        path: String,
        /// TLS options for WSS; `None` for plain WebSocket.
        tls: Option<TlsOptions>,
    },
    /// MQTT over QUIC: the connection's first stream is the control stream;
    /// [`crate::Client::open_stream`] opens data streams.
    Quic(QuicOptions),
    /// MQTT over an in-memory stream to a server in the same process (host and port unused).
    InMemory(InMemory),
}

/// Opens an in-memory byte stream to a server in the same process, once per connection (a
/// broker's in-process clients, such as Braid's bridges, connect through it).
#[derive(Clone)]
pub struct InMemory(Arc<dyn Fn() -> io::Result<tokio::io::DuplexStream> + Send + Sync>);

impl InMemory {
    /// Streams that `open` makes, the server serving their other end.
    pub fn new(open: impl Fn() -> io::Result<tokio::io::DuplexStream> + Send + Sync + 'static) -> InMemory {
        InMemory(Arc::new(open))
    }

    pub(crate) fn open(&self) -> io::Result<tokio::io::DuplexStream> {
        (self.0)()
    }
}

impl fmt::Debug for InMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InMemory")
    }
}

impl PartialEq for InMemory {
    fn eq(&self, other: &InMemory) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for InMemory {}

/// How to open and check a TLS connection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TlsOptions {
    /// PEM CA certificates the server's certificate must chain to. Default none: the
    /// system's CA store.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for servers that ask for one (with `key`).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// Accept any server certificate and name (for self-signed test certificates only: this
    /// gives up the protection TLS offers against a man in the middle).
    pub insecure: bool,
    /// The name sent in SNI and checked against the certificate. Default: the host.
    pub server_name: Option<String>,
}

/// The will message the server publishes if the connection ends without a normal DISCONNECT.
#[derive(Clone, Debug, Default)]
pub struct Will {
    /// Topic the will is published to.
    pub topic: String,
    /// Will payload.
    pub payload: Bytes,
    /// Will QoS.
    pub qos: QoS,
    /// Whether the will is retained.
    pub retain: bool,
    /// v5 will properties (Will Delay Interval, Message Expiry Interval, Content Type, ...).
    pub properties: Properties,
}

/// Automatic reconnection with exponential backoff.
///
/// After a lost connection the client waits `initial_delay` (with ±25 % jitter), then doubles
/// the wait after every failed attempt up to `max_delay`. Reconnects resume the session
/// (Clean Start 0), resend unacknowledged publishes with DUP and PUBREL for released QoS 2
/// messages, and re-subscribe when the server no longer had the session.
#[derive(Clone, Debug)]
pub struct Reconnect {
    /// Wait before the first attempt.
    pub initial_delay: Duration,
    /// Longest wait between attempts.
    pub max_delay: Duration,
}

impl Default for Reconnect {
    fn default() -> Self {
        Reconnect { initial_delay: Duration::from_millis(100), max_delay: Duration::from_secs(30) }
    }
}

/// Where and how to connect.
///
/// The v5 fields (`session_expiry`, `receive_maximum`, `max_packet_size`,
/// `topic_alias_maximum`) become CONNECT properties when they differ from the protocol default
/// and then take precedence over the same property in `connect_properties`; 3.1.x connections
/// send no properties.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Server host name or address. Default `"127.0.0.1"`.
    pub host: String,
    /// Server port. Default 1883.
    pub port: u16,
    /// Transport. Default [`Transport::Tcp`].
    pub transport: Transport,
    /// Protocol version. Default v5; 3.1 and 3.1.1 are supported too.
    pub version: ProtocolVersion,
    /// Client identifier. Default empty: the server assigns one (a v5 Assigned Client
    /// Identifier is used for reconnects and reported in [`crate::Connected::client_id`]).
    pub client_id: String,
    /// Clean Start (v5) / Clean Session (3.1.x) on the first connect. Default true.
    pub clean_start: bool,
    /// Keep alive in seconds, 0 = off. Default 60. A v5 Server Keep Alive replaces it.
    pub keep_alive: u16,
    /// v5 Session Expiry Interval in seconds. Default none (the session ends with the
    /// connection).
    pub session_expiry: Option<u32>,
    /// User name.
    pub username: Option<String>,
    /// Password.
    pub password: Option<Bytes>,
    /// Will message.
    pub will: Option<Will>,
    /// Unacknowledged QoS 1/2 deliveries the server may have outstanding to us (v5 Receive
    /// Maximum). Default 65535. Deliveries are acknowledged when the application takes them
    /// from [`crate::Client::recv`], so this is a prefetch count. 3.1.x has no such property;
    /// acknowledging on take still applies, and the server's own window is the limit.
    pub receive_maximum: u16,
    /// Our unacknowledged outbound QoS 1/2 publishes; capped by the server's Receive Maximum.
    /// [`crate::Client::publish`] waits while the window is full. Default 65535; 0 counts as 1.
    pub max_inflight: u16,
    /// v5 Maximum Packet Size we accept; larger packets from the server close the connection.
    /// Default none (no limit beyond MQTT's own).
    pub max_packet_size: Option<u32>,
    /// Topic aliases the server may use towards us (v5); they are resolved before messages
    /// reach the application. Default 0 (none).
    pub topic_alias_maximum: u16,
    /// Extra v5 CONNECT properties (user properties, Request Problem Information, ...).
    pub connect_properties: Properties,
    /// Automatic reconnection. Default none: a lost connection ends the client.
    pub reconnect: Option<Reconnect>,
    /// Limit for opening the connection and receiving CONNACK. Default 10 s.
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            host: "127.0.0.1".into(),
            port: 1883,
            transport: Transport::Tcp,
            version: ProtocolVersion::V5,
            client_id: String::new(),
            clean_start: true,
            keep_alive: 60,
            session_expiry: None,
            username: None,
            password: None,
            will: None,
            receive_maximum: u16::MAX,
            max_inflight: u16::MAX,
            max_packet_size: None,
            topic_alias_maximum: 0,
            connect_properties: Properties::default(),
            reconnect: None,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl ClientOptions {
    /// Defaults for a server at `host:port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        ClientOptions { host: host.into(), port, ..Default::default() }
    }
}
