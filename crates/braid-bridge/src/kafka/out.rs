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
use rdkafka::producer::FutureProducer;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use braid_broker::config::KafkaBridgeConfig;
use braid_broker::session::QueueLimits;
use braid_broker::Broker;
use braid_client::{Client, Event, Properties, Publish, ReasonCode, RetainHandling, SubscriptionOptions};

use super::record::{self, dropped, matched_routes, records, Route, Source};
use super::{permanent, producer_config, Context};
use crate::stats::{bump, drop_one, Stats};
use braid_client::Backoff;

/// Messages in flight between the outbox and Kafka.
const WINDOW: u16 = 1024;
/// The first and the longest pause before the bridge connects again after a failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The id of bridge `name`'s outbox among the bridges' in-process clients.
pub(super) fn outbox_id(name: &str) -> String {
    format!("kafka/{name}/out")
}

/// Why a session of the bridge ended.
enum Ended {
    Shutdown,
    /// Connect again after a pause; true if it delivered something.
    Retry(String, bool),
}

/// Runs the bridge's `out` direction until `stop` (the broker shuts down, or a reload stops
/// the bridge).
pub(super) async fn run(
    broker: Arc<Broker>,
    config: Arc<KafkaBridgeConfig>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let routes = match record::routes(&config) {
        Ok(routes) => routes,
        Err(e) => return error!(bridge = %config.name, "kafka bridge out: {e}"),
    };
    let limits =
        crate::outbox_limits(config.max_queued_messages, config.max_queued_bytes, config.queue_overflow);
    let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
    loop {
        let ended = session(&broker, &config, &routes, &limits, &stats, &stop).await;
        let Ended::Retry(why, delivered) = ended else { return };
        if delivered {
            backoff.reset();
        }
        warn!(bridge = %config.name, "kafka bridge out: {why}; resending what Kafka has not acknowledged in {} ms", backoff.next().as_millis());
        if !crate::pause(&mut backoff, &stop).await {
            return;
        }
    }
}

/// One connection of the outbox and one producer, until a failure or the shutdown.
async fn session(
    broker: &Arc<Broker>,
    config: &KafkaBridgeConfig,
    routes: &[Route],
    limits: &Arc<QueueLimits>,
    stats: &Arc<Stats>,
    stop: &CancellationToken,
) -> Ended {
    if stop.is_cancelled() {
        return Ended::Shutdown;
    }
    let context = Context { bridge: config.name.clone(), stats: stats.clone() };
    let producer: FutureProducer<Context> = match producer_config(config).create_with_context(context) {
        Ok(p) => p,
        Err(e) => return Ended::Retry(format!("cannot create the Kafka producer: {e}"), false),
    };
    let id = outbox_id(&config.name);
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
    let bridge: Arc<str> = config.name.as_str().into();
    loop {
        tokio::select! {
            event = client.recv_unacked() => match event {
                Some((Event::Message(p), received)) => {
                    let sends = produce(&producer, config, routes, &p, stats);
                    let (stats, bridge) = (stats.clone(), bridge.clone());
                    pending.push_back(async move { (received, finish(sends, &bridge, &stats, &p.topic).await) });
                }
                Some((Event::Disconnected(_), _)) | None => {
                    return match stop.is_cancelled() {
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
                    // Counted and logged when it was dropped.
                    Outcome::Dropped => {}
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
            _ = stop.cancelled() => return Ended::Shutdown,
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
    let keep: Vec<&str> = routes.iter().map(|r| r.filter.as_str()).collect();
    crate::leave_stale(broker, client, client_id, &keep).await?;
    for (i, r) in routes.iter().enumerate() {
        let mut props = Properties::default();
        props.subscription_identifiers = vec![i as u32 + 1];
        let opts = SubscriptionOptions {
            qos: r.qos,
            retain_as_published: true,
            retain_handling: RetainHandling::DoNotSend,
            ..Default::default()
        };
        match client.subscribe(vec![(r.filter.clone(), opts)], props).await {
            Ok(codes) if codes.iter().all(|c| !c.is_error()) => {}
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

/// Hands `p`'s records (one per route it matches) to the producer.
fn produce(
    producer: &FutureProducer<Context>,
    config: &KafkaBridgeConfig,
    routes: &[Route],
    p: &Publish,
    stats: &Stats,
) -> Vec<Send> {
    let matched = matched_routes(routes, p);
    if matched.is_empty() {
        dropped(&config.name, stats, &p.topic, "no out route's filter matches its topic any more");
        return vec![Send::Dropped];
    }
    let mut sends = Vec::new();
    for record in records(config, &matched, &Source::from(p)) {
        let send = match record.map(|r| producer.send_result(r.future()).map_err(|(e, _)| e)) {
            Ok(Ok(delivery)) => {
                bump(&stats.in_flight);
                Send::Queued(delivery)
            }
            Ok(Err(e)) if !permanent(&e) => Send::Retry(format!("the producer refused a record: {e}")),
            Ok(Err(e)) => {
                dropped(&config.name, stats, &p.topic, &e.to_string());
                Send::Dropped
            }
            Err(why) => {
                dropped(&config.name, stats, &p.topic, &why);
                Send::Dropped
            }
        };
        sends.push(send);
    }
    sends
}

/// Waits for every record of a message of `topic`.
async fn finish(sends: Vec<Send>, bridge: &str, stats: &Stats, topic: &str) -> Outcome {
    let mut outcome = Outcome::Sent;
    for send in sends {
        let this = match send {
            Send::Queued(delivery) => match delivery.await.inspect(|_| drop_one(&stats.in_flight)) {
                Ok(Ok(_)) => Outcome::Sent,
                Ok(Err((e, _))) if permanent(&e) => {
                    dropped(bridge, stats, topic, &format!("Kafka refused its record: {e}"));
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
