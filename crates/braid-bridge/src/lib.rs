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
//! The sinks of rules (`[[sinks]]`) work as a bridge's way out does, each through an outbox of
//! its own, which the broker fills with the outputs of the rules that name the sink.
//!
//! The rooms: `template` (topic and key templates), `stats` (counters and their `$SYS`
//! topics), `kafka` (the Kafka bridge: `out` and `inbound`, behind the cargo feature `kafka`),
//! `mqtt` (the MQTT bridge, `[[bridges.mqtt]]`), `sink` (the sinks: HTTP, PostgreSQL, Redis,
//! InfluxDB).

#[cfg(feature = "kafka")]
mod kafka;
mod mqtt;
mod sink;
mod stats;
pub mod template;

use std::sync::Arc;

use braid_broker::config::{Config, ConfigError, OverflowPolicy};
use braid_broker::connection::in_process;
use braid_broker::session::QueueLimits;
use braid_broker::Broker;
use braid_client::{Backoff, Client, ClientOptions, Connected, InMemory, ProtocolVersion, Transport};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Checks the `[bridges]` settings that the configuration's own validation cannot (templates,
/// names, a bridge kind this build lacks): the error names the key and the problem.
pub fn check(config: &Config) -> Result<(), ConfigError> {
    #[cfg(feature = "kafka")]
    kafka::check(&config.bridges.kafka)?;
    #[cfg(not(feature = "kafka"))]
    if !config.bridges.kafka.is_empty() {
        return Err(ConfigError::invalid("bridges.kafka", NO_KAFKA));
    }
    #[cfg(not(feature = "kafka"))]
    if let Some(at) = config.sinks.iter().position(|s| s.kind == braid_broker::config::SinkKind::Kafka) {
        return Err(ConfigError::invalid(format!("sinks[{at}].type"), NO_KAFKA));
    }
    mqtt::check(&config.bridges.mqtt)
}

/// Why Kafka bridges and sinks are refused by a build without Kafka support.
#[cfg(not(feature = "kafka"))]
const NO_KAFKA: &str = "this braid was built without Kafka support (cargo feature `kafka` of braid-bridge)";

/// Starts the configured bridges and the sinks in force on `broker` (checked by [`check`]);
/// they run until the broker shuts down or [`Bridges::apply`] stops them (sinks: until the rules
/// change them, see `braid_broker::rule_book`). A bridge or sink whose other side is away keeps trying, logs and counts; it never
/// stops the broker. The outboxes of bridges and sinks no longer configured are ended. Each
/// sink's outbox is open when this returns.
pub async fn start(broker: &Arc<Broker>) -> Bridges {
    sink::supervise(broker).await;
    let mut bridges = Bridges { broker: broker.clone(), running: Vec::new() };
    bridges.apply(&broker.config().bridges).await;
    bridges
}

/// The running bridges.
#[derive(Debug)]
pub struct Bridges {
    broker: Arc<Broker>,
    running: Vec<Running>,
}

/// One running bridge.
#[derive(Debug)]
struct Running {
    kind: &'static str,
    name: String,
    /// Its configuration, to tell whether a reload changed it.
    config: serde_json::Value,
    stop: CancellationToken,
}

impl Bridges {
    /// Puts `config` (checked by [`check`]) in force: stops the bridges it no longer has or
    /// has changed, starts the new and changed ones (a changed bridge keeps its outbox, and
    /// with it what it holds), and ends the outboxes of bridges it does not name (what they
    /// held is dropped, and logged). Returns what it did, one `kind/name started|stopped|
    /// restarted` per bridge.
    pub async fn apply(&mut self, config: &braid_broker::config::BridgesConfig) -> Vec<String> {
        let mut wanted: Vec<(&'static str, String, serde_json::Value)> = Vec::new();
        #[cfg(feature = "kafka")]
        wanted.extend(config.kafka.iter().map(|b| ("kafka", b.name.clone(), json(b))));
        wanted.extend(config.mqtt.iter().map(|b| ("mqtt", b.name.clone(), json(b))));
        let mut done = Vec::new();
        let mut changed = Vec::new();
        self.running.retain(|r| {
            let named = |(k, n, _): &&(&str, String, serde_json::Value)| *k == r.kind && *n == r.name;
            match wanted.iter().find(named) {
                Some((.., c)) if *c == r.config => return true,
                Some(_) => changed.push((r.kind, r.name.clone())),
                None => done.push(format!("{}/{} stopped", r.kind, r.name)),
            }
            r.stop.cancel();
            false
        });
        for (kind, name, value) in wanted {
            if self.running.iter().any(|r| r.kind == kind && r.name == name) {
                continue;
            }
            let stop = self.broker.shutdown().child_token();
            let restarted = changed.iter().any(|(k, n)| *k == kind && *n == name);
            match kind {
                #[cfg(feature = "kafka")]
                "kafka" => {
                    let Some(b) = config.kafka.iter().find(|b| b.name == name) else { continue };
                    kafka::start(&self.broker, b.clone(), &stop);
                }
                _ => {
                    let Some(b) = config.mqtt.iter().find(|b| b.name == name) else { continue };
                    mqtt::start(&self.broker, b.clone(), &stop);
                }
            }
            done.push(format!("{kind}/{name} {}", if restarted { "restarted" } else { "started" }));
            self.running.push(Running { kind, name, config: value, stop });
        }
        self.end_orphans().await;
        done
    }

    /// Ends the sessions of bridges' and sinks' in-process clients that no running bridge and
    /// no configured sink owns.
    async fn end_orphans(&self) {
        let sinks: Vec<Box<str>> =
            self.broker.rules().outboxes().iter().map(|o| o.client_id.clone()).collect();
        for client_id in self.broker.client_ids() {
            if client_id.starts_with(SINK_PREFIX) {
                if !sinks.iter().any(|o| **o == *client_id) {
                    self.end_orphan(&client_id, "sink").await;
                }
                continue;
            }
            let Some(rest) = client_id.strip_prefix(PREFIX) else { continue };
            let rest = rest.split('@').next().unwrap_or(rest);
            let mut parts = rest.splitn(3, '/');
            let (Some(kind), Some(name)) = (parts.next(), parts.next()) else { continue };
            if self.running.iter().any(|r| r.kind == kind && r.name == name) {
                continue;
            }
            self.end_orphan(&client_id, &format!("bridge {kind}/{name}")).await;
        }
    }

    /// Ends the session `client_id` of `what`, no longer configured, with what it held.
    async fn end_orphan(&self, client_id: &str, what: &str) {
        let held = self.broker.held_for(client_id).unwrap_or(0);
        match end_session(&self.broker, client_id).await {
            Ok(()) => {
                warn!(%client_id, held, "{what} is no longer configured: its session in Braid is ended, with what it held")
            }
            Err(e) => {
                warn!(%client_id, "{what} is no longer configured, and its session in Braid could not be ended: {e}")
            }
        }
    }
}

fn json(config: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(config).unwrap_or(serde_json::Value::Null)
}

/// The prefix of the bridges' in-process client ids.
const PREFIX: &str = "$internal/bridge/";
/// The prefix of the sinks' outboxes' client ids (see [`braid_broker::rules::SinkOutbox`]).
const SINK_PREFIX: &str = "$internal/sink/";

/// Ends the persistent session of in-process client `client_id`: a clean start, then a
/// DISCONNECT with Session Expiry 0.
pub(crate) async fn end_session(broker: &Arc<Broker>, client_id: &str) -> Result<(), braid_client::Error> {
    let mut opts = in_process_options(broker, client_id, outbox_limits(1, 1, OverflowPolicy::DropNewest));
    opts.clean_start = true;
    opts.session_expiry = Some(0);
    let (client, _) = Client::connect(opts).await?;
    client.disconnect(braid_client::ReasonCode::Success).await
}

/// The options of an MQTT 5 in-process client `client_id` of `broker`, its session's queue
/// under `limits`.
fn in_process_options(broker: &Arc<Broker>, client_id: &str, limits: Arc<QueueLimits>) -> ClientOptions {
    let (name, opener) = (client_id.to_string(), broker.clone());
    let mut opts = ClientOptions::new("in-process", 0);
    opts.transport =
        Transport::InMemory(InMemory::new(move || Ok(in_process::connect(&opener, &name, limits.clone()))));
    opts.version = ProtocolVersion::V5;
    opts.client_id = client_id.to_string();
    opts
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
    connect_as(broker, &client_id(broker, id), limits, window).await
}

/// Connects an in-process client with client id `client_id` as [`connect`] does.
pub(crate) async fn connect_as(
    broker: &Arc<Broker>,
    client_id: &str,
    limits: Arc<QueueLimits>,
    window: u16,
) -> Result<(Client, Connected), braid_client::Error> {
    let mut opts = in_process_options(broker, client_id, limits);
    opts.clean_start = false;
    opts.session_expiry = Some(u32::MAX);
    opts.receive_maximum = window;
    opts.max_inflight = window;
    Client::connect(opts).await
}

/// The client id of the in-process client `id` of a bridge: `$internal/bridge/<id>`, with
/// `@<node>` in a cluster.
pub(crate) fn client_id(broker: &Broker, id: &str) -> String {
    let cluster = &broker.config().cluster;
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

/// Takes `backoff`'s next pause between a bridge's attempts; false if the bridge was stopped
/// meanwhile.
pub(crate) async fn pause(backoff: &mut Backoff, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(backoff.pause()) => true,
        _ = stop.cancelled() => false,
    }
}
