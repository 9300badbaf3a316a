//! `[mqtt]`, `[session]`, `[shared]` and `[sys]`: the protocol's limits and features, sessions and their queues.

use serde::{Deserialize, Serialize};

use super::error::bad;
use super::ConfigError;

use crate::transport_kind::{PerTransport, Transport};

/// Protocol limits and features.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttConfig {
    /// Largest packet accepted from a client, fixed header included.
    pub max_packet_size: u32,
    /// Largest keep alive granted; v5 clients asking for more (or 0) get Server Keep Alive.
    pub max_keep_alive: u16,
    /// Seconds a new socket has to send CONNECT.
    pub connect_timeout_secs: u64,
    /// Inbound QoS 2 publishes a client may have awaiting PUBREL (v5 Receive Maximum).
    pub receive_maximum: u16,
    /// Outbound unacknowledged QoS 1/2 deliveries per client (capped by the client's Receive Maximum).
    pub max_inflight: u16,
    /// Topic aliases a v5 client may use towards the broker.
    pub topic_alias_maximum: u16,
    /// Assign topic aliases to v5 subscribers that allow them.
    pub server_topic_aliases: bool,
    /// Whether retained messages are supported.
    pub retain_available: bool,
    /// Highest QoS accepted from publishers (0, 1 or 2).
    pub max_qos: u8,
    /// Accept an empty client id (the broker assigns one) when the session is clean.
    pub allow_empty_client_id: bool,
    /// What a v5 client with several subscriptions matching one message receives.
    pub overlapping: Overlapping,
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            max_packet_size: 268_435_455,
            max_keep_alive: 65_535,
            connect_timeout_secs: 10,
            receive_maximum: 1024,
            max_inflight: 1024,
            topic_alias_maximum: 64,
            server_topic_aliases: true,
            retain_available: true,
            max_qos: 2,
            allow_empty_client_id: true,
            overlapping: Overlapping::Single,
        }
    }
}

/// Deliveries to a v5 client with several subscriptions matching one message (MQTT 5 section
/// 3.3.4; 3.1.x clients always get one copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlapping {
    /// One copy at the highest granted QoS, with every matching Subscription Identifier.
    Single,
    /// One copy per matching subscription, each with its own Subscription Identifier.
    PerSubscription,
}

/// What to do with a delivery for a session whose queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverflowPolicy {
    /// Queue it anyway and stop reading from the publisher, holding its PUBACK/PUBREC, until
    /// the queue drains (QoS 1/2 to a connected client only; otherwise like `DropNewest`).
    Backpressure,
    /// Keep the queue, drop the message that does not fit.
    DropNewest,
    /// Drop the oldest queued message to make room.
    DropOldest,
}

/// Queue policies for the sessions of clients that connect through one listener; unset keys
/// keep `[session]`'s.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueuePolicy {
    /// Overrides `session.queue_overflow`.
    pub queue_overflow: Option<OverflowPolicy>,
    /// Overrides `session.queue_overflow_qos0`.
    pub queue_overflow_qos0: Option<OverflowPolicy>,
    /// Overrides `session.qos0_pacing_ms`.
    pub qos0_pacing_ms: Option<u64>,
}

/// Per-listener queue policies (`[session.listeners.<transport>]`).
pub type ListenerPolicies = PerTransport<QueuePolicy>;

/// Session and queue settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Messages queued per session beyond the in-flight window (offline or slow clients).
    pub max_queued_messages: usize,
    /// Bytes (topic plus payload) queued per session.
    pub max_queued_bytes: usize,
    /// Also queue QoS 0 messages for offline sessions.
    pub queue_qos0: bool,
    /// What to do with a QoS 1/2 delivery when the queue is full; drops are counted.
    pub queue_overflow: OverflowPolicy,
    /// What to do with a QoS 0 delivery when the queue is full; drops are counted.
    pub queue_overflow_qos0: OverflowPolicy,
    /// Seconds a publisher may be held by a connected subscriber's full queue before that
    /// subscriber is disconnected (0x97) so the others can go on; 0 never disconnects.
    pub slow_consumer_timeout_secs: u64,
    /// Milliseconds a connected subscriber that falls behind may pace QoS 0 publishers
    /// (nothing more is read from them until it catches up), counted from when its backlog
    /// began; after that its QoS 0 deliveries queue and drop by `queue_overflow_qos0` until
    /// its queue empties. 0 never paces.
    pub qos0_pacing_ms: u64,
    /// Overrides of the three settings above for clients of one listener: a session follows
    /// the listener its client last connected through.
    pub listeners: ListenerPolicies,
    /// Upper bound on the Session Expiry Interval a client may ask for (seconds).
    pub max_session_expiry_secs: u32,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            max_queued_messages: 1000,
            max_queued_bytes: 16 * 1024 * 1024,
            queue_qos0: false,
            queue_overflow: OverflowPolicy::Backpressure,
            queue_overflow_qos0: OverflowPolicy::DropNewest,
            slow_consumer_timeout_secs: 60,
            qos0_pacing_ms: 1000,
            listeners: ListenerPolicies::default(),
            max_session_expiry_secs: u32::MAX,
        }
    }
}

/// How a shared subscription group picks the member for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SharedStrategy {
    /// Members in turn.
    #[default]
    RoundRobin,
    /// A random member.
    Random,
    /// The member picked by a hash of the publisher's client id.
    HashClientid,
    /// The member picked by a hash of the topic.
    HashTopic,
    /// The same member until it goes away.
    Sticky,
}

/// Shared subscriptions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharedConfig {
    /// Member selection strategy for every group.
    pub strategy: SharedStrategy,
}

/// `$SYS` topics.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SysConfig {
    /// Seconds between `$SYS` updates; 0 turns them off.
    pub interval_secs: u64,
    /// Announce clients as they connect and disconnect on
    /// `$SYS/brokers/{node}/clients/{clientid}/connected|disconnected` (EMQX's topics and
    /// fields).
    pub presence: bool,
}

/// Limits on retained messages (EMQX's retainer limits).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetainedConfig {
    /// Most retained messages kept (0: no limit): a retained PUBLISH for a topic that has none
    /// yet is refused once this many are kept.
    pub max_messages: usize,
    /// Largest payload a retained message may have, in bytes (0: no limit).
    pub max_payload_bytes: usize,
    /// Longest a retained message is kept, in seconds, whatever its Message Expiry Interval
    /// says (0: no cap).
    pub max_expiry_secs: u64,
    /// How long a retained message without a Message Expiry Interval is kept, in seconds (0:
    /// until it is replaced or cleared).
    pub default_expiry_secs: u64,
}

impl Default for SysConfig {
    fn default() -> Self {
        SysConfig { interval_secs: 10, presence: false }
    }
}

impl MqttConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_qos > 2 {
            return bad("mqtt.max_qos", "must be 0, 1 or 2");
        }
        if self.receive_maximum == 0 {
            return bad("mqtt.receive_maximum", "must be at least 1");
        }
        if self.max_inflight == 0 {
            return bad("mqtt.max_inflight", "must be at least 1");
        }
        if !(16..=268_435_455).contains(&self.max_packet_size) {
            return bad("mqtt.max_packet_size", "must be between 16 and 268435455");
        }
        if self.connect_timeout_secs == 0 {
            return bad("mqtt.connect_timeout_secs", "must be at least 1");
        }
        if self.max_keep_alive == 0 {
            return bad("mqtt.max_keep_alive", "must be at least 1");
        }
        Ok(())
    }
}

impl SessionConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let qos0_policies =
            std::iter::once(("session.queue_overflow_qos0".to_string(), Some(self.queue_overflow_qos0)))
                .chain(Transport::ALL.map(|t| {
                    (
                        format!("session.listeners.{}.queue_overflow_qos0", t.name()),
                        self.listeners.get(t).queue_overflow_qos0,
                    )
                }));
        for (key, policy) in qos0_policies {
            if policy == Some(OverflowPolicy::Backpressure) {
                return bad(&key, "must be drop_newest or drop_oldest (backpressure is for QoS 1/2)");
            }
        }
        if self.max_queued_messages == 0 {
            return bad("session.max_queued_messages", "must be at least 1");
        }
        if self.max_queued_bytes == 0 {
            return bad("session.max_queued_bytes", "must be at least 1");
        }
        Ok(())
    }
}
