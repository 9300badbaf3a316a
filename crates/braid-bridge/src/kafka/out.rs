//! MQTT to Kafka. The bridge's outbox is the persistent session of the in-process client
//! `$internal/bridge/kafka/<name>/out`, subscribed to each `out` filter (its Subscription
//! Identifier names the route). Every message it gets becomes one record per matching route,
//! handed to an idempotent producer; the message is acknowledged to the outbox once Kafka has
//! every one of its records, in the order received. A record Kafka can never take (too large,
//! no such topic, a topic or key the template cannot make) is dropped, logged and counted; on
//! any other failure the bridge drops its connection and comes back after a pause, and the
//! outbox sends again, in order, what was not acknowledged (at least once: Kafka may get a
//! record twice).

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesOrdered, StreamExt};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tracing::{error, info, warn};

use braid_broker::config::{KafkaBridgeConfig, KafkaOut, OverflowPolicy};
use braid_broker::session::QueueLimits;
use braid_broker::Broker;
use braid_client::{
    Client, Event, Properties, Publish, QoS, ReasonCode, RetainHandling, SubscriptionOptions,
};
use braid_proto::topic::matches;

use super::{client_config, permanent, with_properties, Context, OUT_FIELDS};
use crate::stats::{bump, drop_one, Stats};
use crate::template::{BadTemplate, Fields, Template};

/// Messages in flight between the outbox and Kafka.
const WINDOW: u16 = 1024;
/// The longest pause before the bridge connects again after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// One `[[bridges.kafka.out]]`, its templates parsed.
#[derive(Debug)]
struct Route {
    filter: String,
    qos: QoS,
    topic: Template,
    key: Template,
}

impl Route {
    fn new(o: &KafkaOut) -> Result<Route, BadTemplate> {
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

/// Why a session of the bridge ended.
enum Ended {
    Shutdown,
    /// Connect again after a pause; true if it delivered something.
    Retry(String, bool),
}

/// Runs the bridge's `out` direction until the broker shuts down.
pub(super) async fn run(broker: Arc<Broker>, config: Arc<KafkaBridgeConfig>, stats: Arc<Stats>) {
    // Checked when the configuration loaded (`kafka::check`).
    let routes = match config.out.iter().map(Route::new).collect::<Result<Vec<Route>, _>>() {
        Ok(routes) => routes,
        Err(e) => return error!(bridge = %config.name, "kafka bridge out: {e}"),
    };
    let limits = Arc::new(QueueLimits {
        max_messages: config.max_queued_messages,
        max_bytes: config.max_queued_bytes,
        queue_qos0: false,
        overflow: config.queue_overflow,
        overflow_qos0: OverflowPolicy::DropNewest,
        qos0_pacing: Duration::ZERO,
    });
    let mut backoff = Duration::from_millis(200);
    loop {
        let ended = session(&broker, &config, &routes, &limits, &stats).await;
        let Ended::Retry(why, delivered) = ended else { return };
        if delivered {
            backoff = Duration::from_millis(200);
        }
        warn!(bridge = %config.name, "kafka bridge out: {why}; resending what Kafka has not acknowledged in {} ms", backoff.as_millis());
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = broker.shutdown.cancelled() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection of the outbox and one producer, until a failure or the shutdown.
async fn session(
    broker: &Arc<Broker>,
    config: &KafkaBridgeConfig,
    routes: &[Route],
    limits: &Arc<QueueLimits>,
    stats: &Arc<Stats>,
) -> Ended {
    if broker.shutdown.is_cancelled() {
        return Ended::Shutdown;
    }
    let context = Context { bridge: config.name.clone(), stats: stats.clone() };
    let producer: FutureProducer<Context> = match producer_config(config).create_with_context(context) {
        Ok(p) => p,
        Err(e) => return Ended::Retry(format!("cannot create the Kafka producer: {e}"), false),
    };
    let id = format!("kafka/{}/out", config.name);
    let (client, connected) = match crate::connect(broker, &id, limits.clone(), WINDOW).await {
        Ok(c) => c,
        Err(e) => return Ended::Retry(format!("cannot open the outbox: {e}"), false),
    };
    let client_id = connected.client_id.clone();
    if let Err(why) = subscribe(broker, &client, &client_id, routes).await {
        let _ = client.disconnect(ReasonCode::Success).await;
        return Ended::Retry(why, false);
    }
    let mut pending = FuturesOrdered::new();
    let mut delivered = false;
    loop {
        tokio::select! {
            event = client.recv_unacked() => match event {
                Some((Event::Message(p), received)) => {
                    let sends = produce(&producer, config, routes, &p, stats);
                    let stats = stats.clone();
                    pending.push_back(async move { (received, finish(sends, &stats).await) });
                }
                Some((Event::Disconnected(_), _)) | None => {
                    return match broker.shutdown.is_cancelled() {
                        true => Ended::Shutdown,
                        false => Ended::Retry("the outbox's connection closed".into(), delivered),
                    };
                }
                Some(_) => {}
            },
            Some((received, outcome)) = pending.next(), if !pending.is_empty() => {
                match outcome {
                    Outcome::Sent => {
                        delivered = true;
                        bump(&stats.sent);
                        if stats.set_up(true) {
                            info!(bridge = %config.name, "kafka bridge out: Kafka acknowledges records");
                        }
                    }
                    Outcome::Dropped => bump(&stats.dropped),
                    Outcome::Retry(why) => {
                        stats.failed.fetch_add(1 + pending.len() as u64, std::sync::atomic::Ordering::Relaxed);
                        let _ = client.disconnect(ReasonCode::Success).await;
                        return Ended::Retry(why, delivered);
                    }
                }
                if let Some(r) = received {
                    client.ack(r);
                }
            }
            _ = broker.shutdown.cancelled() => return Ended::Shutdown,
        }
    }
}

/// Subscribes the outbox (`client_id`'s session) to every route's filter, with the route's
/// position from 1 as Subscription Identifier, and unsubscribes it from filters no route has
/// any more (the configuration changed). Retained messages are not sent at subscribe: the bridge carries
/// what is published.
async fn subscribe(
    broker: &Broker,
    client: &Client,
    client_id: &str,
    routes: &[Route],
) -> Result<(), String> {
    let stale: Vec<String> = broker
        .subscriptions_of(client_id)
        .iter()
        .filter(|f| !routes.iter().any(|r| r.filter == ***f))
        .map(|f| f.to_string())
        .collect();
    if !stale.is_empty() {
        info!(filters = ?stale, "kafka bridge out: the outbox leaves filters no route has any more");
        if let Err(e) = client.unsubscribe(stale, Properties::default()).await {
            return Err(format!("cannot unsubscribe the outbox from old filters: {e}"));
        }
    }
    for (i, r) in routes.iter().enumerate() {
        let mut props = Properties::default();
        props.subscription_identifiers = vec![i as u32 + 1];
        let opts = SubscriptionOptions {
            qos: r.qos,
            retain_handling: RetainHandling::DoNotSend,
            ..Default::default()
        };
        match client.subscribe(vec![(r.filter.clone(), opts)], props).await {
            Ok(codes) if codes.iter().all(|c| (*c as u8) < 0x80) => {}
            Ok(codes) => {
                return Err(format!("the outbox's subscription to {:?} was refused: {codes:?}", r.filter))
            }
            Err(e) => return Err(format!("cannot subscribe the outbox to {:?}: {e}", r.filter)),
        }
    }
    Ok(())
}

/// What became of a message.
enum Outcome {
    /// Every record is in Kafka.
    Sent,
    /// A record could never be taken: logged, the message is done with.
    Dropped,
    /// Kafka failed: send again later.
    Retry(String),
}

/// A record handed to the producer, or why it was not.
enum Send {
    Queued(rdkafka::producer::DeliveryFuture),
    Dropped,
    Retry(String),
}

/// Hands `p`'s records (one per route whose Subscription Identifier it carries) to the producer.
fn produce(
    producer: &FutureProducer<Context>,
    config: &KafkaBridgeConfig,
    routes: &[Route],
    p: &Publish,
    stats: &Stats,
) -> Vec<Send> {
    let fields = TopicFields { topic: &p.topic };
    let headers = headers(p);
    let drop = |why: String| {
        if stats.may_log() {
            warn!(bridge = %config.name, topic = %p.topic, "kafka bridge out: message dropped: {why} (counted in $SYS/bridges/kafka/{}/out/dropped)", config.name);
        }
        Send::Dropped
    };
    let matched = matched_routes(routes, p);
    if matched.is_empty() {
        return vec![drop("no out route's filter matches its topic any more".into())];
    }
    let mut sends = Vec::new();
    for route in matched {
        let topic = match route.topic.fill(&fields) {
            Ok(t) if valid_kafka_topic(&t) => t,
            Ok(t) => {
                sends.push(drop(format!("{t:?} is not a Kafka topic name")));
                continue;
            }
            Err(placeholder) => {
                sends.push(drop(format!(
                    "the topic template of {:?} has no {placeholder} for it",
                    route.filter
                )));
                continue;
            }
        };
        let key = match route.key.is_empty() {
            true => None,
            false => match route.key.fill(&fields) {
                Ok(k) => Some(k),
                Err(placeholder) => {
                    sends.push(drop(format!(
                        "the key template of {:?} has no {placeholder} for it",
                        route.filter
                    )));
                    continue;
                }
            },
        };
        let size = p.payload.len() + key.as_ref().map_or(0, |k| k.len()) + header_bytes(p);
        if size > config.max_record_bytes {
            sends.push(drop(format!("{size} bytes, over max_record_bytes ({})", config.max_record_bytes)));
            continue;
        }
        let mut record = FutureRecord::to(&topic).payload(&p.payload[..]).headers(headers.clone());
        if let Some(k) = &key {
            record = record.key(k);
        }
        match producer.send_result(record) {
            Ok(delivery) => {
                bump(&stats.in_flight);
                sends.push(Send::Queued(delivery));
            }
            Err((e, _)) if permanent(&e) => sends.push(drop(e.to_string())),
            Err((e, _)) => sends.push(Send::Retry(format!("the producer refused a record: {e}"))),
        }
    }
    sends
}

/// The routes of `p`: those its Subscription Identifiers name whose filter matches its topic;
/// if none (it was queued under routes since changed), every route whose filter matches.
fn matched_routes<'a>(routes: &'a [Route], p: &Publish) -> Vec<&'a Route> {
    let by_id: Vec<&Route> = p
        .properties
        .subscription_identifiers
        .iter()
        .filter_map(|id| routes.get((*id as usize).checked_sub(1)?))
        .filter(|r| matches(&r.filter, &p.topic))
        .collect();
    match by_id.is_empty() {
        false => by_id,
        true => routes.iter().filter(|r| matches(&r.filter, &p.topic)).collect(),
    }
}

/// Waits for every record of a message.
async fn finish(sends: Vec<Send>, stats: &Stats) -> Outcome {
    let mut outcome = Outcome::Sent;
    for send in sends {
        let this = match send {
            Send::Queued(delivery) => match delivery.await.inspect(|_| drop_one(&stats.in_flight)) {
                Ok(Ok(_)) => Outcome::Sent,
                Ok(Err((e, _))) if permanent(&e) => {
                    warn!("kafka bridge out: Kafka refused a record for good: {e}");
                    Outcome::Dropped
                }
                Ok(Err((e, _))) => Outcome::Retry(format!("Kafka did not take a record: {e}")),
                Err(_) => Outcome::Retry("the producer stopped".into()),
            },
            Send::Dropped => Outcome::Dropped,
            Send::Retry(why) => Outcome::Retry(why),
        };
        outcome = match (outcome, this) {
            (Outcome::Retry(why), _) | (_, Outcome::Retry(why)) => Outcome::Retry(why),
            (Outcome::Dropped, _) | (_, Outcome::Dropped) => Outcome::Dropped,
            _ => Outcome::Sent,
        };
    }
    outcome
}

/// The producer's settings: idempotent (acks from all in-sync replicas, no duplicates or
/// reordering from its own retries), batched, compressed.
fn producer_config(c: &KafkaBridgeConfig) -> rdkafka::ClientConfig {
    let mut p = client_config(c);
    p.set("enable.idempotence", "true")
        .set("compression.type", &c.compression)
        .set("linger.ms", c.linger_ms.to_string())
        .set("message.max.bytes", (c.max_record_bytes + 512).to_string())
        .set("message.timeout.ms", c.delivery_timeout_ms.to_string());
    with_properties(p, c)
}

/// The MQTT PUBLISH properties and flags as record headers: `mqtt.qos`, `mqtt.retain`,
/// `mqtt.content_type` (if set), and each user property under its own name.
fn headers(p: &Publish) -> OwnedHeaders {
    let qos = (p.qos as u8).to_string();
    let mut h =
        OwnedHeaders::new().insert(Header { key: "mqtt.qos", value: Some(qos.as_bytes()) }).insert(Header {
            key: "mqtt.retain",
            value: Some(if p.retain { "true" } else { "false" }.as_bytes()),
        });
    if let Some(ct) = &p.properties.content_type {
        h = h.insert(Header { key: "mqtt.content_type", value: Some(str::as_bytes(ct)) });
    }
    for (name, value) in &p.properties.user_properties {
        h = h.insert(Header { key: name, value: Some(str::as_bytes(value)) });
    }
    h
}

/// About how many bytes [`headers`] adds to a record.
fn header_bytes(p: &Publish) -> usize {
    let user: usize = p.properties.user_properties.iter().map(|(n, v)| n.len() + v.len()).sum();
    64 + p.properties.content_type.as_ref().map_or(0, |c| c.len()) + user
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
        let topics = |p: &Publish| -> Vec<String> {
            matched_routes(&routes, p).iter().map(|r| r.filter.clone()).collect()
        };
        assert_eq!(topics(&publish("a/b", &[2])), ["a/b"]);
        assert_eq!(topics(&publish("a/b", &[1, 2])), ["a/#", "a/b"]);
        // Identifiers of routes since changed: by topic.
        assert_eq!(topics(&publish("c/x", &[1])), ["c/+"]);
        assert_eq!(topics(&publish("c/x", &[9])), ["c/+"]);
        assert!(topics(&publish("d", &[3])).is_empty());
    }

    #[test]
    fn templates_make_topics_and_keys_from_levels() {
        let r = route("plant/+/alarms", "alarms.${2}");
        let fields = TopicFields { topic: "plant/p7/alarms" };
        assert_eq!(r.topic.fill(&fields).unwrap(), "alarms.p7");
        assert_eq!(r.key.fill(&fields).unwrap(), "plant/p7/alarms");
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
