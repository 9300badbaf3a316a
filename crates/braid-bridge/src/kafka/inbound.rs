//! Kafka to MQTT. One consumer in the bridge's consumer group (per `in` group) reads the
//! `in` topics; each record is published in Braid by the in-process client
//! `$internal/bridge/kafka/<name>/in/<group>` to the MQTT topic its template makes, its
//! headers as user properties. A record's offset is stored for the next commit only once
//! Braid acknowledged its PUBLISH (QoS 1/2: routed, and durable in persistent sessions under
//! `store.durability = "sync"`), in the order of each partition; a record no MQTT topic can be
//! made for is skipped (logged and counted) and its offset stored too. After a failure the
//! group resumes from the last commit: Braid may get a record twice, never lose one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesOrdered, StreamExt};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message as _};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use braid_broker::config::{KafkaBridgeConfig, KafkaIn};
use braid_broker::session::QueueLimits;
use braid_broker::Broker;
use braid_client::{Bytes, Client, Message, Properties, PublishHandle, QoS, ReasonCode};
use braid_proto::topic::valid_topic_name;

use super::{client_config, with_properties, Context, IN_FIELDS};
use crate::stats::{bump, Stats};
use crate::template::{BadTemplate, Fields, Template};
use braid_client::Backoff;

/// Records published and not yet acknowledged by Braid, per group.
const WINDOW: u16 = 1024;
/// The first and the longest pause before a failed group starts again.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// One `[[bridges.kafka.in]]`, its template parsed.
#[derive(Debug)]
struct Route {
    mqtt_topic: Template,
    qos: QoS,
    retain: bool,
}

/// Runs the bridge's `in` direction, one consumer per consumer group, until `stop`.
pub(super) async fn run(
    broker: Arc<Broker>,
    config: Arc<KafkaBridgeConfig>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let mut groups: BTreeMap<String, Vec<&KafkaIn>> = BTreeMap::new();
    for n in &config.inbound {
        let group = if n.group.is_empty() { config.name.clone() } else { n.group.clone() };
        groups.entry(group).or_default().push(n);
    }
    let mut tasks = Vec::new();
    for (group, ins) in groups {
        // Checked when the configuration loaded (`kafka::check`).
        let routes = match ins.iter().map(|n| route(n).map(|r| (n.topic.clone(), r))).collect() {
            Ok(routes) => routes,
            Err(e) => return error!(bridge = %config.name, "kafka bridge in: {e}"),
        };
        let (broker, config, stats, stop) = (broker.clone(), config.clone(), stats.clone(), stop.clone());
        tasks.push(tokio::spawn(async move { group_loop(broker, config, group, routes, stats, stop).await }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

fn route(n: &KafkaIn) -> Result<Route, BadTemplate> {
    let qos = match n.qos {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    };
    Ok(Route { mqtt_topic: Template::parse(&n.mqtt_topic, IN_FIELDS, false)?, qos, retain: n.retain })
}

/// Consumes for `group` (its routes by Kafka topic), starting again after a failure.
async fn group_loop(
    broker: Arc<Broker>,
    config: Arc<KafkaBridgeConfig>,
    group: String,
    routes: BTreeMap<String, Route>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
    while !stop.is_cancelled() {
        let why = consume(&broker, &config, &group, &routes, &stats, &stop).await;
        let Some(why) = why else { return };
        warn!(bridge = %config.name, %group, "kafka bridge in: {why}; resuming from the last commit in {} ms", backoff.next().as_millis());
        if !crate::pause(&mut backoff, &stop).await {
            return;
        }
    }
}

/// One consumer and one in-process client; returns why it stopped (None: shutdown).
async fn consume(
    broker: &Arc<Broker>,
    config: &KafkaBridgeConfig,
    group: &str,
    routes: &BTreeMap<String, Route>,
    stats: &Arc<Stats>,
    stop: &CancellationToken,
) -> Option<String> {
    let context = Context { bridge: config.name.clone(), stats: stats.clone() };
    let cluster = &broker.config().cluster;
    let node = if cluster.enabled { cluster.node.as_str() } else { "" };
    let consumer: StreamConsumer<Context> =
        match consumer_config(config, group, node).create_with_context(context) {
            Ok(c) => c,
            Err(e) => return Some(format!("cannot create the Kafka consumer: {e}")),
        };
    let topics: Vec<&str> = routes.keys().map(String::as_str).collect();
    if let Err(e) = consumer.subscribe(&topics) {
        return Some(format!("cannot subscribe to {topics:?}: {e}"));
    }
    let id = format!("kafka/{}/in/{group}", config.name);
    let limits = Arc::new(QueueLimits::from_config(&broker.live().session));
    let client = match crate::connect(broker, &id, limits, WINDOW).await {
        Ok((client, _)) => client,
        Err(e) => return Some(format!("cannot connect to the broker: {e}")),
    };
    info!(bridge = %config.name, %group, ?topics, "kafka bridge in: consuming");
    let mut waiting = FuturesOrdered::new();
    let stop = loop {
        tokio::select! {
            record = consumer.recv(), if waiting.len() < usize::from(WINDOW) => match record {
                Ok(m) => {
                    if stats.set_up(true) {
                        info!(bridge = %config.name, "kafka bridge in: Kafka answers");
                    }
                    match publish(&client, config, routes, &m, stats).await {
                        Ok(handle) => {
                            let at = (m.topic().to_string(), m.partition(), m.offset());
                            waiting.push_back(acked(handle, at));
                        }
                        Err(why) => break Some(why),
                    }
                }
                Err(e) => {
                    if stats.may_log() {
                        warn!(bridge = %config.name, %group, "kafka bridge in: {e}");
                    }
                }
            },
            Some((topic, partition, offset, ok)) = waiting.next(), if !waiting.is_empty() => {
                if !ok {
                    break Some("Braid did not acknowledge a record's PUBLISH".into());
                }
                let mut tpl = TopicPartitionList::new();
                // The next offset to read: this record is done.
                if tpl.add_partition_offset(&topic, partition, Offset::Offset(offset + 1)).is_ok() {
                    if let Err(e) = consumer.store_offsets(&tpl) {
                        warn!(bridge = %config.name, %group, "kafka bridge in: cannot store the offset of {topic}/{partition}: {e}");
                    }
                }
            }
            _ = stop.cancelled() => break None,
        }
    };
    if stop.is_none() {
        // Commit what was stored before the consumer leaves the group.
        let _ = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync);
    }
    let _ = client.disconnect(ReasonCode::Success).await;
    stop
}

/// Waits for Braid's acknowledgement of the record at `at` (topic, partition, offset); true if
/// it was accepted (or needed none).
async fn acked(handle: Option<PublishHandle>, at: (String, i32, i64)) -> (String, i32, i64, bool) {
    let ok = match handle {
        None => true,
        Some(h) => match h.await {
            Ok(_) => true,
            // Refused as such (e.g. by a queue limit): retrying would not help.
            Err(braid_client::Error::Rejected(_)) => true,
            Err(_) => false,
        },
    };
    (at.0, at.1, at.2, ok)
}

/// Publishes record `m` in Braid: the handle to wait on, None if it was skipped (counted) or
/// needs no acknowledgement; Err if the client is gone.
async fn publish(
    client: &Client,
    config: &KafkaBridgeConfig,
    routes: &BTreeMap<String, Route>,
    m: &BorrowedMessage<'_>,
    stats: &Stats,
) -> Result<Option<PublishHandle>, String> {
    let Some(route) = routes.get(m.topic()) else { return Ok(None) };
    let partition = m.partition().to_string();
    let fields = RecordFields {
        key: m.key().and_then(|k| std::str::from_utf8(k).ok()),
        topic: m.topic(),
        partition: &partition,
    };
    let skip = |why: String| {
        bump(&stats.skipped);
        if stats.may_log() {
            warn!(bridge = %config.name, topic = m.topic(), partition = m.partition(), offset = m.offset(), "kafka bridge in: record skipped: {why} (counted in $SYS/bridges/kafka/{}/in/skipped)", config.name);
        }
        Ok(None)
    };
    let topic = match route.mqtt_topic.fill(&fields) {
        Ok(t) if valid_topic_name(&t) && !t.starts_with('$') => t,
        Ok(t) => return skip(format!("{t:?} is not a topic it may publish to")),
        Err(placeholder) if placeholder == "${key}" => {
            return skip("the record has no UTF-8 key for ${key}".into());
        }
        Err(placeholder) => return skip(format!("no {placeholder} for it")),
    };
    let mut properties = Properties::default();
    if let Some(headers) = m.headers() {
        for h in headers.iter() {
            if let Some(value) = h.value.and_then(|v| std::str::from_utf8(v).ok()) {
                properties.user_properties.push((h.key.into(), value.into()));
            }
        }
    }
    let payload = Bytes::copy_from_slice(m.payload().unwrap_or_default());
    let msg = Message { topic, payload, qos: route.qos, retain: route.retain, properties };
    match client.publish(msg).await {
        Ok(handle) => {
            bump(&stats.received);
            Ok((route.qos != QoS::AtMostOnce).then_some(handle))
        }
        Err(braid_client::Error::Rejected(reason)) => skip(format!("refused by the client: {reason:?}")),
        Err(e) => Err(format!("cannot publish: {e}")),
    }
}

/// The consumer's settings: offsets stored by the bridge once Braid has a record and
/// committed every second; a new group starts at the topic's beginning. A static member of
/// the group (`group.instance.id`, one per bridge, group and cluster `node`): a broker that
/// restarts, even after `kill -9`, takes its partitions back at once instead of waiting for
/// its old self's session to time out.
fn consumer_config(c: &KafkaBridgeConfig, group: &str, node: &str) -> rdkafka::ClientConfig {
    let mut k = client_config(c);
    let instance = match node {
        "" => format!("braid-{}-{group}", c.name),
        node => format!("braid-{}-{group}-{node}", c.name),
    };
    k.set("group.id", group)
        .set("group.instance.id", instance)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest");
    with_properties(k, c)
}

/// A record as template fields.
struct RecordFields<'a> {
    key: Option<&'a str>,
    topic: &'a str,
    partition: &'a str,
}

impl Fields for RecordFields<'_> {
    fn field(&self, name: &str) -> Option<&str> {
        match name {
            "key" => self.key,
            "topic" => Some(self.topic),
            "partition" => Some(self.partition),
            _ => None,
        }
    }
}
