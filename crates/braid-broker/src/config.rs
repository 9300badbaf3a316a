//! Broker configuration: one TOML file, `BRAID_<SECTION>_<KEY>` environment variables and
//! `--set section.key=value` overrides, merged in that order. Every key has a default, so the
//! broker runs with no file at all. Every key is documented in `docs/configuration.md`.

use std::net::SocketAddr;
use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

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
}

/// Network listeners.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Listeners {
    /// MQTT over TCP.
    pub tcp: SocketAddr,
    /// MQTT over QUIC (UDP), when `quic.enabled`.
    pub quic: SocketAddr,
}

impl Default for Listeners {
    fn default() -> Self {
        Listeners {
            tcp: SocketAddr::from(([0, 0, 0, 0], 1883)),
            quic: SocketAddr::from(([0, 0, 0, 0], 14567)),
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
        }
    }
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
        }
    }
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

/// A configuration that could not be loaded; the message names the key and the problem.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

const SECTIONS: [&str; 7] = ["listeners", "mqtt", "session", "shared", "sys", "quic", "log"];

impl Config {
    /// Loads defaults, then `file` (if any), then `BRAID_*` environment variables, then
    /// `overrides` of the form `section.key=value` (value in TOML syntax; bare words are strings).
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError(format!("config file {} does not exist", path.display())));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(Env::prefixed("BRAID_").filter_map(|key| {
            let key = key.as_str().to_ascii_lowercase();
            SECTIONS.iter().find_map(|section| {
                key.strip_prefix(section)
                    .and_then(|rest| rest.strip_prefix('_'))
                    .map(|rest| format!("{section}.{rest}").into())
            })
        }));
        for item in overrides {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| ConfigError(format!("--set {item:?}: expected section.key=value")))?;
            figment = figment.merge(SetFlag(Serialized::default(key.trim(), parse_value(value.trim()))));
        }
        let config: Config = figment.extract().map_err(|e| ConfigError(describe(e)))?;
        config.validate()?;
        Ok(config)
    }

    /// Defaults for a broker embedded in a program or a test: MQTT over TCP and over QUIC on
    /// free loopback ports (see `Running::addr` and `Running::quic_addr`), no `$SYS` traffic.
    pub fn embedded() -> Config {
        let mut config = Config::default();
        config.listeners.tcp = SocketAddr::from(([127, 0, 0, 1], 0));
        config.listeners.quic = SocketAddr::from(([127, 0, 0, 1], 0));
        config.sys.interval_secs = 0;
        config
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, problem: &str| Err(ConfigError(format!("{key}: {problem}")));
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
        if self.session.queue_overflow_qos0 == OverflowPolicy::Backpressure {
            return bad(
                "session.queue_overflow_qos0",
                "must be drop_newest or drop_oldest (backpressure is for QoS 1/2)",
            );
        }
        if self.session.max_queued_messages == 0 || self.session.max_queued_bytes == 0 {
            return bad("session.max_queued_messages", "queue limits must be at least 1");
        }
        if self.quic.cert_file.is_empty() != self.quic.key_file.is_empty() {
            return bad(
                "quic.cert_file",
                "quic.cert_file and quic.key_file go together: set both or neither",
            );
        }
        if self.quic.idle_timeout_secs == 0 {
            return bad("quic.idle_timeout_secs", "must be at least 1");
        }
        if self.mqtt.max_keep_alive == 0 {
            return bad("mqtt.max_keep_alive", "must be at least 1");
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

/// One `--set` override as a figment provider, so that errors name the flag as their source.
struct SetFlag(Serialized<toml::Value>);

impl figment::Provider for SetFlag {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named("--set/--listen flag")
    }

    fn data(&self) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        self.0.data()
    }
}

/// Figment's errors, one line each, naming the key path.
fn describe(err: figment::Error) -> String {
    err.into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let source = match e.metadata.as_ref() {
                Some(m) => match &m.source {
                    Some(src) => format!(" (from {} {src})", m.name),
                    None => format!(" (from {})", m.name),
                },
                None => String::new(),
            };
            if key.is_empty() {
                format!("{}{source}", e.kind)
            } else {
                format!("{key}: {}{source}", e.kind)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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
        let err = Config::load(Some(f.path()), &[]).unwrap_err().to_string();
        assert!(err.contains("max_infligt"), "{err}");
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

    #[test]
    fn bad_enum_value_names_the_key() {
        let err = Config::load(None, &["shared.strategy=fastest".into()]).unwrap_err().to_string();
        assert!(err.contains("shared.strategy"), "{err}");
    }
}
