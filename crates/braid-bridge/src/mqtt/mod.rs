//! The MQTT bridge (`[[bridges.mqtt]]`): Braid and another MQTT broker (a Mosquitto, another
//! Braid, any MQTT 3.1.1 or 5 server), with Mosquitto's `topic` lines and names.
//!
//! One in-process client, `$internal/bridge/mqtt/<name>`, is the bridge's side in Braid: its
//! persistent session, subscribed to the `out` lines' local topics, is the outbox, and it
//! publishes what comes in. One braid-client connection is its side on the remote, subscribed
//! there to the `in` lines' remote topics and publishing what goes out. A message is
//! acknowledged to the side it came from only once the other side acknowledged it. Both
//! subscriptions are No Local (the remote's when it speaks MQTT 5), so what the bridge
//! publishes on one side never comes back to it from that side: a `both` line does not loop.
//! Over QUIC each `topic` line has a data stream of its own, at the priority `priorities` gives
//! its pattern.
//!
//! The rooms: `topics` (the lines and their topic mapping), `remote` (the connection's
//! options and streams), `session` (the bridge's run: connecting, the two pumps, reconnects).

mod remote;
mod session;
mod topics;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use braid_broker::config::{ConfigError, MqttBridgeConfig};
use braid_broker::session::QueueLimits;
use braid_broker::Broker;
use braid_proto::topic::{intersects, valid_topic_name};

use crate::stats::{Stats, Watch, Watched, BRIDGES};
use topics::Line;

/// Transports a bridge may use towards the remote.
const TRANSPORTS: &[&str] = &["tcp", "tls", "ws", "wss", "quic"];

/// Checks every `[[bridges.mqtt]]`: the error names the key, e.g. `bridges.mqtt[0].topic[1]`.
pub(crate) fn check(bridges: &[MqttBridgeConfig]) -> Result<(), ConfigError> {
    let names: Vec<&str> = bridges.iter().map(|b| b.name.as_str()).collect();
    for (i, b) in bridges.iter().enumerate() {
        let key = |k: &str| format!("bridges.mqtt[{i}].{k}");
        let bad = |k: &str, problem: &dyn std::fmt::Display| Err(ConfigError::invalid(key(k), problem));
        if let Err(problem) = crate::check_name(&names, i) {
            return bad("name", &problem);
        }
        if !TRANSPORTS.contains(&b.transport.as_str()) {
            return bad("transport", &"must be tcp, tls, ws, wss or quic");
        }
        if b.address.is_empty() {
            return bad("address", &"required: the remote broker as host:port");
        }
        if remote::host_port(&b.address, 1883).is_none() {
            return bad("address", &format!("{:?} is not host:port", b.address));
        }
        if remote::version(&b.protocol_version).is_none() {
            return bad("protocol_version", &"must be mqttv5 (or mqttv50), mqttv311 or mqttv31");
        }
        if b.topic.is_empty() {
            return bad("topic", &"a bridge needs at least one topic line");
        }
        let mut lines = Vec::new();
        for (j, text) in b.topic.iter().enumerate() {
            match Line::parse(text) {
                Ok(line) => lines.push(line),
                Err(why) => return bad(&format!("topic[{j}]"), &why),
            }
        }
        if b.ws_path.is_empty() || !b.ws_path.starts_with('/') {
            return bad("ws_path", &"must be an HTTP path starting with '/'");
        }
        if b.keep_alive < 5 {
            return bad("keep_alive", &"must be at least 5 seconds");
        }
        if b.username.is_empty() && !b.password.is_empty() {
            return bad("password", &"a password needs a username");
        }
        if !b.notification_topic.is_empty() && !valid_topic_name(&b.notification_topic) {
            return bad("notification_topic", &"must be a topic name (no wildcards)");
        }
        if b.cert_file.is_empty() != b.key_file.is_empty() {
            return bad("cert_file", &"cert_file and key_file go together: set both or neither");
        }
        if b.transport == "quic" && !b.cert_file.is_empty() {
            return bad("cert_file", &"client certificates are not supported over QUIC");
        }
        for (k, path) in [("ca_file", &b.ca_file), ("cert_file", &b.cert_file), ("key_file", &b.key_file)] {
            if !path.is_empty() {
                if let Err(e) = std::fs::metadata(path) {
                    return bad(k, &format!("{path}: {e}"));
                }
            }
        }
        if b.restart_timeout_secs == 0 {
            return bad("restart_timeout_secs", &"must be at least 1");
        }
        if b.max_queued_messages == 0 || b.max_queued_bytes == 0 {
            return bad(
                "max_queued_messages",
                &"max_queued_messages and max_queued_bytes must be at least 1",
            );
        }
        if !b.priorities.is_empty() && b.transport != "quic" {
            return bad("priorities", &"stream priorities need transport = \"quic\"");
        }
        for pattern in b.priorities.keys() {
            if !lines.iter().any(|l| &l.pattern == pattern) {
                return bad("priorities", &format!("{pattern:?} is not the pattern of a topic line"));
            }
        }
    }
    Ok(())
}

/// A running bridge: its configuration, parsed, and its state.
pub(crate) struct Bridge {
    broker: Arc<Broker>,
    config: MqttBridgeConfig,
    lines: Vec<Line>,
    stats: Arc<Stats>,
    /// The outbox's queue limits.
    limits: Arc<QueueLimits>,
    /// Cancelled when the bridge stops: the broker shuts down, or a reload stops it.
    stop: CancellationToken,
    /// The client id on the remote.
    remote_id: String,
    /// Where the connection's state is published in Braid (`notifications`).
    notification_topic: Option<String>,
    /// The remote is away and that was said (log, notification): once per failing stretch.
    down_said: AtomicBool,
}

/// Starts bridge `config` and its `$SYS` topics, until `stop`.
pub(crate) fn start(broker: &Arc<Broker>, config: MqttBridgeConfig, stop: &CancellationToken) {
    let lines = match config.topic.iter().map(|t| Line::parse(t)).collect::<Result<Vec<_>, _>>() {
        Ok(lines) => lines,
        // Checked when the configuration loaded (`check`).
        Err(e) => return error!(bridge = %config.name, "mqtt bridge: {e}"),
    };
    let cluster = &broker.config().cluster;
    let mut remote_id =
        if config.client_id.is_empty() { format!("braid-{}", config.name) } else { config.client_id.clone() };
    if cluster.enabled {
        remote_id = format!("{remote_id}-{}", cluster.node);
    }
    let notification_topic = config.notifications.then(|| match config.notification_topic.as_str() {
        "" => format!("$SYS/broker/connection/{remote_id}/state"),
        topic => topic.to_string(),
    });
    let limits =
        crate::outbox_limits(config.max_queued_messages, config.max_queued_bytes, config.queue_overflow);
    let stats = Arc::new(Stats::default());
    info!(bridge = %config.name, address = %config.address, transport = %config.transport, remote_client_id = %remote_id, lines = lines.len(), "mqtt bridge starting");
    say_about_loops(&config, &lines);
    let outbox = crate::client_id(broker, &session::local_id(&config.name));
    let name = config.name.clone();
    let watch = Watch { family: &BRIDGES, kind: "mqtt", name, stats: stats.clone(), outbox: Some(outbox) };
    Watched::start(broker, watch, stop.clone());
    let bridge = Bridge {
        broker: broker.clone(),
        stop: stop.clone(),
        config,
        lines,
        stats,
        limits,
        remote_id,
        notification_topic,
        down_said: AtomicBool::new(false),
    };
    tokio::spawn(session::run(Arc::new(bridge)));
}

/// `try_private`: Mosquitto marks a 3.1.1 bridge's CONNECT (protocol level | 0x80) so that the
/// remote neither sends it back its own messages nor clears their RETAIN flag; braid-client's
/// codec cannot write that level, so the key is accepted and not sent. Over 3.1.1, the
/// remote echoes what the bridge publishes on it to the bridge's own matching subscriptions:
/// what goes out on a remote topic that an `in` line subscribes to (a `both` line, or an `out` and
/// an `in` line whose remote topics overlap) comes back once into Braid. Said once, at start.
fn say_about_loops(config: &MqttBridgeConfig, lines: &[Line]) {
    let Some(version) = remote::version(&config.protocol_version) else { return };
    if version.is_v5() {
        return;
    }
    let overlapping = lines.iter().filter(|o| o.outgoing()).any(|o| {
        lines.iter().filter(|i| i.incoming()).any(|i| intersects(&o.remote_filter(), &i.remote_filter()))
    });
    match (overlapping, config.try_private) {
        (true, _) => {
            warn!(bridge = %config.name, "mqtt bridge: over {}, the remote sends the bridge back what it publishes there (no No Local in 3.1.1, and try_private is not supported): messages of lines that go both out and in come back into Braid once; use protocol_version = \"mqttv5\" or keep in and out topics apart", config.protocol_version)
        }
        (false, true) => {
            info!(bridge = %config.name, "mqtt bridge: try_private is not supported (the 3.1.1 CONNECT is a plain client's); in and out topics do not overlap, so nothing comes back")
        }
        (false, false) => {}
    }
}
