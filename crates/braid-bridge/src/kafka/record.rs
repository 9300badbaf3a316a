//! From an MQTT message to Kafka records: the `out` routes it matches, and for each the topic
//! and key its templates make and the headers its PUBLISH carries; or why no record can be
//! made (then it is dropped, logged and counted).

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use tracing::warn;

use braid_broker::config::{KafkaBridgeConfig, KafkaOut};
use braid_broker::message::Message;
use braid_client::{Bytes, Properties, Publish, QoS};
use braid_proto::topic::matches;

use super::OUT_FIELDS;
use crate::stats::{bump, Stats};
use crate::template::{BadTemplate, Fields, Template};

/// One `[[bridges.kafka.out]]`, its templates parsed.
#[derive(Debug)]
pub(super) struct Route {
    pub(super) filter: String,
    pub(super) qos: QoS,
    topic: Template,
    key: Template,
}

impl Route {
    pub(super) fn new(o: &KafkaOut) -> Result<Route, BadTemplate> {
        let qos = match o.qos {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            _ => QoS::ExactlyOnce,
        };
        let topic = Template::parse(&o.topic, OUT_FIELDS, true)?;
        let key = Template::parse(&o.key, OUT_FIELDS, true)?;
        Ok(Route { filter: o.filter.clone(), qos, topic, key })
    }
}

/// The routes of `config` (checked when the configuration loaded, `kafka::check`).
pub(super) fn routes(config: &KafkaBridgeConfig) -> Result<Vec<Route>, BadTemplate> {
    config.out.iter().map(Route::new).collect()
}

/// What a record is made from: a PUBLISH the outbox got, or a message as published.
pub(super) struct Source<'a> {
    topic: &'a str,
    payload: &'a Bytes,
    qos: QoS,
    retain: bool,
    properties: &'a Properties,
}

impl<'a> From<&'a Publish> for Source<'a> {
    fn from(p: &'a Publish) -> Source<'a> {
        Source {
            topic: &p.topic,
            payload: &p.payload,
            qos: p.qos,
            retain: p.retain,
            properties: &p.properties,
        }
    }
}

impl<'a> From<&'a Message> for Source<'a> {
    fn from(m: &'a Message) -> Source<'a> {
        Source {
            topic: &m.topic,
            payload: &m.payload,
            qos: m.qos,
            retain: m.retain,
            properties: &m.properties,
        }
    }
}

/// A record to produce.
#[derive(Debug, Clone)]
pub(super) struct Record {
    topic: String,
    key: Option<String>,
    payload: Bytes,
    headers: OwnedHeaders,
}

impl Record {
    /// The record for the producer.
    pub(super) fn future(&self) -> FutureRecord<'_, String, [u8]> {
        let r = FutureRecord::to(&self.topic).payload(&self.payload[..]).headers(self.headers.clone());
        match &self.key {
            Some(k) => r.key(k),
            None => r,
        }
    }
}

/// The routes of `p`: those its Subscription Identifiers name whose filter matches its topic;
/// if none (it was queued under routes since changed), every route whose filter matches.
pub(super) fn matched_routes<'a>(routes: &'a [Route], p: &Publish) -> Vec<&'a Route> {
    let by_id: Vec<&Route> = p
        .properties
        .subscription_identifiers
        .iter()
        .filter_map(|id| routes.get((*id as usize).checked_sub(1)?))
        .filter(|r| matches(&r.filter, &p.topic))
        .collect();
    match by_id.is_empty() {
        false => by_id,
        true => by_topic(routes, &p.topic),
    }
}

/// The routes whose filter matches `topic`.
pub(super) fn by_topic<'a>(routes: &'a [Route], topic: &str) -> Vec<&'a Route> {
    routes.iter().filter(|r| matches(&r.filter, topic)).collect()
}

/// The records of `source` for `routes`, one each, or why one cannot be made.
pub(super) fn records(
    config: &KafkaBridgeConfig,
    routes: &[&Route],
    source: &Source,
) -> Vec<Result<Record, String>> {
    let fields = TopicFields { topic: source.topic };
    let headers = headers(source);
    let header_bytes = header_bytes(source);
    let record = |route: &Route| {
        let topic = match route.topic.fill(&fields) {
            Ok(t) if valid_kafka_topic(&t) => t,
            Ok(t) => return Err(format!("{t:?} is not a Kafka topic name")),
            Err(placeholder) => {
                return Err(format!("the topic template of {:?} has no {placeholder} for it", route.filter))
            }
        };
        let key = match route.key.is_empty() {
            true => None,
            false => Some(route.key.fill(&fields).map_err(|placeholder| {
                format!("the key template of {:?} has no {placeholder} for it", route.filter)
            })?),
        };
        let size = source.payload.len() + key.as_ref().map_or(0, |k| k.len()) + header_bytes;
        if size > config.max_record_bytes {
            return Err(format!("{size} bytes, over max_record_bytes ({})", config.max_record_bytes));
        }
        Ok(Record { topic, key, payload: source.payload.clone(), headers: headers.clone() })
    };
    routes.iter().map(|r| record(r)).collect()
}

/// Counts and logs (at most once a second) a message of `topic` that `bridge` does not bridge:
/// `why`.
pub(super) fn dropped(bridge: &str, stats: &Stats, topic: &str, why: &str) {
    bump(&stats.dropped);
    if stats.may_log() {
        warn!(%bridge, %topic, "kafka bridge out: message dropped: {why} (counted in $SYS/bridges/kafka/{bridge}/out/dropped)");
    }
}

/// The MQTT PUBLISH properties and flags as record headers: `mqtt.qos`, `mqtt.retain`,
/// `mqtt.content_type` (if set), and each user property under its own name.
fn headers(s: &Source) -> OwnedHeaders {
    let qos = (s.qos as u8).to_string();
    let retain = if s.retain { "true" } else { "false" };
    let mut h = OwnedHeaders::new()
        .insert(Header { key: "mqtt.qos", value: Some(qos.as_bytes()) })
        .insert(Header { key: "mqtt.retain", value: Some(retain.as_bytes()) });
    if let Some(ct) = &s.properties.content_type {
        h = h.insert(Header { key: "mqtt.content_type", value: Some(str::as_bytes(ct)) });
    }
    for (name, value) in &s.properties.user_properties {
        h = h.insert(Header { key: name, value: Some(str::as_bytes(value)) });
    }
    h
}

/// About how many bytes [`headers`] adds to a record.
fn header_bytes(s: &Source) -> usize {
    let user: usize = s.properties.user_properties.iter().map(|(n, v)| n.len() + v.len()).sum();
    64 + s.properties.content_type.as_ref().map_or(0, |c| c.len()) + user
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
fn valid_kafka_topic(t: &str) -> bool {
    (1..=249).contains(&t.len())
        && t != "."
        && t != ".."
        && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// An MQTT topic as template fields: `${topic}` and its levels.
struct TopicFields<'a> {
    topic: &'a str,
}

impl Fields for TopicFields<'_> {
    fn field(&self, name: &str) -> Option<&str> {
        (name == "topic").then_some(self.topic)
    }

    fn level(&self, n: usize) -> Option<&str> {
        self.topic.split('/').nth(n - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(filter: &str, topic: &str) -> Route {
        Route::new(&KafkaOut { filter: filter.into(), topic: topic.into(), ..KafkaOut::default() }).unwrap()
    }

    fn publish(topic: &str, ids: &[u32]) -> Publish {
        let mut p = Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: topic.into(),
            packet_id: 1,
            properties: Properties::default(),
            payload: Default::default(),
        };
        p.properties.subscription_identifiers = ids.to_vec();
        p
    }

    #[test]
    fn a_message_goes_by_its_subscription_identifiers_or_else_by_its_topic() {
        let routes = [route("a/#", "ta"), route("a/b", "tb"), route("c/+", "tc")];
        let filters = |p: &Publish| -> Vec<String> {
            matched_routes(&routes, p).iter().map(|r| r.filter.clone()).collect()
        };
        assert_eq!(filters(&publish("a/b", &[2])), ["a/b"]);
        assert_eq!(filters(&publish("a/b", &[1, 2])), ["a/#", "a/b"]);
        // Identifiers of routes since changed: by topic.
        assert_eq!(filters(&publish("c/x", &[1])), ["c/+"]);
        assert_eq!(filters(&publish("c/x", &[9])), ["c/+"]);
        assert!(filters(&publish("d", &[3])).is_empty());
    }

    #[test]
    fn records_take_topics_and_keys_from_the_templates_or_say_why_not() {
        let config = KafkaBridgeConfig { max_record_bytes: 1000, ..KafkaBridgeConfig::default() };
        let alarms = route("plant/+/alarms", "alarms.${2}");
        let deep = route("#", "x.${3}");
        let slash = route("#", "${topic}");
        let p = publish("plant/p7/alarms", &[]);
        let made = records(&config, &[&alarms, &deep], &Source::from(&p));
        let r = made[0].as_ref().unwrap();
        assert_eq!((r.topic.as_str(), r.key.as_deref()), ("alarms.p7", Some("plant/p7/alarms")));
        assert_eq!(made[1].as_ref().unwrap().topic, "x.alarms");
        let short = publish("a/b", &[]);
        assert!(records(&config, &[&deep], &Source::from(&short))[0].as_ref().unwrap_err().contains("${3}"));
        assert!(records(&config, &[&slash], &Source::from(&short))[0]
            .as_ref()
            .unwrap_err()
            .contains("not a Kafka topic"));
        let mut big = publish("a", &[]);
        big.payload = Bytes::from(vec![b'x'; 2000]);
        assert!(records(&config, &[&slash], &Source::from(&big))[0]
            .as_ref()
            .unwrap_err()
            .contains("max_record_bytes"));
    }

    #[test]
    fn kafka_topic_names() {
        assert!(valid_kafka_topic("mqtt.sensors_1-a"));
        assert!(!valid_kafka_topic("sensors/kitchen"));
        assert!(!valid_kafka_topic(".."));
        assert!(!valid_kafka_topic(""));
        assert!(!valid_kafka_topic(&"a".repeat(250)));
    }
}
