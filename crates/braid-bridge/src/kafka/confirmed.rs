//! MQTT to Kafka with `ack = "kafka"`: no outbox. The bridge subscribes to each `out` filter
//! as a remote subscriber of the broker ([`RemoteSink`]); a message it is handed is produced at
//! once, and its publisher's PUBACK / PUBREC waits until Kafka has acknowledged every one of
//! its records (a [`Confirm`]). While Kafka is away its records are produced again, after a
//! pause, until Kafka takes them: the acknowledgement waits, and the publisher's Receive
//! Maximum holds it back. A record Kafka can never take is dropped and counted, and a v5
//! publisher's acknowledgement says 0x80 (Unspecified error). Nothing is kept in Braid's
//! store: what was not acknowledged is the publisher's to send again. A remote subscriber's
//! filters are not announced to a cluster's other nodes: each node bridges what is published
//! on it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::producer::FutureProducer;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use braid_broker::config::KafkaBridgeConfig;
use braid_broker::router::{Confirm, Delivered, Forward, RemoteSink};
use braid_broker::Broker;
use braid_client::{ReasonCode, RetainHandling, SubscriptionOptions};

use super::record::{self, dropped, records, Record, Route, Source};
use super::{permanent, producer_config, Context};
use crate::stats::{bump, drop_one, Stats};

/// The longest pause before a record Kafka did not take is produced again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Subscribes bridge `config`'s producer to its `out` filters, until `stop`.
pub(super) fn start(
    broker: &Arc<Broker>,
    config: Arc<KafkaBridgeConfig>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let routes = match record::routes(&config) {
        Ok(routes) => routes,
        Err(e) => return error!(bridge = %config.name, "kafka bridge out: {e}"),
    };
    let context = Context { bridge: config.name.clone(), stats: stats.clone() };
    let producer: FutureProducer<Context> = match producer_config(&config).create_with_context(context) {
        Ok(p) => p,
        Err(e) => {
            return error!(bridge = %config.name, "kafka bridge out: cannot create the Kafka producer: {e}")
        }
    };
    let filters: Vec<(String, SubscriptionOptions)> = routes
        .iter()
        .map(|r| {
            (
                r.filter.clone(),
                SubscriptionOptions {
                    qos: r.qos,
                    retain_handling: RetainHandling::DoNotSend,
                    ..Default::default()
                },
            )
        })
        .collect();
    let sink = Arc::new(KafkaSink { config, routes, producer: Arc::new(producer), stats });
    let remote = broker.remote_sink(sink.clone());
    for (filter, options) in &filters {
        if let Err(reason) = broker.subscribe_remote(&remote, filter, *options) {
            error!(bridge = %sink.config.name, %filter, "kafka bridge out: cannot subscribe: {reason:?}");
        }
    }
    let broker = broker.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        for (filter, _) in &filters {
            broker.unsubscribe_remote(&remote, filter);
        }
    });
    info!(bridge = %sink.config.name, "kafka bridge out: publishers are acknowledged once Kafka has their messages (ack = \"kafka\")");
}

/// The bridge as a remote subscriber.
struct KafkaSink {
    config: Arc<KafkaBridgeConfig>,
    routes: Vec<Route>,
    producer: Arc<FutureProducer<Context>>,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink").field("bridge", &self.config.name).finish_non_exhaustive()
    }
}

impl RemoteSink for KafkaSink {
    fn deliver(&self, fwd: Forward, _now: Instant) -> Delivered {
        let matched = record::by_topic(&self.routes, &fwd.msg.topic);
        let mut made = Vec::new();
        let mut reason = ReasonCode::Success;
        for r in records(&self.config, &matched, &Source::from(&*fwd.msg)) {
            match r {
                Ok(record) => made.push(record),
                Err(why) => {
                    dropped(&self.config.name, &self.stats, &fwd.msg.topic, &why);
                    reason = ReasonCode::UnspecifiedError;
                }
            }
        }
        let (tx, rx) = oneshot::channel();
        let (producer, config, stats) = (self.producer.clone(), self.config.clone(), self.stats.clone());
        let topic = fwd.msg.topic.to_string();
        tokio::spawn(async move {
            for record in made {
                if !produce_until_taken(&producer, &record, &config, &stats, &topic).await {
                    reason = ReasonCode::UnspecifiedError;
                }
            }
            if reason == ReasonCode::Success {
                bump(&stats.sent);
            }
            let _ = tx.send(reason);
        });
        let word = async move { rx.await.unwrap_or(ReasonCode::UnspecifiedError) };
        Delivered { confirm: Some(Confirm::new(word)), ..Delivered::queued(0) }
    }
}

/// Produces `record` until Kafka takes it (true) or refuses it for good (false: dropped and
/// counted).
async fn produce_until_taken(
    producer: &FutureProducer<Context>,
    record: &Record,
    config: &KafkaBridgeConfig,
    stats: &Stats,
    topic: &str,
) -> bool {
    let mut backoff = Duration::from_millis(200);
    loop {
        let failure = match producer.send_result(record.future()) {
            Ok(delivery) => {
                bump(&stats.in_flight);
                let result = delivery.await;
                drop_one(&stats.in_flight);
                match result {
                    Ok(Ok(_)) => {
                        if stats.set_up(true) {
                            info!(bridge = %config.name, "kafka bridge out: Kafka acknowledges records");
                        }
                        return true;
                    }
                    Ok(Err((e, _))) => e,
                    // The producer is gone: the broker is stopping.
                    Err(_) => return false,
                }
            }
            Err((e, _)) => e,
        };
        if permanent(&failure) {
            dropped(&config.name, stats, topic, &failure.to_string());
            return false;
        }
        bump(&stats.failed);
        if stats.may_log() {
            warn!(bridge = %config.name, %topic, "kafka bridge out: Kafka did not take a record ({failure}); producing it again in {} ms, its publisher's acknowledgement waits", backoff.as_millis());
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
