//! The Kafka bridge (`[[bridges.kafka]]`): `out` takes MQTT messages through the bridge's
//! outbox to a Kafka producer (idempotent, batched, compressed), `inbound` consumes Kafka
//! topics in a consumer group and publishes their records in Braid, committing a record's
//! offset only once Braid acknowledged it.

mod confirmed;
mod inbound;
mod out;
mod record;

use std::sync::Arc;

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use braid_broker::config::{ConfigError, KafkaAck, KafkaBridgeConfig};
use braid_broker::Broker;
use braid_proto::topic::valid_topic_filter;

use crate::stats::{Stats, Watch, Watched, BRIDGES};
use crate::template::Template;

/// What an `out` topic or key template may name (and `${1}`, `${2}`...: the topic's levels).
const OUT_FIELDS: &[&str] = &["topic"];
/// What an `in` MQTT topic template may name.
const IN_FIELDS: &[&str] = &["key", "topic", "partition"];

/// Checks every `[[bridges.kafka]]`: the error names the key, e.g.
/// `bridges.kafka[0].out[1].topic`.
pub(crate) fn check(bridges: &[KafkaBridgeConfig]) -> Result<(), ConfigError> {
    let names: Vec<&str> = bridges.iter().map(|b| b.name.as_str()).collect();
    for (i, b) in bridges.iter().enumerate() {
        let key = |k: &str| format!("bridges.kafka[{i}].{k}");
        let bad = |k: &str, problem: &dyn std::fmt::Display| Err(ConfigError::invalid(key(k), problem));
        if let Err(problem) = crate::check_name(&names, i) {
            return bad("name", &problem);
        }
        if b.brokers.is_empty() || b.brokers.iter().any(|h| !h.contains(':')) {
            return bad("brokers", &"required: Kafka bootstrap brokers as host:port");
        }
        if b.out.is_empty() && b.inbound.is_empty() {
            return bad("out", &"a bridge needs at least one [[bridges.kafka.out]] or [[bridges.kafka.in]]");
        }
        if !["none", "gzip", "snappy", "lz4", "zstd"].contains(&b.compression.as_str()) {
            return bad("compression", &"must be none, gzip, snappy, lz4 or zstd");
        }
        if !["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"].contains(&b.security_protocol.as_str()) {
            return bad("security_protocol", &"must be plaintext, ssl, sasl_plaintext or sasl_ssl");
        }
        let sasl = b.security_protocol.starts_with("sasl");
        if sasl && !["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"].contains(&b.sasl_mechanism.as_str()) {
            return bad(
                "sasl_mechanism",
                &"must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with a sasl_ security_protocol",
            );
        }
        if sasl && b.sasl_username.is_empty() {
            return bad("sasl_username", &"required with a sasl_ security_protocol");
        }
        if b.cert_file.is_empty() != b.key_file.is_empty() {
            return bad("cert_file", &"cert_file and key_file go together: set both or neither");
        }
        if b.max_record_bytes < 1000 {
            return bad("max_record_bytes", &"must be at least 1000");
        }
        if b.max_queued_messages == 0 || b.max_queued_bytes == 0 {
            return bad(
                "max_queued_messages",
                &"max_queued_messages and max_queued_bytes must be at least 1",
            );
        }
        if b.delivery_timeout_ms < 1000 {
            return bad("delivery_timeout_ms", &"must be at least 1000");
        }
        for (j, o) in b.out.iter().enumerate() {
            let key = |k: &str| format!("out[{j}].{k}");
            if !valid_topic_filter(&o.filter)
                || o.filter.starts_with("$share/")
                || o.filter.starts_with("$queue/")
            {
                return bad(
                    &key("filter"),
                    &format!("{:?} is not an MQTT topic filter (shared ones are not needed)", o.filter),
                );
            }
            if o.qos > 2 {
                return bad(&key("qos"), &"must be 0, 1 or 2");
            }
            if let Err(e) = required_template(&o.topic, OUT_FIELDS, true, "the Kafka topic") {
                return bad(&key("topic"), &e);
            }
            if let Err(e) = Template::parse(&o.key, OUT_FIELDS, true) {
                return bad(&key("key"), &e);
            }
        }
        for (j, n) in b.inbound.iter().enumerate() {
            let key = |k: &str| format!("in[{j}].{k}");
            if n.topic.is_empty() {
                return bad(&key("topic"), &"required: the Kafka topic to consume");
            }
            if b.inbound[..j].iter().any(|o| o.topic == n.topic && o.group == n.group) {
                return bad(
                    &key("topic"),
                    &format!("{:?} is consumed twice in one group: give one of them another group", n.topic),
                );
            }
            if n.qos > 2 {
                return bad(&key("qos"), &"must be 0, 1 or 2");
            }
            if let Err(e) = required_template(&n.mqtt_topic, IN_FIELDS, false, "the MQTT topic") {
                return bad(&key("mqtt_topic"), &e);
            }
        }
    }
    Ok(())
}

/// Checks a template that must not be empty: `what` it makes, from `fields` (and `levels`).
fn required_template(text: &str, fields: &[&str], levels: bool, what: &str) -> Result<(), String> {
    match Template::parse(text, fields, levels) {
        Ok(t) if t.is_empty() => Err(format!("required: {what} (a template)")),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Starts bridge `config`'s directions and its `$SYS` topics, until `stop`.
pub(crate) fn start(broker: &Arc<Broker>, config: KafkaBridgeConfig, stop: &CancellationToken) {
    let config = Arc::new(config);
    let stats = Arc::new(Stats::default());
    info!(bridge = %config.name, brokers = ?config.brokers, out = config.out.len(), r#in = config.inbound.len(), "kafka bridge starting");
    let outbox = (config.ack == KafkaAck::Log && !config.out.is_empty())
        .then(|| crate::client_id(broker, &out::outbox_id(&config.name)));
    let name = config.name.clone();
    let watch = Watch { family: &BRIDGES, kind: "kafka", name, stats: stats.clone(), outbox };
    Watched::start(broker, watch, stop.clone());
    match config.ack {
        _ if config.out.is_empty() => {}
        KafkaAck::Log => {
            drop(tokio::spawn(out::run(broker.clone(), config.clone(), stats.clone(), stop.clone())))
        }
        KafkaAck::Kafka => confirmed::start(broker, config.clone(), stats.clone(), stop.clone()),
    }
    if !config.inbound.is_empty() {
        tokio::spawn(inbound::run(broker.clone(), config, stats, stop.clone()));
    }
}

/// The librdkafka settings common to the producer and the consumer of bridge `b`.
fn client_config(b: &KafkaBridgeConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    let client_id = if b.client_id.is_empty() { format!("braid-{}", b.name) } else { b.client_id.clone() };
    c.set("bootstrap.servers", b.brokers.join(","))
        .set("client.id", client_id)
        .set("security.protocol", &b.security_protocol)
        // Back within a second of Kafka's return (librdkafka's default waits up to 10 s).
        .set("reconnect.backoff.max.ms", "1000")
        .set_log_level(RDKafkaLogLevel::Warning);
    if b.security_protocol.starts_with("sasl") {
        c.set("sasl.mechanism", &b.sasl_mechanism)
            .set("sasl.username", &b.sasl_username)
            .set("sasl.password", &b.sasl_password);
    }
    for (key, value) in [
        ("ssl.ca.location", &b.ca_file),
        ("ssl.certificate.location", &b.cert_file),
        ("ssl.key.location", &b.key_file),
    ] {
        if !value.is_empty() {
            c.set(key, value);
        }
    }
    c
}

/// The producer's settings: idempotent (acks from all in-sync replicas, no duplicates or
/// reordering from its own retries), batched, compressed.
pub(crate) fn producer_config(c: &KafkaBridgeConfig) -> rdkafka::ClientConfig {
    let mut p = client_config(c);
    p.set("enable.idempotence", "true")
        .set("compression.type", &c.compression)
        .set("linger.ms", c.linger_ms.to_string())
        .set("message.max.bytes", (c.max_record_bytes + 512).to_string())
        .set("message.timeout.ms", c.delivery_timeout_ms.to_string());
    with_properties(p, c)
}

/// Applies the bridge's own librdkafka `properties` last: they override Braid's settings.
fn with_properties(mut c: ClientConfig, b: &KafkaBridgeConfig) -> ClientConfig {
    for (key, value) in &b.properties {
        c.set(key, value);
    }
    c
}

/// True for a produce error that resending the same record cannot cure: the record is dropped
/// (logged and counted) instead of holding the outbox.
pub(crate) fn permanent(e: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    let code = match e {
        KafkaError::MessageProduction(code) => *code,
        _ => return false,
    };
    matches!(
        code,
        MessageSizeTooLarge
            | InvalidMessageSize
            | InvalidMessage
            | UnknownTopic
            | UnknownTopicOrPartition
            | InvalidTopic
            | InvalidRecord
            | TopicAuthorizationFailed
            | MessageBatchTooLarge
            | PolicyViolation
    )
}

/// The librdkafka client's context: its logs and errors go to Braid's log, and whether the
/// brokers answer to the bridge's state.
#[derive(Debug)]
pub(crate) struct Context {
    /// What it is for, in the log: the bridge's name, or `sink <name>`.
    pub(crate) bridge: String,
    pub(crate) stats: Arc<Stats>,
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            // A broker connection that fails: said once per stretch by `error` (all brokers down).
            _ if facility == "FAIL" => debug!(bridge = %self.bridge, "kafka: {facility}: {message}"),
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => warn!(bridge = %self.bridge, "kafka: {facility}: {message}"),
            _ => debug!(bridge = %self.bridge, "kafka: {facility}: {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::AllBrokersDown)) {
            if self.stats.set_up(false) {
                warn!(bridge = %self.bridge, "kafka: no broker reachable ({reason}); retrying, messages wait in the outbox");
            }
        } else {
            debug!(bridge = %self.bridge, "kafka: {error}: {reason}");
        }
    }
}

impl ConsumerContext for Context {}
