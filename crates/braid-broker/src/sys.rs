//! `$SYS/broker/...` topics, published (retained) every `sys.interval_secs`. Names follow
//! Mosquitto's where one exists.

use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_proto::{ByteString, Bytes};

use crate::broker::Broker;
use crate::limits::resident_memory;
use crate::message::Message;
use crate::metrics::Metrics;

/// Publishes `$SYS` topics until shutdown; returns at once if the interval is 0.
pub(crate) async fn run(broker: Arc<Broker>) {
    let secs = broker.config().sys.interval_secs;
    if secs == 0 {
        return;
    }
    publish(&broker, "$SYS/broker/version", format!("braid version {}", env!("CARGO_PKG_VERSION")));
    let mut tick = tokio::time::interval(Duration::from_secs(secs));
    loop {
        tokio::select! {
            _ = tick.tick() => publish_all(&broker),
            _ = broker.shutdown().cancelled() => return,
        }
    }
}

fn publish(broker: &Broker, topic: &'static str, value: String) {
    let msg = Message::internal(ByteString::from_static(topic), Bytes::from(value), true);
    let _ = broker.publish(msg, Instant::now());
}

fn publish_all(broker: &Broker) {
    broker.purge_expired_retained(Instant::now());
    let m = &broker.metrics();
    let (sessions, subscriptions, retained) = broker.counts();
    let connected = Metrics::get(&m.clients_connected);
    let values = [
        ("$SYS/broker/uptime", format!("{} seconds", broker.started().elapsed().as_secs())),
        ("$SYS/broker/clients/connected", connected.to_string()),
        ("$SYS/broker/clients/disconnected", sessions.saturating_sub(connected as usize).to_string()),
        ("$SYS/broker/clients/total", sessions.max(connected as usize).to_string()),
        ("$SYS/broker/clients/maximum", Metrics::get(&m.clients_maximum).to_string()),
        ("$SYS/broker/clients/parked", broker.parked().to_string()),
        ("$SYS/broker/messages/received", m.messages_received.total().to_string()),
        ("$SYS/broker/messages/sent", m.messages_sent.total().to_string()),
        ("$SYS/broker/publish/messages/dropped", m.messages_dropped().to_string()),
        ("$SYS/broker/publish/messages/held", Metrics::get(&m.publishes_held).to_string()),
        ("$SYS/broker/publish/messages/denied", Metrics::get(&m.publishes_denied).to_string()),
        (
            "$SYS/broker/connections/refused",
            (Metrics::get(&m.connections_refused) + Metrics::get(&m.connections_refused_fd)).to_string(),
        ),
        ("$SYS/broker/memory/alarm", u8::from(broker.memory().is_raised()).to_string()),
        ("$SYS/broker/bytes/received", Metrics::get(&m.bytes_received).to_string()),
        ("$SYS/broker/bytes/sent", Metrics::get(&m.bytes_sent).to_string()),
        ("$SYS/broker/subscriptions/count", subscriptions.to_string()),
        ("$SYS/broker/retained messages/count", retained.to_string()),
    ];
    for (topic, value) in values {
        publish(broker, topic, value);
    }
    // Not published where it cannot be read (outside Linux).
    if let Some(rss) = resident_memory() {
        publish(broker, "$SYS/broker/memory/rss", rss.to_string());
    }
}
