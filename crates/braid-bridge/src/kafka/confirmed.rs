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
//!
//! The publisher's path (under the router's lock) only makes a message's records and hands
//! them, through a channel, to the bridge's one producing task, which produces them and waits
//! for Kafka's word on every message at once: nothing is spawned per message.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use rdkafka::producer::FutureProducer;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use braid_broker::config::KafkaBridgeConfig;
use braid_broker::router::{Confirm, Delivered, Forward, RemoteSink};
use braid_broker::Broker;
use braid_client::{Backoff, ByteString, ReasonCode, RetainHandling, SubscriptionOptions};

use super::record::{self, dropped, records, Record, Route, Source};
use super::{permanent, producer_config, Context};
use crate::stats::{bump, drop_one, Stats};

/// The first pause before a record Kafka did not take is produced again.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
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
    let (jobs, queue) = mpsc::unbounded_channel();
    tokio::spawn(produce(queue, producer, config.clone(), stats.clone()));
    let sink = Arc::new(KafkaSink { config, routes, jobs, stats });
    let remote = broker.remotes().remote_sink(sink.clone());
    for (filter, options) in &filters {
        if let Err(reason) = broker.remotes().subscribe_remote(&remote, filter, *options) {
            error!(bridge = %sink.config.name, %filter, "kafka bridge out: cannot subscribe: {reason:?}");
        }
    }
    let broker = broker.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        for (filter, _) in &filters {
            broker.remotes().unsubscribe_remote(&remote, filter);
        }
    });
    info!(bridge = %sink.config.name, "kafka bridge out: publishers are acknowledged once Kafka has their messages (ack = \"kafka\")");
}

/// The bridge as a remote subscriber.
struct KafkaSink {
    config: Arc<KafkaBridgeConfig>,
    routes: Vec<Route>,
    /// To the producing task ([`produce`]).
    jobs: mpsc::UnboundedSender<Job>,
    stats: Arc<Stats>,
}

/// A message for the producing task: its records, and where Kafka's word on them goes.
struct Job {
    records: Vec<Record>,
    /// The message's MQTT topic, for the log.
    topic: ByteString,
    /// Success, or why a record could not be made.
    reason: ReasonCode,
    word: oneshot::Sender<ReasonCode>,
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
        let (word, rx) = oneshot::channel();
        // Fails only once the producing task has ended (the runtime is stopping): the word is
        // then an error, as the dropped sender says.
        let _ = self.jobs.send(Job { records: made, topic: fwd.msg.topic.clone(), reason, word });
        let word = async move { rx.await.unwrap_or(ReasonCode::UnspecifiedError) };
        Delivered { confirm: Some(Confirm::new(word)), ..Delivered::queued(0) }
    }
}

/// The bridge's producing task: produces the records of each message it is handed, in the
/// order handed, and gives each message's word once Kafka has taken (or refused) all its
/// records; many messages wait for Kafka at once. Ends once the sink is gone and every
/// message has its word.
async fn produce(
    mut jobs: mpsc::UnboundedReceiver<Job>,
    producer: FutureProducer<Context>,
    config: Arc<KafkaBridgeConfig>,
    stats: Arc<Stats>,
) {
    let (producer, config, stats) = (&producer, &*config, &*stats);
    let confirm = |job: Job| async move {
        let mut reason = job.reason;
        for record in &job.records {
            if !produce_until_taken(producer, record, config, stats, &job.topic).await {
                reason = ReasonCode::UnspecifiedError;
            }
        }
        if reason == ReasonCode::Success {
            bump(&stats.sent);
        }
        let _ = job.word.send(reason);
    };
    let mut waiting = FuturesUnordered::new();
    loop {
        tokio::select! {
            job = jobs.recv() => match job {
                Some(job) => waiting.push(confirm(job)),
                None => break,
            },
            Some(()) = waiting.next(), if !waiting.is_empty() => {}
        }
    }
    while waiting.next().await.is_some() {}
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
    let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
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
            warn!(bridge = %config.name, %topic, "kafka bridge out: Kafka did not take a record ({failure}); producing it again in {} ms, its publisher's acknowledgement waits", backoff.next().as_millis());
        }
        tokio::time::sleep(backoff.pause()).await;
    }
}
