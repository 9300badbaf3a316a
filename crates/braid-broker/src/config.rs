//! Broker configuration: one TOML file, `BRAID_<SECTION>_<KEY>` environment variables and
//! `--set section.key=value` overrides, merged in that order. Every key has a default, so the
//! broker runs with no file at all. Every key is documented in `docs/configuration.md`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::transport_kind::{PerTransport, Transport};

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Network listeners.
    pub listeners: Listeners,
    /// Protocol limits and features.
    pub mqtt: MqttConfig,
    /// Session and queue settings.
    pub session: SessionConfig,
    /// Shared subscriptions.
    pub shared: SharedConfig,
    /// `$SYS` topics.
    pub sys: SysConfig,
    /// MQTT over QUIC.
    pub quic: QuicConfig,
    /// Logging.
    pub log: LogConfig,
    /// Authentication (see `docs/security.md`).
    pub auth: AuthConfig,
    /// Topic authorization rules.
    pub acl: AclConfig,
    /// Connection, rate, topic and memory limits.
    pub limits: LimitsConfig,
    /// Certificates for the TLS and WSS listeners.
    pub tls: TlsConfig,
    /// Persistence of sessions, queues and retained messages.
    pub store: StoreConfig,
    /// The threads that run connections.
    pub runtime: RuntimeConfig,
    /// Many nodes as one broker, on Redis (see `docs/cluster.md`).
    pub cluster: ClusterConfig,
    /// Bridges to other systems (see `docs/bridges.md`).
    pub bridges: BridgesConfig,
    /// The HTTP admin listener's authentication and limits (see `docs/api.md`).
    pub admin: AdminConfig,
}

/// The HTTP admin listener (`listeners.http`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// API keys (`braid apikey add FILE NAME`): when set, every request but
    /// `GET /api/v1/health` needs one, as a bearer token or as basic auth (user: the key's
    /// name). Required when `listeners.http` is not a loopback address.
    pub api_keys_file: Option<PathBuf>,
    /// Serve HTTPS with `tls.cert` and `tls.key`.
    pub tls: bool,
    /// Largest request body accepted (a publish's payload is in it), in bytes.
    pub max_body_bytes: usize,
    /// Where packet traces started from the API are written (default: `store.data_dir`/traces).
    pub trace_dir: Option<PathBuf>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig { api_keys_file: None, tls: false, max_body_bytes: 1024 * 1024, trace_dir: None }
    }
}

/// Network listeners.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Listeners {
    /// MQTT over TCP.
    pub tcp: SocketAddr,
    /// Seconds of silence (both ways) after which a plain-TCP connection parks: it gives up its
    /// task and buffers until bytes, a delivery or a close arrive. 0 = never.
    pub park_after_secs: u64,
    /// MQTT over TLS (off unless set; usually port 8883).
    pub tls: Option<SocketAddr>,
    /// MQTT over WebSocket (off unless set; e.g. port 8080).
    pub ws: Option<SocketAddr>,
    /// MQTT over WebSocket over TLS (off unless set; e.g. port 8084).
    pub wss: Option<SocketAddr>,
    /// The HTTP path WebSocket clients connect to.
    pub ws_path: String,
    /// MQTT over QUIC (UDP), when `quic.enabled`.
    pub quic: SocketAddr,
    /// The HTTP admin listener: Prometheus metrics, the REST API and the dashboard (see
    /// `docs/api.md`); `""` turns it off. Off loopback it needs `admin.api_keys_file`.
    #[serde(with = "optional_addr")]
    pub http: Option<SocketAddr>,
}

impl Default for Listeners {
    fn default() -> Self {
        Listeners {
            tcp: SocketAddr::from(([0, 0, 0, 0], 1883)),
            tls: None,
            ws: None,
            wss: None,
            ws_path: "/mqtt".into(),
            park_after_secs: 5,
            quic: SocketAddr::from(([0, 0, 0, 0], 14567)),
            http: Some(SocketAddr::from(([127, 0, 0, 1], 18083))),
        }
    }
}

/// An address that may be off: `""` in the file, the environment or a flag.
mod optional_addr {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(addr: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
        match addr {
            Some(a) => s.collect_str(a),
            None => s.serialize_str(""),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        match text.trim() {
            "" => Ok(None),
            t => t.parse().map(Some).map_err(|_| {
                serde::de::Error::custom(format!("{t:?} is not an IP:PORT address (\"\" turns it off)"))
            }),
        }
    }
}

/// Whether TLS clients must present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// A certificate is asked for; if one is sent it must verify against `tls.client_ca`.
    Optional,
    /// A certificate verifying against `tls.client_ca` is required.
    Require,
}

/// The lowest TLS version accepted: `"1.2"` or `"1.3"` (a bare `1.3` from a flag or the
/// environment is read as the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(try_from = "VersionText")]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    Tls13,
}

/// A TLS version as written: a string or a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum VersionText {
    Text(String),
    Number(f64),
}

impl TryFrom<VersionText> for TlsVersion {
    type Error = String;

    fn try_from(v: VersionText) -> Result<Self, String> {
        let text = match v {
            VersionText::Text(t) => t,
            VersionText::Number(n) => n.to_string(),
        };
        match text.as_str() {
            "1.2" => Ok(TlsVersion::Tls12),
            "1.3" => Ok(TlsVersion::Tls13),
            other => Err(format!("{other:?} is not a supported TLS version (\"1.2\" or \"1.3\")")),
        }
    }
}

/// Certificates for the TLS and WSS listeners (see `docs/transports.md`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// PEM CA certificates that client certificates are verified against.
    pub client_ca: Option<PathBuf>,
    /// Whether clients must present a certificate.
    pub client_auth: ClientAuth,
    /// The client certificate's CN (or first DNS/e-mail SAN) replaces the CONNECT user name.
    pub use_cn_as_username: bool,
    /// The lowest TLS version accepted.
    pub min_version: TlsVersion,
    /// Seconds between checks of the files' modification times (reload on change); 0 reloads
    /// on SIGHUP only.
    pub reload_interval_secs: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert: None,
            key: None,
            client_ca: None,
            client_auth: ClientAuth::None,
            use_cn_as_username: false,
            min_version: TlsVersion::Tls12,
            reload_interval_secs: 5,
        }
    }
}

/// MQTT over QUIC (see `docs/quic.md`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuicConfig {
    /// Listen for MQTT over QUIC on `listeners.quic`.
    pub enabled: bool,
    /// PEM certificate chain; empty: a self-signed certificate is generated at startup.
    pub cert_file: String,
    /// PEM private key of `cert_file`.
    pub key_file: String,
    /// Accept 0-RTT data from resuming clients.
    pub zero_rtt: bool,
    /// Let clients change address mid-connection (connection migration).
    pub migration: bool,
    /// Seconds without any packet after which a QUIC connection is dropped.
    pub idle_timeout_secs: u64,
    /// Pacing of what the broker sends to each QUIC client: `adaptive`, `off`, or packets per
    /// second (a number, or the number as a string: `25` and `"25"` are the same).
    #[serde(deserialize_with = "pacing_text")]
    pub pacing: String,
}

impl Default for QuicConfig {
    fn default() -> Self {
        QuicConfig {
            enabled: true,
            cert_file: String::new(),
            key_file: String::new(),
            zero_rtt: true,
            migration: true,
            idle_timeout_secs: 60,
            pacing: "adaptive".into(),
        }
    }
}

/// `quic.pacing` as text: a string as it is, a bare number (`--set quic.pacing=25`,
/// `BRAID_QUIC_PACING=25`, `pacing = 25` in the file) as its digits; `validate` checks it.
fn pacing_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = String;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("adaptive, off, or a number of packets per second")
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(Text)
}

/// Protocol limits and features.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttConfig {
    /// Largest packet accepted from a client, fixed header included.
    pub max_packet_size: u32,
    /// Largest keep alive granted; v5 clients asking for more (or 0) get Server Keep Alive.
    pub max_keep_alive: u16,
    /// Seconds a new socket has to send CONNECT.
    pub connect_timeout_secs: u64,
    /// Inbound QoS 2 publishes a client may have awaiting PUBREL (v5 Receive Maximum).
    pub receive_maximum: u16,
    /// Outbound unacknowledged QoS 1/2 deliveries per client (capped by the client's Receive Maximum).
    pub max_inflight: u16,
    /// Topic aliases a v5 client may use towards the broker.
    pub topic_alias_maximum: u16,
    /// Assign topic aliases to v5 subscribers that allow them.
    pub server_topic_aliases: bool,
    /// Whether retained messages are supported.
    pub retain_available: bool,
    /// Highest QoS accepted from publishers (0, 1 or 2).
    pub max_qos: u8,
    /// Accept an empty client id (the broker assigns one) when the session is clean.
    pub allow_empty_client_id: bool,
    /// What a v5 client with several subscriptions matching one message receives.
    pub overlapping: Overlapping,
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            max_packet_size: 268_435_455,
            max_keep_alive: 65_535,
            connect_timeout_secs: 10,
            receive_maximum: 1024,
            max_inflight: 1024,
            topic_alias_maximum: 64,
            server_topic_aliases: true,
            retain_available: true,
            max_qos: 2,
            allow_empty_client_id: true,
            overlapping: Overlapping::Single,
        }
    }
}

/// Deliveries to a v5 client with several subscriptions matching one message (MQTT 5 section
/// 3.3.4; 3.1.x clients always get one copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlapping {
    /// One copy at the highest granted QoS, with every matching Subscription Identifier.
    Single,
    /// One copy per matching subscription, each with its own Subscription Identifier.
    PerSubscription,
}

/// What to do with a delivery for a session whose queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverflowPolicy {
    /// Queue it anyway and stop reading from the publisher, holding its PUBACK/PUBREC, until
    /// the queue drains (QoS 1/2 to a connected client only; otherwise like `DropNewest`).
    Backpressure,
    /// Keep the queue, drop the message that does not fit.
    DropNewest,
    /// Drop the oldest queued message to make room.
    DropOldest,
}

/// Queue policies for the sessions of clients that connect through one listener; unset keys
/// keep `[session]`'s.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueuePolicy {
    /// Overrides `session.queue_overflow`.
    pub queue_overflow: Option<OverflowPolicy>,
    /// Overrides `session.queue_overflow_qos0`.
    pub queue_overflow_qos0: Option<OverflowPolicy>,
    /// Overrides `session.qos0_pacing_ms`.
    pub qos0_pacing_ms: Option<u64>,
}

/// Per-listener queue policies (`[session.listeners.<transport>]`).
pub type ListenerPolicies = PerTransport<QueuePolicy>;

/// Session and queue settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Messages queued per session beyond the in-flight window (offline or slow clients).
    pub max_queued_messages: usize,
    /// Bytes (topic plus payload) queued per session.
    pub max_queued_bytes: usize,
    /// Also queue QoS 0 messages for offline sessions.
    pub queue_qos0: bool,
    /// What to do with a QoS 1/2 delivery when the queue is full; drops are counted.
    pub queue_overflow: OverflowPolicy,
    /// What to do with a QoS 0 delivery when the queue is full; drops are counted.
    pub queue_overflow_qos0: OverflowPolicy,
    /// Seconds a publisher may be held by a connected subscriber's full queue before that
    /// subscriber is disconnected (0x97) so the others can go on; 0 never disconnects.
    pub slow_consumer_timeout_secs: u64,
    /// Milliseconds a connected subscriber that falls behind may pace QoS 0 publishers
    /// (nothing more is read from them until it catches up), counted from when its backlog
    /// began; after that its QoS 0 deliveries queue and drop by `queue_overflow_qos0` until
    /// its queue empties. 0 never paces.
    pub qos0_pacing_ms: u64,
    /// Overrides of the three settings above for clients of one listener: a session follows
    /// the listener its client last connected through.
    pub listeners: ListenerPolicies,
    /// Upper bound on the Session Expiry Interval a client may ask for (seconds).
    pub max_session_expiry_secs: u32,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            max_queued_messages: 1000,
            max_queued_bytes: 16 * 1024 * 1024,
            queue_qos0: false,
            queue_overflow: OverflowPolicy::Backpressure,
            queue_overflow_qos0: OverflowPolicy::DropNewest,
            slow_consumer_timeout_secs: 60,
            qos0_pacing_ms: 1000,
            listeners: ListenerPolicies::default(),
            max_session_expiry_secs: u32::MAX,
        }
    }
}

/// How a shared subscription group picks the member for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SharedStrategy {
    /// Members in turn.
    #[default]
    RoundRobin,
    /// A random member.
    Random,
    /// The member picked by a hash of the publisher's client id.
    HashClientid,
    /// The member picked by a hash of the topic.
    HashTopic,
    /// The same member until it goes away.
    Sticky,
}

/// Shared subscriptions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharedConfig {
    /// Member selection strategy for every group.
    pub strategy: SharedStrategy,
}

/// `$SYS` topics.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SysConfig {
    /// Seconds between `$SYS` updates; 0 turns them off.
    pub interval_secs: u64,
}

impl Default for SysConfig {
    fn default() -> Self {
        SysConfig { interval_secs: 10 }
    }
}

/// The threads that run connections.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Worker threads; 0 = one per CPU core but one, at least one (see
    /// [`RuntimeConfig::workers`]).
    pub worker_threads: usize,
}

impl RuntimeConfig {
    /// The worker threads to start on a machine with `cores` cores. The automatic choice
    /// leaves a core to the kernel's network processing and the broker's helper threads: on 2
    /// cores, one worker used less CPU per message than two and answered sooner at low load in
    /// every case measured, since no message crosses threads (docs/architecture.md, "Threads").
    pub fn workers(&self, cores: usize) -> usize {
        match self.worker_threads {
            0 => cores.saturating_sub(1).max(1),
            n => n,
        }
    }
}

/// Logging.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter such as `info` or `braid_broker=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".into() }
    }
}

/// Authentication: who may connect. Methods are tried in the order of `docs/security.md`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Accept clients that send neither user name nor password.
    pub allow_anonymous: bool,
    /// Password file written by `braid passwd` (none when absent).
    pub password_file: Option<PathBuf>,
    /// Seconds between checks of the password and ACL files for changes; 0 = only on SIGHUP.
    pub reload_interval_secs: u64,
    /// Key for JSON Web Tokens in the password field: the shared secret (HS256) or a PEM public
    /// key (RS256, ES256). JWT is off when absent.
    pub jwt_key_file: Option<PathBuf>,
    /// `HS256`, `RS256` or `ES256`.
    pub jwt_algorithm: String,
    /// The claim that carries the client's ACL (absent claim: the ACL rules file applies).
    pub jwt_acl_claim: String,
    /// `http://host:port/path` asked (POST JSON) about credentials no other method knows.
    pub http_url: Option<String>,
    /// Milliseconds the HTTP hook may take; a slower answer denies.
    pub http_timeout_ms: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            allow_anonymous: true,
            password_file: None,
            reload_interval_secs: 2,
            jwt_key_file: None,
            jwt_algorithm: "HS256".into(),
            jwt_acl_claim: "acl".into(),
            http_url: None,
            http_timeout_ms: 2000,
        }
    }
}

/// What applies when no ACL rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AclPolicy {
    /// Allow.
    Allow,
    /// Deny.
    #[default]
    Deny,
}

/// What a denied PUBLISH from an MQTT 3.1.x client does (v5 clients get reason 0x87).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeniedPublish {
    /// Acknowledge (QoS 1/2) and drop it; counted.
    #[default]
    Drop,
    /// Close the connection.
    Disconnect,
}

/// Topic authorization.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AclConfig {
    /// The rules file (no file: every topic is allowed except publishing under `$SYS`).
    pub file: Option<PathBuf>,
    /// Policy when no rule matches.
    pub default_policy: AclPolicy,
    /// What a denied PUBLISH from a 3.1.x client does.
    pub v3_denied_publish: DeniedPublish,
}

/// Connection, rate, topic and memory limits; 0 means unlimited where noted.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Open client connections at once (0 = unlimited); more are closed when accepted.
    pub max_connections: usize,
    /// New connections accepted per second (0 = unlimited); more wait in the listen backlog.
    pub max_connection_rate: u32,
    /// PUBLISH packets per second per client (0 = unlimited); excess is slowed, not dropped.
    pub publish_rate: u32,
    /// PUBLISH bytes (topic plus payload) per second per client (0 = unlimited).
    pub publish_bytes_rate: u64,
    /// Longest topic name or filter, bytes.
    pub max_topic_length: usize,
    /// Most levels in a topic name or filter.
    pub max_topic_levels: usize,
    /// Subscriptions per client (0 = unlimited).
    pub max_subscriptions: usize,
    /// Resident memory, bytes, above which publishers are not read from (0 = off).
    pub memory_high_watermark: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_connections: 0,
            max_connection_rate: 0,
            publish_rate: 0,
            publish_bytes_rate: 0,
            max_topic_length: 65_535,
            max_topic_levels: 128,
            max_subscriptions: 0,
            memory_high_watermark: 0,
        }
    }
}

/// Where sessions, queues and retained messages are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreBackend {
    /// In an append-only log under `data_dir`, reloaded at restart.
    Disk,
    /// In memory only: fastest, lost at restart.
    Memory,
}

/// When an acknowledged message is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// PUBACK/PUBREC only after the message is fsynced (group commit).
    Sync,
    /// Acknowledge at once; fsync every `flush_interval_ms`.
    Async,
}

/// Persistence settings (see `docs/persistence.md`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Disk (default) or memory.
    pub backend: StoreBackend,
    /// Directory of the disk store, created if missing.
    pub data_dir: std::path::PathBuf,
    /// Sync (acknowledge after fsync) or async (fsync every `flush_interval_ms`).
    pub durability: Durability,
    /// Async durability: longest time between two fsyncs, in milliseconds.
    pub flush_interval_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: StoreBackend::Disk,
            data_dir: "braid-data".into(),
            durability: Durability::Sync,
            flush_interval_ms: 100,
        }
    }
}

/// What a node cut off from Redis for three quarters of its lease does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionPolicy {
    /// Closes its connections with 0x9C (Use another server) and refuses new ones until Redis
    /// is back: no split brain.
    Refuse,
    /// Keeps serving its own clients (availability over consistency): two nodes may then
    /// both serve one client id, and cross-node traffic waits.
    Serve,
}

/// Cluster settings (see `docs/cluster.md`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Run as a node of a cluster. Off: a single broker, no Redis needed.
    pub enabled: bool,
    /// This node's name, unique in the cluster.
    pub node: String,
    /// Redis URL(s): one `redis://` or `rediss://` URL, or the seed URLs of a Redis Cluster.
    #[serde(deserialize_with = "one_or_many")]
    pub redis: Vec<String>,
    /// Prefix of every Redis key the cluster uses (several clusters can share a Redis).
    pub key_prefix: String,
    /// A node's lease in Redis, in milliseconds: a node not heard from for this long is dead,
    /// and its clients' sessions may be taken over.
    pub lease_ms: u64,
    /// What a node cut off from Redis for three quarters of its lease does.
    pub on_partition: PartitionPolicy,
    /// How long a CONNECT waits for the node that holds its session to hand it over, in
    /// milliseconds; a node that does not answer is waited for until its lease lapses, then
    /// taken over.
    pub takeover_timeout_ms: u64,
    /// Most writes to Redis in one round trip, and most inbox entries read at once.
    pub batch: usize,
    /// CA certificate (PEM) for `rediss://` URLs; empty: the system's roots.
    pub ca_file: String,
    /// UDP address the node's links (QUIC) listen on for its peers; empty: no links, every
    /// message between nodes goes through Redis.
    pub listen: String,
    /// The address other nodes dial for this node's links; empty: the listen address, or with
    /// an unspecified IP (`0.0.0.0`) this host's address towards Redis.
    pub advertise: String,
    /// The secret every node shares: it authenticates the links (required with `listen`).
    pub secret: String,
    /// How long a peer may stay silent while messages wait for its acknowledgement, in
    /// milliseconds, before its link is dropped and they go through its Redis inbox.
    pub link_timeout_ms: u64,
    /// The address clients are sent to for this node (a v5 Server Reference, when another
    /// node drains or rebalances); empty: the TCP listener's port on its IP or, with an
    /// unspecified IP, on the host of the links' advertised address.
    pub server_reference: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            node: String::new(),
            redis: vec!["redis://127.0.0.1:6379".into()],
            key_prefix: "braid".into(),
            lease_ms: 10_000,
            on_partition: PartitionPolicy::Refuse,
            takeover_timeout_ms: 3_000,
            batch: 512,
            ca_file: String::new(),
            listen: "0.0.0.0:4370".into(),
            advertise: String::new(),
            secret: String::new(),
            link_timeout_ms: 2_000,
            server_reference: String::new(),
        }
    }
}

/// Bridges to other systems (see `docs/bridges.md`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BridgesConfig {
    /// Bridges to Kafka (`[[bridges.kafka]]`).
    pub kafka: Vec<KafkaBridgeConfig>,
    /// Bridges to other MQTT brokers (`[[bridges.mqtt]]`).
    pub mqtt: Vec<MqttBridgeConfig>,
}

/// One bridge between Braid and a Kafka cluster (`[[bridges.kafka]]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaBridgeConfig {
    /// The bridge's name: unique, in its `$SYS` topics, logs and its outbox's client id; the
    /// consumer group of its `in` topics unless they name one.
    pub name: String,
    /// Bootstrap brokers, `host:port`.
    #[serde(deserialize_with = "one_or_many")]
    pub brokers: Vec<String>,
    /// When the MQTT publisher of a message bridged out is acknowledged: `log`, once the
    /// message is in Braid's outbox (durable as any persistent session's queue); `kafka`, once
    /// Kafka has it (no outbox).
    pub ack: KafkaAck,
    /// The Kafka `client.id`; empty: `braid-<name>`.
    pub client_id: String,
    /// Compression of produced batches: `none`, `gzip`, `snappy`, `lz4` or `zstd`.
    pub compression: String,
    /// How long the producer waits to fill a batch, in milliseconds.
    pub linger_ms: u64,
    /// Largest record the producer sends (Kafka's `message.max.bytes`); a larger message is
    /// not bridged (logged and counted).
    pub max_record_bytes: usize,
    /// How long the producer keeps retrying a record while Kafka is away, in milliseconds;
    /// then the outbox resends it (nothing is dropped).
    pub delivery_timeout_ms: u64,
    /// `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl`.
    pub security_protocol: String,
    /// SASL mechanism: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub sasl_mechanism: String,
    /// SASL user name.
    pub sasl_username: String,
    /// SASL password.
    pub sasl_password: String,
    /// CA certificate (PEM) the brokers' certificates must chain to (TLS); empty: the
    /// system's roots.
    pub ca_file: String,
    /// Client certificate (PEM) for TLS client authentication; with `key_file`.
    pub cert_file: String,
    /// The client certificate's private key (PEM).
    pub key_file: String,
    /// Further librdkafka settings, passed as they are (e.g. `"socket.keepalive.enable" =
    /// "true"`); they override the keys above.
    pub properties: std::collections::BTreeMap<String, String>,
    /// Messages the outbox holds for Kafka (while Kafka is slow or away).
    pub max_queued_messages: usize,
    /// Bytes (topic plus payload) the outbox holds for Kafka.
    pub max_queued_bytes: usize,
    /// What to do with a message when the outbox is full (counted): `backpressure` (hold the
    /// publishers), `drop_newest` or `drop_oldest`.
    pub queue_overflow: OverflowPolicy,
    /// MQTT to Kafka (`[[bridges.kafka.out]]`).
    pub out: Vec<KafkaOut>,
    /// Kafka to MQTT (`[[bridges.kafka.in]]`).
    #[serde(rename = "in")]
    pub inbound: Vec<KafkaIn>,
}

impl Default for KafkaBridgeConfig {
    fn default() -> Self {
        KafkaBridgeConfig {
            name: String::new(),
            brokers: Vec::new(),
            ack: KafkaAck::Log,
            client_id: String::new(),
            compression: "lz4".into(),
            linger_ms: 5,
            max_record_bytes: 1_000_000,
            delivery_timeout_ms: 120_000,
            security_protocol: "plaintext".into(),
            sasl_mechanism: String::new(),
            sasl_username: String::new(),
            sasl_password: String::new(),
            ca_file: String::new(),
            cert_file: String::new(),
            key_file: String::new(),
            properties: Default::default(),
            max_queued_messages: 100_000,
            max_queued_bytes: 64 * 1024 * 1024,
            queue_overflow: OverflowPolicy::Backpressure,
            out: Vec::new(),
            inbound: Vec::new(),
        }
    }
}

/// When a Kafka bridge acknowledges the MQTT publisher of a message it bridges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaAck {
    /// Once the message is in the bridge's outbox in Braid's store.
    Log,
    /// Once Kafka acknowledged every record of the message (no outbox).
    Kafka,
}

/// MQTT messages to bridge to Kafka (`[[bridges.kafka.out]]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaOut {
    /// MQTT topic filter (wildcards allowed).
    pub filter: String,
    /// Kafka topic, a template: `${topic}` is the MQTT topic, `${1}`, `${2}`... its levels.
    pub topic: String,
    /// Record key, a template as `topic`; empty: no key.
    pub key: String,
    /// The QoS the outbox subscribes with: 1 or 2 are kept in the outbox until Kafka has the
    /// record; 0 is sent at most once.
    pub qos: u8,
}

impl Default for KafkaOut {
    fn default() -> Self {
        KafkaOut { filter: String::new(), topic: String::new(), key: "${topic}".into(), qos: 1 }
    }
}

/// Kafka records to publish in Braid (`[[bridges.kafka.in]]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaIn {
    /// Kafka topic to consume.
    pub topic: String,
    /// MQTT topic to publish to, a template: `${key}` is the record's key, `${topic}` the
    /// Kafka topic, `${partition}` its partition.
    pub mqtt_topic: String,
    /// QoS of the PUBLISH.
    pub qos: u8,
    /// RETAIN flag of the PUBLISH.
    pub retain: bool,
    /// Consumer group; empty: the bridge's name.
    pub group: String,
}

impl Default for KafkaIn {
    fn default() -> Self {
        KafkaIn {
            topic: String::new(),
            mqtt_topic: String::new(),
            qos: 1,
            retain: false,
            group: String::new(),
        }
    }
}

/// One bridge between Braid and another MQTT broker (`[[bridges.mqtt]]`), with Mosquitto's
/// semantics and, where they exist, its names.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttBridgeConfig {
    /// The bridge's name: unique, in its `$SYS` topics, logs, its in-process client's id and
    /// the default remote client id.
    pub name: String,
    /// The remote broker, `host:port` (`[v6 address]:port`); without a port, the transport's
    /// usual one.
    pub address: String,
    /// `tcp`, `tls`, `ws`, `wss` or `quic`.
    pub transport: String,
    /// HTTP path of the remote's MQTT endpoint (`ws`, `wss`).
    pub ws_path: String,
    /// Mosquitto's `topic` lines: `pattern [[[ out | in | both ] qos] local-prefix remote-prefix]`,
    /// `""` for an empty pattern or prefix.
    #[serde(deserialize_with = "one_or_many")]
    pub topic: Vec<String>,
    /// `mqttv5` (or Mosquitto's `mqttv50`) or `mqttv311`.
    pub protocol_version: String,
    /// The remote client id; empty: `braid-<name>`. In a cluster `-<node>` is appended.
    pub client_id: String,
    /// Mosquitto's `cleansession`: false keeps the bridge's session (subscriptions, messages
    /// in flight) on the remote across reconnects.
    pub clean_start: bool,
    /// Keep alive towards the remote, in seconds.
    pub keep_alive: u16,
    /// User name on the remote.
    pub username: String,
    /// Password on the remote.
    pub password: String,
    /// Publish `1` / `0` (retained) on `notification_topic` in Braid when the remote connects
    /// / goes away.
    pub notifications: bool,
    /// Empty: `$SYS/broker/connection/<remote client id>/state`.
    pub notification_topic: String,
    /// Mosquitto's bridge flag in a 3.1.1 CONNECT; accepted, not sent (see `docs/bridges.md`).
    pub try_private: bool,
    /// PEM CA certificate(s) the remote's certificate must chain to (`tls`, `wss`, `quic`);
    /// empty: the system's roots.
    pub ca_file: String,
    /// PEM client certificate for the remote (`tls`, `wss`); with `key_file`.
    pub cert_file: String,
    /// The client certificate's private key (PEM).
    pub key_file: String,
    /// Accept any certificate from the remote (self-signed test brokers only).
    pub insecure: bool,
    /// Longest pause between reconnect attempts, in seconds (Mosquitto's `restart_timeout`).
    pub restart_timeout_secs: u64,
    /// Messages the outbox holds for the remote while it is slow or away.
    pub max_queued_messages: usize,
    /// Bytes (topic plus payload) the outbox holds.
    pub max_queued_bytes: usize,
    /// What a full outbox does: `backpressure` (hold the publishers), `drop_newest` or
    /// `drop_oldest`.
    pub queue_overflow: OverflowPolicy,
    /// QUIC only: a `topic` line's pattern -> the priority of its data stream (default 0;
    /// higher first).
    pub priorities: std::collections::BTreeMap<String, i32>,
}

impl Default for MqttBridgeConfig {
    fn default() -> Self {
        MqttBridgeConfig {
            name: String::new(),
            address: String::new(),
            transport: "tcp".into(),
            ws_path: "/mqtt".into(),
            topic: Vec::new(),
            protocol_version: "mqttv5".into(),
            client_id: String::new(),
            clean_start: false,
            keep_alive: 60,
            username: String::new(),
            password: String::new(),
            notifications: true,
            notification_topic: String::new(),
            try_private: true,
            ca_file: String::new(),
            cert_file: String::new(),
            key_file: String::new(),
            insecure: false,
            restart_timeout_secs: 5,
            max_queued_messages: 100_000,
            max_queued_bytes: 64 * 1024 * 1024,
            queue_overflow: OverflowPolicy::Backpressure,
            priorities: Default::default(),
        }
    }
}

/// Accepts one string or a list of strings.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// A configuration that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A key with a value of the wrong type, an unknown key, or a value out of range.
    #[error("{key}: {problem}")]
    Key {
        /// The key, as `section.key`.
        key: String,
        /// What is wrong with it, and where the value came from (unless it is a default).
        problem: String,
    },
    /// The configuration file does not exist or cannot be read.
    #[error("config file {}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why it cannot be read.
        #[source]
        source: std::io::Error,
    },
    /// A `--set` item without `=`.
    #[error("--set {item:?}: expected section.key=value")]
    SetSyntax {
        /// The item as given.
        item: String,
    },
    /// Input that does not parse, at no key (a TOML syntax error).
    #[error("{problem}")]
    Parse {
        /// What is wrong, with the line and where the input came from.
        problem: String,
    },
}

impl ConfigError {
    /// `key` has a value that is not acceptable.
    pub fn invalid(key: impl Into<String>, problem: impl std::fmt::Display) -> ConfigError {
        ConfigError::Key { key: key.into(), problem: problem.to_string() }
    }

    /// The key at fault, as `section.key`, when there is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Key { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Figment's errors, the first one's key path as the key; further errors (there are
    /// several when more than one source fails) follow in the problem.
    fn from_figment(err: figment::Error) -> ConfigError {
        let mut key = None;
        let mut problems = Vec::new();
        for e in err {
            let at = e.path.join(".");
            let mut problem = describe(&e.kind, &e.path);
            if let Some(from) = e.metadata.as_ref().and_then(|m| origin(m, &e.path)) {
                problem = format!("{problem} (from {from})");
            }
            if key.is_none() {
                key = Some(at);
                problems.push(problem);
            } else if at.is_empty() {
                problems.push(problem);
            } else {
                problems.push(format!("{at}: {problem}"));
            }
        }
        let problem = problems.join("; ");
        match key {
            Some(key) if !key.is_empty() => ConfigError::Key { key, problem },
            _ => ConfigError::Parse { problem },
        }
    }

    /// A [`ConfigError::Key`] found on the merged configuration (by `validate`), with where
    /// the key's value came from, as figment's own errors say it; a default says nothing more.
    fn with_origin(self, figment: &Figment) -> ConfigError {
        match self {
            ConfigError::Key { key, problem } => {
                let path: Vec<&str> = key.split('.').collect();
                let problem = match figment.find_metadata(&key).and_then(|m| origin(m, &path)) {
                    Some(from) => format!("{problem} (from {from})"),
                    None => problem,
                };
                ConfigError::Key { key, problem }
            }
            other => other,
        }
    }
}

/// The names errors give to the sources of values (see [`origin`]).
const FROM_FILE: &str = "TOML file";
const FROM_ENV: &str = "environment variable";
const FROM_FLAG: &str = "--set/--listen flag";

/// The environment's metadata: errors name the variable, `section.key` is `BRAID_SECTION_KEY`.
fn env_metadata() -> figment::Metadata {
    figment::Metadata::named(FROM_ENV).interpolater(|_: &figment::Profile, keys: &[&str]| {
        format!("BRAID_{}", keys.join("_")).to_ascii_uppercase()
    })
}

/// Where the value at `path` came from, as `TOML file PATH`, `environment variable
/// BRAID_SECTION_KEY` or `--set/--listen flag`; `None` for a default.
fn origin(metadata: &figment::Metadata, path: &[impl AsRef<str>]) -> Option<String> {
    match (metadata.name.as_ref(), &metadata.source) {
        (FROM_ENV, _) => {
            Some(format!("{FROM_ENV} {}", metadata.interpolate(&figment::Profile::Default, path)))
        }
        (name @ (FROM_FILE | FROM_FLAG), Some(source)) => Some(format!("{name} {source}")),
        (name @ (FROM_FILE | FROM_FLAG), None) => Some(name.to_string()),
        _ => None,
    }
}

/// A figment error's problem, in words: unknown keys and values get the closest known one
/// ("did you mean"), or the known ones listed (figment's own text nests backticks).
fn describe(kind: &figment::error::Kind, path: &[String]) -> String {
    use figment::error::Kind;
    match kind {
        Kind::UnknownField(found, known) => {
            // The path ends with the unknown key itself.
            let parent = match path.split_last() {
                Some((last, parent)) if last == found => parent,
                _ => path,
            };
            let full =
                |name: &str| parent.iter().map(String::as_str).chain([name]).collect::<Vec<_>>().join(".");
            let what = if parent.is_empty() { "section" } else { "key" };
            match closest(found, known) {
                Some(near) => format!("unknown {what}; did you mean {}?", full(near)),
                None if parent.is_empty() => {
                    format!("unknown section; the sections are {}", list(known, "and"))
                }
                None => format!("unknown key; the keys of {} are {}", parent.join("."), list(known, "and")),
            }
        }
        Kind::UnknownVariant(found, known) => match closest(found, known) {
            Some(near) => format!("unknown value {found:?}; did you mean {near}?"),
            None => format!("unknown value {found:?}; expected {}", list(known, "or")),
        },
        other => other.to_string(),
    }
}

/// `a, b and c` (or `a, b or c`, with `conjunction` "or").
fn list(items: &[&str], conjunction: &str) -> String {
    match items {
        [] => "none".into(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} {conjunction} {last}", init.join(", ")),
    }
}

/// The candidate nearest to `word` by Levenshtein distance (the fewest insertions, deletions
/// and substitutions), if it is near enough to be a typo: at most a third of the word's length
/// away (at least 1, at most 3).
fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).clamp(1, 3);
    candidates
        .iter()
        .map(|c| (strsim::levenshtein(word, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

const SECTIONS: [&str; 16] = [
    "listeners",
    "mqtt",
    "session",
    "shared",
    "sys",
    "quic",
    "log",
    "auth",
    "acl",
    "limits",
    "tls",
    "store",
    "runtime",
    "cluster",
    "bridges",
    "admin",
];

impl Config {
    /// Loads defaults, then `file` (if any), then `BRAID_*` environment variables, then
    /// `overrides` of the form `section.key=value` (value in TOML syntax; bare words are strings).
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ConfigError::File { path: path.to_path_buf(), source })?;
            let metadata = figment::Metadata::from(FROM_FILE, path);
            figment = figment.merge(Named { provider: Toml::string(&text), metadata });
        }
        let env = Env::prefixed("BRAID_").filter_map(|key| {
            let key = key.as_str().to_ascii_lowercase();
            SECTIONS.iter().find_map(|section| {
                key.strip_prefix(section)
                    .and_then(|rest| rest.strip_prefix('_'))
                    .map(|rest| format!("{section}.{rest}").into())
            })
        });
        figment = figment.merge(Named { provider: env, metadata: env_metadata() });
        for item in overrides {
            let (key, value) =
                item.split_once('=').ok_or_else(|| ConfigError::SetSyntax { item: item.clone() })?;
            figment = figment.merge(Named {
                provider: Serialized::default(key.trim(), parse_value(value.trim())),
                metadata: figment::Metadata::named(FROM_FLAG),
            });
        }
        let config: Config = figment.extract().map_err(ConfigError::from_figment)?;
        config.validate().map_err(|e| e.with_origin(&figment))?;
        Ok(config)
    }

    /// Defaults for a broker embedded in a program or a test: MQTT over TCP and over QUIC (and
    /// the HTTP admin listener, for programs that serve it) on free loopback ports (see
    /// `Running::addr` and `Running::quic_addr`), no `$SYS` traffic, the memory store (nothing
    /// written to the working directory; set `store.backend` to `Disk` with a `data_dir` to
    /// persist).
    pub fn embedded() -> Config {
        let mut config = Config::default();
        config.listeners.tcp = SocketAddr::from(([127, 0, 0, 1], 0));
        config.listeners.quic = SocketAddr::from(([127, 0, 0, 1], 0));
        config.listeners.http = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.sys.interval_secs = 0;
        config.store.backend = StoreBackend::Memory;
        config
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, problem: &str| Err(ConfigError::invalid(key, problem));
        if self.mqtt.max_qos > 2 {
            return bad("mqtt.max_qos", "must be 0, 1 or 2");
        }
        if self.mqtt.receive_maximum == 0 {
            return bad("mqtt.receive_maximum", "must be at least 1");
        }
        if self.mqtt.max_inflight == 0 {
            return bad("mqtt.max_inflight", "must be at least 1");
        }
        if !(16..=268_435_455).contains(&self.mqtt.max_packet_size) {
            return bad("mqtt.max_packet_size", "must be between 16 and 268435455");
        }
        if self.mqtt.connect_timeout_secs == 0 {
            return bad("mqtt.connect_timeout_secs", "must be at least 1");
        }
        let qos0_policies = std::iter::once((
            "session.queue_overflow_qos0".to_string(),
            Some(self.session.queue_overflow_qos0),
        ))
        .chain(Transport::ALL.map(|t| {
            (
                format!("session.listeners.{}.queue_overflow_qos0", t.name()),
                self.session.listeners.get(t).queue_overflow_qos0,
            )
        }));
        for (key, policy) in qos0_policies {
            if policy == Some(OverflowPolicy::Backpressure) {
                return bad(&key, "must be drop_newest or drop_oldest (backpressure is for QoS 1/2)");
            }
        }
        if self.session.max_queued_messages == 0 {
            return bad("session.max_queued_messages", "must be at least 1");
        }
        if self.session.max_queued_bytes == 0 {
            return bad("session.max_queued_bytes", "must be at least 1");
        }
        if self.quic.cert_file.is_empty() != self.quic.key_file.is_empty() {
            let missing = if self.quic.cert_file.is_empty() { "quic.cert_file" } else { "quic.key_file" };
            return bad(missing, "quic.cert_file and quic.key_file go together: set both or neither");
        }
        if let Err(e) = self.quic.pacing.parse::<braid_pacing::Pacing>() {
            return bad("quic.pacing", &e);
        }
        if self.quic.idle_timeout_secs == 0 {
            return bad("quic.idle_timeout_secs", "must be at least 1");
        }
        if self.mqtt.max_keep_alive == 0 {
            return bad("mqtt.max_keep_alive", "must be at least 1");
        }
        if !["HS256", "RS256", "ES256"].contains(&self.auth.jwt_algorithm.as_str()) {
            return bad("auth.jwt_algorithm", "must be HS256, RS256 or ES256");
        }
        if self.auth.http_timeout_ms == 0 {
            return bad("auth.http_timeout_ms", "must be at least 1");
        }
        if self.limits.max_topic_length == 0 {
            return bad("limits.max_topic_length", "must be at least 1");
        }
        if self.limits.max_topic_levels == 0 {
            return bad("limits.max_topic_levels", "must be at least 1");
        }
        if !self.listeners.ws_path.starts_with('/') {
            return bad("listeners.ws_path", "must start with /");
        }
        let tls_listener = [("listeners.tls", self.listeners.tls), ("listeners.wss", self.listeners.wss)]
            .into_iter()
            .find(|(_, addr)| addr.is_some());
        if let Some((listener, _)) = tls_listener {
            let missing = [("tls.cert", &self.tls.cert), ("tls.key", &self.tls.key)]
                .into_iter()
                .find_map(|(key, path)| path.is_none().then_some(key));
            if let Some(key) = missing {
                return bad(key, &format!("{listener} is set: tls.cert and tls.key are required"));
            }
        }
        if self.tls.client_auth != ClientAuth::None && self.tls.client_ca.is_none() {
            return bad("tls.client_ca", "required when tls.client_auth is optional or require");
        }
        if self.tls.use_cn_as_username && self.tls.client_auth == ClientAuth::None {
            return bad("tls.use_cn_as_username", "needs tls.client_auth = optional or require");
        }
        if self.store.flush_interval_ms == 0 {
            return bad("store.flush_interval_ms", "must be at least 1");
        }
        if self.store.data_dir.as_os_str().is_empty() {
            return bad("store.data_dir", "must not be empty");
        }
        self.validate_admin()?;
        self.cluster.validate()
    }
}

impl Config {
    fn validate_admin(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, problem: &str| Err(ConfigError::invalid(key, problem));
        let Some(addr) = self.listeners.http else { return Ok(()) };
        if !addr.ip().is_loopback() && self.admin.api_keys_file.is_none() {
            return bad(
                "listeners.http",
                &format!(
                    "{addr} is not a loopback address: set admin.api_keys_file (keys made with \
                     `braid apikey add FILE NAME`) so that only holders of a key can use the API"
                ),
            );
        }
        if self.admin.tls && (self.tls.cert.is_none() || self.tls.key.is_none()) {
            return bad("admin.tls", "needs tls.cert and tls.key");
        }
        if self.admin.max_body_bytes == 0 {
            return bad("admin.max_body_bytes", "must be at least 1");
        }
        Ok(())
    }
}

impl ClusterConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, problem: &str| Err(ConfigError::invalid(key, problem));
        if !self.enabled {
            return Ok(());
        }
        if self.node.is_empty() {
            return bad("cluster.node", "required when cluster.enabled: a name unique in the cluster");
        }
        let name_ok = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if self.node.len() > 64 || !name_ok(&self.node) {
            return bad("cluster.node", "at most 64 letters, digits, '-', '_' or '.'");
        }
        if self.key_prefix.is_empty() || !name_ok(&self.key_prefix) {
            return bad("cluster.key_prefix", "must be letters, digits, '-', '_' or '.'");
        }
        if self.redis.is_empty() {
            return bad("cluster.redis", "required when cluster.enabled: a redis:// or rediss:// URL");
        }
        if let Some(url) =
            self.redis.iter().find(|u| !(u.starts_with("redis://") || u.starts_with("rediss://")))
        {
            return bad("cluster.redis", &format!("{url:?} is not a redis:// or rediss:// URL"));
        }
        if self.lease_ms < 1000 {
            return bad("cluster.lease_ms", "must be at least 1000");
        }
        if self.takeover_timeout_ms == 0 {
            return bad("cluster.takeover_timeout_ms", "must be at least 1");
        }
        if self.batch == 0 {
            return bad("cluster.batch", "must be at least 1");
        }
        if self.listen.is_empty() {
            return Ok(());
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return bad("cluster.listen", &format!("{:?} is not IP:PORT (empty: no links)", self.listen));
        }
        if !self.advertise.is_empty() && !self.advertise.contains(':') {
            return bad("cluster.advertise", &format!("{:?} is not HOST:PORT", self.advertise));
        }
        if self.secret.len() < 16 {
            return bad(
                "cluster.secret",
                "required when cluster.listen is set: at least 16 characters, the same on every node \
                 (it authenticates the links between nodes)",
            );
        }
        if self.link_timeout_ms < 100 {
            return bad("cluster.link_timeout_ms", "must be at least 100");
        }
        Ok(())
    }
}

/// A `--set` value: TOML syntax when it parses as such, else the raw text as a string.
fn parse_value(text: &str) -> toml::Value {
    format!("v = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_string()))
}

/// A figment provider under the name errors give as the value's source (see [`origin`]): the
/// config file (read here, so that a missing one is a [`ConfigError::File`]), the environment
/// or a `--set` flag.
struct Named<P> {
    provider: P,
    metadata: figment::Metadata,
}

impl<P: figment::Provider> figment::Provider for Named<P> {
    fn metadata(&self) -> figment::Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        self.provider.data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn workers_leave_a_core_unless_told() {
        let auto = RuntimeConfig::default();
        assert_eq!((auto.workers(1), auto.workers(2), auto.workers(16)), (1, 1, 15));
        assert_eq!(RuntimeConfig { worker_threads: 4 }.workers(2), 4);
        let c = Config::load(None, &["runtime.worker_threads=3".into()]).unwrap();
        assert_eq!(c.runtime.worker_threads, 3);
    }

    #[test]
    fn defaults_load_without_a_file() {
        let c = Config::load(None, &[]).unwrap();
        assert_eq!(c.listeners.tcp.port(), 1883);
        assert_eq!(c.session.max_queued_messages, 1000);
    }

    #[test]
    fn file_and_overrides_merge_in_order() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "[mqtt]\nmax_inflight = 7\n[shared]\nstrategy = \"hash_topic\"").unwrap();
        let c = Config::load(Some(f.path()), &["mqtt.max_inflight=9".into()]).unwrap();
        assert_eq!(c.mqtt.max_inflight, 9);
        assert_eq!(c.shared.strategy, SharedStrategy::HashTopic);
    }

    #[test]
    fn unknown_key_is_named() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "[mqtt]\nmax_infligt = 7").unwrap();
        let err = Config::load(Some(f.path()), &[]).unwrap_err();
        assert_eq!(err.key(), Some("mqtt.max_infligt"), "{err}");
        assert!(err.to_string().contains(&*f.path().to_string_lossy()), "{err}");
    }

    #[test]
    fn wrong_type_names_the_key() {
        let err = Config::load(None, &["mqtt.max_inflight=\"many\"".into()]).unwrap_err().to_string();
        assert!(err.contains("mqtt.max_inflight"), "{err}");
    }

    #[test]
    fn out_of_range_value_names_the_key() {
        let err = Config::load(None, &["mqtt.max_qos=3".into()]).unwrap_err().to_string();
        assert!(err.starts_with("mqtt.max_qos"), "{err}");
    }

    /// The error `Config::load` returns for `overrides`.
    fn rejected(overrides: &[&str]) -> ConfigError {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        Config::load(None, &overrides).unwrap_err()
    }

    #[test]
    fn each_queue_limit_is_reported_under_its_own_key() {
        let err = rejected(&["session.max_queued_bytes=0"]);
        assert_eq!(err.key(), Some("session.max_queued_bytes"), "{err}");
        assert!(err.to_string().starts_with("session.max_queued_bytes: "), "{err}");
        let err = rejected(&["session.max_queued_messages=0"]);
        assert_eq!(err.key(), Some("session.max_queued_messages"), "{err}");
    }

    #[test]
    fn bad_values_name_their_own_key() {
        let cases: &[(&[&str], &str)] = &[
            (&["mqtt.max_packet_size=8"], "mqtt.max_packet_size"),
            (&["mqtt.max_inflight=0"], "mqtt.max_inflight"),
            (&["mqtt.max_inflight=\"many\""], "mqtt.max_inflight"),
            (&["mqtt.max_infligt=7"], "mqtt.max_infligt"),
            (&["quic.pacing=\"fast\""], "quic.pacing"),
            (&["quic.cert_file=\"cert.pem\""], "quic.key_file"),
            (&["quic.key_file=\"key.pem\""], "quic.cert_file"),
            (&["listeners.wss=\"0.0.0.0:8084\"", "tls.cert=\"cert.pem\""], "tls.key"),
            (&["listeners.ws_path=\"mqtt\""], "listeners.ws_path"),
            (&["auth.jwt_algorithm=\"none\""], "auth.jwt_algorithm"),
            (&["store.data_dir=\"\""], "store.data_dir"),
            (&["session.listeners.ws.max_queued_messages=5"], "session.listeners.ws.max_queued_messages"),
        ];
        for (overrides, key) in cases {
            let err = rejected(overrides);
            assert_eq!(err.key(), Some(*key), "{overrides:?}: {err}");
        }
    }

    #[test]
    fn a_missing_file_is_named_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.toml");
        match Config::load(Some(&path), &[]) {
            Err(err @ ConfigError::File { .. }) => {
                assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
                assert!(std::error::Error::source(&err).is_some());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_input_without_a_key() {
        let err = rejected(&["mqtt.max_inflight"]);
        assert!(matches!(&err, ConfigError::SetSyntax { item } if item == "mqtt.max_inflight"), "{err:?}");
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "[mqtt\nmax_inflight = ").unwrap();
        let err = Config::load(Some(f.path()), &[]).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }) && err.key().is_none(), "{err:?}");
        assert!(err.to_string().contains("line 1"), "{err}");
        assert!(err.to_string().contains(&*f.path().to_string_lossy()), "{err}");
    }

    #[test]
    fn tls_listeners_are_off_by_default_and_need_a_certificate() {
        let c = Config::load(None, &[]).unwrap();
        assert!(c.listeners.tls.is_none() && c.listeners.ws.is_none() && c.listeners.wss.is_none());
        let c = Config::load(None, &["listeners.ws=127.0.0.1:8080".into()]).unwrap();
        assert_eq!(c.listeners.ws, Some(SocketAddr::from(([127, 0, 0, 1], 8080))));
        let err = Config::load(None, &["listeners.tls=0.0.0.0:8883".into()]).unwrap_err().to_string();
        assert!(err.starts_with("tls.cert") && err.contains("listeners.tls"), "{err}");
        let err = Config::load(None, &["tls.client_auth=require".into()]).unwrap_err().to_string();
        assert!(err.starts_with("tls.client_ca"), "{err}");
        let err = Config::load(None, &["tls.min_version=1.1".into()]).unwrap_err().to_string();
        assert!(err.contains("tls.min_version"), "{err}");
        let c = Config::load(None, &["tls.min_version=1.3".into()]).unwrap();
        assert_eq!(c.tls.min_version, TlsVersion::Tls13);
    }

    #[test]
    fn listener_queue_policies_override_the_session_ones_and_are_checked() {
        let set = ["session.listeners.ws.queue_overflow=\"drop_oldest\"".into()];
        let c = Config::load(None, &set).unwrap();
        assert_eq!(c.session.listeners.get(Transport::Ws).queue_overflow, Some(OverflowPolicy::DropOldest));
        assert_eq!(c.session.listeners.get(Transport::Tcp), &QueuePolicy::default());
        let set = ["session.listeners.quic.queue_overflow_qos0=\"backpressure\"".into()];
        let err = Config::load(None, &set).unwrap_err().to_string();
        assert!(err.contains("session.listeners.quic.queue_overflow_qos0"), "{err}");
        let err = Config::load(None, &["session.listeners.ws.max_queued_messages=5".into()]).unwrap_err();
        assert!(err.to_string().contains("max_queued_messages"), "{err}");
    }

    #[test]
    fn unknown_keys_and_values_get_the_nearest_known_one() {
        let err = rejected(&["mqtt.max_inflights=3"]).to_string();
        assert_eq!(
            err,
            "mqtt.max_inflights: unknown key; did you mean mqtt.max_inflight? (from --set/--listen flag)"
        );
        let err = rejected(&["mqt.max_inflight=3"]).to_string();
        assert!(err.starts_with("mqt: unknown section; did you mean mqtt? "), "{err}");
        let err = rejected(&["session.listener.ws.qos0_pacing_ms=3"]).to_string();
        assert!(err.starts_with("session.listener: unknown key; did you mean session.listeners? "), "{err}");
        let err = rejected(&["shared.strategy=hash_topics"]).to_string();
        assert!(
            err.starts_with(r#"shared.strategy: unknown value "hash_topics"; did you mean hash_topic? "#),
            "{err}"
        );
        // Nothing near: the known ones.
        let err = rejected(&["session.listeners.ws.max_queued_messages=5"]).to_string();
        let keys =
            "the keys of session.listeners.ws are queue_overflow, queue_overflow_qos0 and qos0_pacing_ms";
        assert!(err.contains(&format!("unknown key; {keys}")), "{err}");
        let err = rejected(&["shared.strategy=fastest"]).to_string();
        assert!(err.contains("expected round_robin, random, hash_clientid, hash_topic or sticky"), "{err}");
        let err = rejected(&["nosuch.key=1"]).to_string();
        assert!(err.starts_with("nosuch: unknown section; the sections are listeners, mqtt, "), "{err}");
        // From a file, in one clean message.
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "[mqtt]\nmax_infligt = 7").unwrap();
        let err = Config::load(Some(f.path()), &[]).unwrap_err().to_string();
        let start = "mqtt.max_infligt: unknown key; did you mean mqtt.max_inflight? (from TOML file ";
        assert!(err.starts_with(start), "{err}");
        assert!(!err.contains('`'), "{err}");
    }

    #[test]
    fn a_typo_is_within_a_third_of_the_word() {
        assert_eq!(closest("mqt", &["sys", "mqtt"]), Some("mqtt"));
        assert_eq!(closest("max_infligt", &["max_inflight"]), Some("max_inflight"));
        // Three edits: near enough for a word of nine letters or more, not for a shorter one.
        assert_eq!(closest("max_inflite", &["max_qos", "max_inflight"]), Some("max_inflight"));
        assert_eq!(closest("kitten", &["sitting"]), None);
        assert_eq!(closest("kittens", &["sittings"]), None);
        assert_eq!(closest("the_kitten", &["the_sitting"]), Some("the_sitting"));
        assert_eq!(closest("tcp", &["tls", "ws"]), None);
        assert_eq!(closest("max_inflite", &["max_qos", "max_inflight"]), Some("max_inflight"));
    }

    #[test]
    fn range_errors_say_where_the_value_came_from() {
        let err = rejected(&["mqtt.max_qos=3"]).to_string();
        assert_eq!(err, "mqtt.max_qos: must be 0, 1 or 2 (from --set/--listen flag)");
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "[mqtt]\nmax_qos = 3\n[cluster]\nenabled = true\nnode = \"a\"\nlease_ms = 10").unwrap();
        let err = Config::load(Some(f.path()), &[]).unwrap_err();
        assert_eq!(err.key(), Some("mqtt.max_qos"));
        let file = f.path().file_name().unwrap().to_string_lossy();
        assert!(err.to_string().contains("(from TOML file ") && err.to_string().contains(&*file), "{err}");
        // The layer that set the value is named, not the first one.
        let err = Config::load(Some(f.path()), &["mqtt.max_qos=1".into()]).unwrap_err();
        assert!(
            err.to_string().starts_with("cluster.lease_ms: must be at least 1000 (from TOML file "),
            "{err}"
        );
        let set = ["mqtt.max_qos=1".into(), "cluster.lease_ms=5".into()];
        let err = Config::load(Some(f.path()), &set).unwrap_err();
        assert_eq!(err.to_string(), "cluster.lease_ms: must be at least 1000 (from --set/--listen flag)");
        // The environment: the variable's name.
        let env = origin(&env_metadata(), &["mqtt", "max_qos"]);
        assert_eq!(env.as_deref(), Some("environment variable BRAID_MQTT_MAX_QOS"));
        // A key at its default has no source to name.
        let err = rejected(&["quic.cert_file=\"cert.pem\""]);
        assert_eq!(err.key(), Some("quic.key_file"));
        assert!(!err.to_string().contains("(from"), "{err}");
    }

    #[test]
    fn quic_pacing_is_a_string_or_a_number() {
        for set in ["quic.pacing=25", "quic.pacing=\"25\""] {
            assert_eq!(Config::load(None, &[set.into()]).unwrap().quic.pacing, "25", "{set}");
        }
        assert_eq!(Config::load(None, &["quic.pacing=off".into()]).unwrap().quic.pacing, "off");
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "[quic]\npacing = 40").unwrap();
        assert_eq!(Config::load(Some(f.path()), &[]).unwrap().quic.pacing, "40");
        for bad in ["quic.pacing=0", "quic.pacing=-3", "quic.pacing=2.5", "quic.pacing=true"] {
            let err = rejected(&[bad]);
            assert_eq!(err.key(), Some("quic.pacing"), "{bad}: {err}");
            assert!(err.to_string().contains("packets per second"), "{bad}: {err}");
        }
    }

    #[test]
    fn bad_enum_value_names_the_key() {
        let err = Config::load(None, &["shared.strategy=fastest".into()]).unwrap_err().to_string();
        assert!(err.contains("shared.strategy"), "{err}");
        let err = Config::load(None, &["quic.pacing=\"fast\"".into()]).unwrap_err().to_string();
        assert!(err.contains("quic.pacing") && err.contains("packets per second"), "{err}");
        assert!(Config::load(None, &["quic.pacing=\"25\"".into()]).is_ok());
    }
}
