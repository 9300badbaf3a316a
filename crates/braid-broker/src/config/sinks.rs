//! `[[sinks]]`: where rules send their outputs (HTTP services, PostgreSQL, Redis, InfluxDB),
//! each through a durable outbox of its own (see docs/rules.md).

use std::collections::BTreeMap;

use braid_rules::Template;
use serde::{Deserialize, Serialize};

use super::{ConfigError, OverflowPolicy};

/// One sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SinkConfig {
    /// Its name, unique among the sinks: what a rule's `actions` name.
    pub name: String,
    /// What it writes to.
    #[serde(rename = "type")]
    pub kind: SinkKind,
    /// Where: `http(s)://...` (http, influxdb), `postgres://user:password@host:port/db`,
    /// `redis://host:port/db`, `mqtt(s)://[user:password@]host:port` (another MQTT broker),
    /// `kafka://host:port[,host:port...]` (bootstrap brokers).
    pub url: String,
    /// http: the request method.
    pub method: String,
    /// http: request headers, each value a template.
    pub headers: BTreeMap<String, String>,
    /// http: the request body; mqtt and republish: the payload; kafka: the record's value: a
    /// template; empty: the rule's output as JSON.
    pub body: String,
    /// postgres: the statement, a template whose placeholders become parameters (`$1`...),
    /// never text spliced into the SQL.
    pub sql: String,
    /// redis: the command, its words separated by spaces, each a template
    /// (`HSET device:${clientid} temp ${temp}`).
    pub command: String,
    /// mqtt, kafka and republish: the topic to publish to, a template (`devices/${clientid}/hot`).
    pub topic: String,
    /// kafka: the record key, a template; empty: no key.
    pub key: String,
    /// mqtt and republish: the QoS of what it publishes (0, 1 or 2).
    pub qos: u8,
    /// mqtt and republish: publish retained.
    pub retain: bool,
    /// republish: MQTT 5 user properties, name to value template.
    pub user_properties: BTreeMap<String, String>,
    /// influxdb: one point in line protocol, a template
    /// (`temp,client=${clientid} value=${temp} ${timestamp}`).
    pub line: String,
    /// influxdb 1.x: the database (`/write?db=`); empty: 2.x with `org` and `bucket`.
    pub database: String,
    /// influxdb 2.x: the organisation.
    pub org: String,
    /// influxdb 2.x: the bucket.
    pub bucket: String,
    /// influxdb 2.x: the API token (`Authorization: Token ...`).
    pub token: String,
    /// influxdb: the precision of the timestamps in `line`: `ns`, `us`, `ms` or `s`.
    pub precision: String,
    /// A CA certificate (PEM) that an `https://` target's certificate must chain to; empty:
    /// the system's roots.
    pub ca_file: String,
    /// How long one write may take, in milliseconds; then it counts as failed and is retried.
    pub timeout_ms: u64,
    /// At most this many outputs go to the target in one write (one HTTP request per output,
    /// `batch_size` at a time; one transaction, pipeline or line-protocol body for the others).
    pub batch_size: usize,
    /// Outputs the outbox holds while the target is slow or away.
    pub max_queued_messages: usize,
    /// Bytes the outbox holds while the target is slow or away.
    pub max_queued_bytes: usize,
    /// What to do with an output when the outbox is full (counted): `backpressure` (hold the
    /// publishers), `drop_newest` or `drop_oldest`.
    pub queue_overflow: OverflowPolicy,
    /// When the publisher of a message a rule sends here is acknowledged: `outbox`, once the
    /// output is in the outbox; `target`, once the target confirmed (or refused) it.
    pub ack: SinkAck,
}

/// When the publisher of a message whose rule output goes to a sink is acknowledged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkAck {
    /// Once the output is in the sink's outbox (stored with the publish).
    #[default]
    Outbox,
    /// Once the target confirmed the output (v5: 0x80 if it refused it); meanwhile the
    /// publisher's Receive Maximum holds it back. After a restart the output is still written,
    /// but the publisher, whose PUBACK never came, sends the message again.
    Target,
}

/// What a sink writes to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkKind {
    /// An HTTP request per output.
    #[default]
    Http,
    /// A parameterised statement per output (PostgreSQL, TimescaleDB).
    Postgres,
    /// A command per output.
    Redis,
    /// A point per output, in line protocol (InfluxDB 1.x and 2.x).
    Influxdb,
    /// A message per output, to another MQTT broker.
    Mqtt,
    /// A record per output, to Kafka.
    Kafka,
    /// A message per output, published in Braid (no outbox: routed with the publish).
    Republish,
}

impl SinkKind {
    /// Its name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkKind::Http => "http",
            SinkKind::Postgres => "postgres",
            SinkKind::Redis => "redis",
            SinkKind::Influxdb => "influxdb",
            SinkKind::Mqtt => "mqtt",
            SinkKind::Kafka => "kafka",
            SinkKind::Republish => "republish",
        }
    }
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            name: String::new(),
            kind: SinkKind::Http,
            url: String::new(),
            method: "POST".into(),
            headers: BTreeMap::new(),
            body: String::new(),
            sql: String::new(),
            command: String::new(),
            line: String::new(),
            topic: String::new(),
            key: String::new(),
            qos: 1,
            retain: false,
            user_properties: BTreeMap::new(),
            database: String::new(),
            org: String::new(),
            bucket: String::new(),
            token: String::new(),
            precision: "ms".into(),
            ca_file: String::new(),
            timeout_ms: 5_000,
            batch_size: 100,
            max_queued_messages: 100_000,
            max_queued_bytes: 64 * 1024 * 1024,
            queue_overflow: OverflowPolicy::DropOldest,
            ack: SinkAck::Outbox,
        }
    }
}

impl SinkConfig {
    /// This sink with its secrets (a password in `url`, `token`) written as `***`: for logs
    /// and the API.
    pub fn redacted(&self) -> SinkConfig {
        let mut sink = self.clone();
        if let Ok(mut url) = url::Url::parse(&sink.url) {
            if url.password().is_some() && url.set_password(Some("***")).is_ok() {
                sink.url = url.to_string();
            }
        }
        if !sink.token.is_empty() {
            sink.token = "***".into();
        }
        sink
    }

    /// Checks sink number `at` (from 0): the error names the key and the problem.
    pub fn check(&self, at: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("sinks[{at}].{k}");
        let bad = |k: &str, problem: &dyn std::fmt::Display| Err(ConfigError::invalid(key(k), problem));
        let name_ok = self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b));
        if self.name.is_empty() || self.name.len() > 64 || !name_ok {
            return bad("name", &"required: at most 64 letters, digits, '_' or '-'");
        }
        let schemes: &[&str] = match self.kind {
            SinkKind::Republish if self.url.is_empty() => &[""],
            SinkKind::Republish => return bad("url", &"a republish sink publishes in Braid: it has no url"),
            SinkKind::Http | SinkKind::Influxdb => &["http://", "https://"],
            SinkKind::Postgres => &["postgres://", "postgresql://"],
            SinkKind::Redis => &["redis://", "rediss://"],
            SinkKind::Mqtt => &["mqtt://", "mqtts://"],
            SinkKind::Kafka => &["kafka://"],
        };
        if !schemes.iter().any(|s| self.url.starts_with(s)) {
            let kind = self.kind.as_str();
            return bad("url", &format!("a {kind} sink needs a URL starting with {}", schemes.join(" or ")));
        }
        let template = |k: &str, text: &str| match Template::parse(text) {
            Ok(_) => Ok(()),
            Err(e) => bad(k, &e),
        };
        let required = |k: &str, text: &str, example: &str| match text.trim().is_empty() {
            true => bad(k, &format!("required for a {} sink, e.g. {example}", self.kind.as_str())),
            false => template(k, text),
        };
        match self.kind {
            SinkKind::Http => {
                let method_ok = ["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&self.method.as_str());
                if !method_ok {
                    return bad("method", &"must be GET, POST, PUT, PATCH or DELETE");
                }
                template("body", &self.body)?;
                for (name, value) in &self.headers {
                    template(&format!("headers.{name}"), value)?;
                }
            }
            SinkKind::Postgres => {
                required("sql", &self.sql, "INSERT INTO t(a, b) VALUES (${clientid}, ${temp})")?
            }
            SinkKind::Redis => required("command", &self.command, "HSET device:${clientid} temp ${temp}")?,
            SinkKind::Mqtt | SinkKind::Kafka | SinkKind::Republish => {
                required("topic", &self.topic, "devices/${clientid}/hot")?;
                template("body", &self.body)?;
                template("key", &self.key)?;
                for (name, value) in &self.user_properties {
                    template(&format!("user_properties.{name}"), value)?;
                }
                if self.qos > 2 {
                    return bad("qos", &"must be 0, 1 or 2");
                }
            }
            SinkKind::Influxdb => {
                required("line", &self.line, "temp,client=${clientid} value=${temp}")?;
                if self.database.is_empty() && (self.org.is_empty() || self.bucket.is_empty()) {
                    return bad("database", &"required: database (InfluxDB 1.x), or org and bucket (2.x)");
                }
                if !["ns", "us", "ms", "s"].contains(&self.precision.as_str()) {
                    return bad("precision", &"must be ns, us, ms or s");
                }
            }
        }
        if self.timeout_ms == 0 {
            return bad("timeout_ms", &"must be at least 1");
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return bad("batch_size", &"must be 1 to 10000");
        }
        if self.ack == SinkAck::Target && self.queue_overflow == OverflowPolicy::DropOldest {
            return bad(
                "queue_overflow",
                &"ack = \"target\" needs \"backpressure\" or \"drop_newest\": drop_oldest would drop outputs whose publishers wait",
            );
        }
        if self.max_queued_messages == 0 || self.max_queued_bytes == 0 {
            return bad(
                "max_queued_messages",
                &"max_queued_messages and max_queued_bytes must be at least 1",
            );
        }
        Ok(())
    }
}

/// Every sink is sound, and no two share a name.
pub(super) fn validate(sinks: &[SinkConfig]) -> Result<(), ConfigError> {
    for (at, sink) in sinks.iter().enumerate() {
        sink.check(at)?;
        if sinks[..at].iter().any(|other| other.name == sink.name) {
            return Err(ConfigError::invalid(
                format!("sinks[{at}].name"),
                format!("{:?} names another sink too", sink.name),
            ));
        }
    }
    Ok(())
}
