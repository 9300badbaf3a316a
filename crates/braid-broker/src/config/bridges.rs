//! `[bridges]`: Kafka and MQTT bridges.

use serde::{Deserialize, Serialize};

use super::{one_or_many, OverflowPolicy};

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
