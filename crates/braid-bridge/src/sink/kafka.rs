//! The `kafka` sink: one record per output, to the topic its `topic` template makes, with the
//! `key` template's key (none if empty) and the `body` template's value (by default the output
//! as JSON), through an idempotent producer; a batch's records are in flight at once. A record
//! Kafka can never take (too large, no such topic, not authorized) is a refusal; anything
//! else is produced again.

use std::sync::Arc;

use braid_broker::config::SinkConfig;
use braid_rules::Template;
use futures_util::future::join_all;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::{Output, Written};
use crate::kafka::{permanent, Context};
use crate::stats::Stats;

/// Kafka as a target.
pub(super) struct Kafka {
    producer: FutureProducer<Context>,
    topic: Template,
    key: Option<Template>,
    /// None: the output as JSON.
    value: Option<Template>,
}

impl Kafka {
    pub(super) fn new(config: &SinkConfig, stats: Arc<Stats>) -> Result<Kafka, String> {
        let brokers = config.url.strip_prefix("kafka://").unwrap_or(&config.url).trim_end_matches('/');
        let context = Context { bridge: format!("sink {}", config.name), stats };
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("client.id", format!("braid-sink-{}", config.name))
            .set("enable.idempotence", "true")
            .set("compression.type", "lz4")
            .set("linger.ms", "5")
            .set("message.timeout.ms", config.timeout_ms.max(1000).to_string())
            .set("reconnect.backoff.max.ms", "1000")
            .create_with_context(context)
            .map_err(|e| format!("cannot make a Kafka producer: {e}"))?;
        let optional = |text: &str, key: &str| match text.is_empty() {
            true => Ok(None),
            false => Template::parse(text).map(Some).map_err(|e| format!("{key}: {e}")),
        };
        Ok(Kafka {
            producer,
            topic: Template::parse(&config.topic).map_err(|e| format!("topic: {e}"))?,
            key: optional(&config.key, "key")?,
            value: optional(&config.body, "body")?,
        })
    }

    pub(super) async fn write(&mut self, batch: &[&Output]) -> Vec<Written> {
        let records: Vec<(String, Option<String>, String)> = batch
            .iter()
            .map(|output| {
                let value = match &self.value {
                    Some(t) => t.render(output),
                    None => serde_json::Value::Object((*output).clone()).to_string(),
                };
                (self.topic.render(output), self.key.as_ref().map(|k| k.render(output)), value)
            })
            .collect();
        let sends = records.iter().map(|(topic, key, value)| {
            let mut record = FutureRecord::to(topic).payload(value.as_bytes());
            if let Some(key) = key {
                record = record.key(key.as_bytes());
            }
            let sent = self.producer.send_result(record);
            async move {
                let result = match sent {
                    Ok(delivery) => match delivery.await {
                        Ok(Ok(_)) => return Written::Sent,
                        Ok(Err((e, _))) => e,
                        Err(_) => return Written::Failed("the producer stopped".into()),
                    },
                    Err((e, _)) => e,
                };
                match permanent(&result) {
                    true => Written::Refused(result.to_string()),
                    false => Written::Failed(result.to_string()),
                }
            }
        });
        join_all(sends).await
    }
}
