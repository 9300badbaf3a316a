//! Braid's bridges to other systems (see `docs/bridges.md`): Kafka and other MQTT brokers, in
//! both directions.
//!
//! A bridge uses the broker as MQTT clients do, through in-process connections
//! ([`braid_broker::connection::in_process`]): what it takes out of Braid, it takes through a
//! persistent session subscribed to its filters, its **outbox**: queued, bounded and counted by
//! the session queue policies, kept in the store like any persistent session's queue (so it
//! survives a restart and `kill -9`), and acknowledged (PUBACK) only once the other side has
//! the message; what it brings in, it publishes, and acknowledges to the other side only once
//! Braid acknowledged the PUBLISH (durable under `store.durability = "sync"`).
//!
//! The rooms: `template` (topic and key templates), `stats` (counters and their `$SYS`
//! topics), `kafka` (the Kafka bridge: `out` and `inbound`, behind the cargo feature `kafka`),
//! `mqtt` (the MQTT bridge, `[[bridges.mqtt]]`).

#[cfg(feature = "kafka")]
mod kafka;
mod mqtt;
mod stats;
pub mod template;

use std::sync::Arc;
use std::time::Duration;

use braid_broker::config::{Config, ConfigError, OverflowPolicy};
use braid_broker::connection::in_process;
use braid_broker::session::QueueLimits;
use braid_broker::Broker;
use braid_client::{Client, ClientOptions, Connected, InMemory, ProtocolVersion, Transport};

/// Checks the `[bridges]` settings that the configuration's own validation cannot (templates,
/// names, a bridge kind this build lacks): the error names the key and the problem.
pub fn check(config: &Config) -> Result<(), ConfigError> {
    #[cfg(feature = "kafka")]
    kafka::check(&config.bridges.kafka)?;
    #[cfg(not(feature = "kafka"))]
    if !config.bridges.kafka.is_empty() {
        return Err(ConfigError::invalid(
            "bridges.kafka",
            "this braid was built without Kafka support (cargo feature `kafka` of braid-bridge)",
        ));
    }
    mqtt::check(&config.bridges.mqtt)
}

/// Starts the configured bridges on `broker` (checked by [`check`]); they run until the broker
/// shuts down. A bridge whose other side is away keeps trying, logs and counts; it never stops
/// the broker.
pub fn start(broker: &Arc<Broker>) {
    #[cfg(feature = "kafka")]
    for config in &broker.config.bridges.kafka {
        kafka::start(broker, config.clone());
    }
    for config in &broker.config.bridges.mqtt {
        mqtt::start(broker, config.clone());
    }
}

/// Connects the in-process client `$internal/bridge/<id>` (in a cluster `...@<node>`: each
/// node bridges what is published on it, through an outbox of its own) to `broker` with a
/// persistent session (it never expires: an outbox keeps what it holds until it is
/// delivered), its queue under `limits`, at most `window` messages in flight each way.
pub(crate) async fn connect(
    broker: &Arc<Broker>,
    id: &str,
    limits: Arc<QueueLimits>,
    window: u16,
) -> Result<(Client, Connected), braid_client::Error> {
    let client_id = client_id(broker, id);
    let (name, opener) = (id.to_string(), broker.clone());
    let mut opts = ClientOptions::new("in-process", 0);
    opts.transport =
        Transport::InMemory(InMemory::new(move || Ok(in_process::connect(&opener, &name, limits.clone()))));
    opts.version = ProtocolVersion::V5;
    opts.client_id = client_id;
    opts.clean_start = false;
    opts.session_expiry = Some(u32::MAX);
    opts.receive_maximum = window;
    opts.max_inflight = window;
    Client::connect(opts).await
}

/// The client id of the in-process client `id` of a bridge: `$internal/bridge/<id>`, with
/// `@<node>` in a cluster.
pub(crate) fn client_id(broker: &Broker, id: &str) -> String {
    let cluster = &broker.config.cluster;
    let node = if cluster.enabled { format!("@{}", cluster.node) } else { String::new() };
    format!("{}bridge/{id}{node}", in_process::RESERVED)
}

/// Checks the name of bridge `i` of `names` (every bridge of one kind, in order): `Err` with
/// the problem if it is not 1 to 64 letters, digits, `-`, `_` or `.`, or an earlier bridge has
/// it.
pub(crate) fn check_name(names: &[&str], i: usize) -> Result<(), String> {
    let name = names[i];
    let name_ok = name.bytes().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c));
    if name.is_empty() || name.len() > 64 || !name_ok {
        return Err("required: at most 64 letters, digits, '-', '_' or '.'".into());
    }
    if names[..i].contains(&name) {
        return Err(format!("{name:?} names two bridges"));
    }
    Ok(())
}

/// The queue limits of an outbox: it holds up to `max_messages` and `max_bytes` for the other
/// side, does what `overflow` says when full, and neither adapts its window nor holds
/// publishers as soon as it falls behind (see [`QueueLimits::adaptive`]).
pub(crate) fn outbox_limits(
    max_messages: usize,
    max_bytes: usize,
    overflow: OverflowPolicy,
) -> Arc<QueueLimits> {
    Arc::new(QueueLimits {
        max_messages,
        max_bytes,
        queue_qos0: false,
        overflow,
        overflow_qos0: OverflowPolicy::DropNewest,
        qos0_pacing: std::time::Duration::ZERO,
        adaptive: false,
    })
}

/// Unsubscribes the in-process client `client` (client id `client_id`) from the filters its
/// session has that are not in `keep` (the configuration changed since it subscribed).
pub(crate) async fn leave_stale(
    broker: &Broker,
    client: &Client,
    client_id: &str,
    keep: &[&str],
) -> Result<(), String> {
    let stale: Vec<String> = broker
        .subscriptions_of(client_id)
        .iter()
        .filter(|f| !keep.contains(&&***f))
        .map(|f| f.to_string())
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    tracing::info!(%client_id, filters = ?stale, "bridge: leaving filters the configuration no longer has");
    client
        .unsubscribe(stale, braid_client::Properties::default())
        .await
        .map(|_| ())
        .map_err(|e| format!("cannot unsubscribe from old filters: {e}"))
}

/// The growing pause between a bridge's attempts: `first`, doubling up to `max`.
#[derive(Debug)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max, next: first }
    }

    /// The pause the next [`Backoff::pause`] takes.
    pub(crate) fn next(&self) -> Duration {
        self.next
    }

    /// The next pause starts at `first` again (the last attempt went well for a while).
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }

    /// Pauses, and doubles the next pause; false if the broker shut down meanwhile.
    pub(crate) async fn pause(&mut self, broker: &Broker) -> bool {
        let paused = tokio::select! {
            _ = tokio::time::sleep(self.next) => true,
            _ = broker.shutdown.cancelled() => false,
        };
        self.next = (self.next * 2).min(self.max);
        paused
    }
}
