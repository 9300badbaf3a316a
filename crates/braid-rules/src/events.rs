//! The sources a rule can read: published messages and the `$events/...` client events, with
//! the fields each one has (EMQX 5's names).

/// Fields of every source.
const COMMON: &[&str] = &["event", "clientid", "username", "peerhost", "timestamp", "node"];
/// Fields of a source that carries a message.
const MESSAGE: &[&str] = &["id", "topic", "payload", "qos", "retain", "flags", "pub_props"];
/// Fields of a subscription event.
const SUBSCRIPTION: &[&str] = &["topic", "qos"];

/// What a rule is evaluated on: a message published to a topic, or a client event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Event {
    /// A PUBLISH received from a client (a rule's topic filters in FROM).
    #[default]
    MessagePublish,
    /// `$events/client_connected`: a client finished connecting.
    ClientConnected,
    /// `$events/client_disconnected`: a client's connection ended.
    ClientDisconnected,
    /// `$events/session_subscribed`: a client subscribed to a topic filter.
    SessionSubscribed,
    /// `$events/session_unsubscribed`: a client unsubscribed from a topic filter.
    SessionUnsubscribed,
    /// `$events/message_delivered`: a message was sent to a subscriber.
    MessageDelivered,
    /// `$events/message_acked`: a subscriber acknowledged a QoS 1 or 2 message.
    MessageAcked,
    /// `$events/message_dropped`: a published message reached no subscriber, or was dropped.
    MessageDropped,
}

impl Event {
    /// Every client event (all but [`Event::MessagePublish`]).
    pub const CLIENT_EVENTS: [Event; 7] = [
        Event::ClientConnected,
        Event::ClientDisconnected,
        Event::SessionSubscribed,
        Event::SessionUnsubscribed,
        Event::MessageDelivered,
        Event::MessageAcked,
        Event::MessageDropped,
    ];

    /// The value of the `event` field, as in EMQX: `message.publish`, `client.connected`, ...
    pub fn name(self) -> &'static str {
        match self {
            Event::MessagePublish => "message.publish",
            Event::ClientConnected => "client.connected",
            Event::ClientDisconnected => "client.disconnected",
            Event::SessionSubscribed => "session.subscribed",
            Event::SessionUnsubscribed => "session.unsubscribed",
            Event::MessageDelivered => "message.delivered",
            Event::MessageAcked => "message.acked",
            Event::MessageDropped => "message.dropped",
        }
    }

    /// The name a rule uses in FROM (`$events/client_connected`); `None` for a publish, which
    /// is selected by topic filters.
    pub fn topic(self) -> Option<&'static str> {
        Some(match self {
            Event::MessagePublish => return None,
            Event::ClientConnected => "$events/client_connected",
            Event::ClientDisconnected => "$events/client_disconnected",
            Event::SessionSubscribed => "$events/session_subscribed",
            Event::SessionUnsubscribed => "$events/session_unsubscribed",
            Event::MessageDelivered => "$events/message_delivered",
            Event::MessageAcked => "$events/message_acked",
            Event::MessageDropped => "$events/message_dropped",
        })
    }

    /// The client event named `topic` in FROM, such as `$events/client_connected`.
    pub fn from_topic(topic: &str) -> Option<Event> {
        Event::CLIENT_EVENTS.into_iter().find(|e| e.topic() == Some(topic))
    }

    /// True when the source carries a message: `payload`, `topic`, `qos`, `id`, ... are set.
    pub(crate) fn carries_message(self) -> bool {
        matches!(
            self,
            Event::MessagePublish | Event::MessageDelivered | Event::MessageAcked | Event::MessageDropped
        )
    }

    /// True when the source has `topic` and `qos` (a message or a subscription).
    pub(crate) fn has_topic(self) -> bool {
        self.carries_message() || matches!(self, Event::SessionSubscribed | Event::SessionUnsubscribed)
    }

    /// Fields of this source only, which a caller passes in [`Context::fields`](crate::Context).
    fn own_fields(self) -> &'static [&'static str] {
        match self {
            Event::MessagePublish => &["publish_received_at"],
            Event::ClientConnected => &[
                "mountpoint",
                "peername",
                "sockname",
                "proto_name",
                "proto_ver",
                "keepalive",
                "clean_start",
                "expiry_interval",
                "is_bridge",
                "connected_at",
                "conn_props",
                "client_attrs",
            ],
            Event::ClientDisconnected => &[
                "reason",
                "peername",
                "sockname",
                "proto_name",
                "proto_ver",
                "disconnected_at",
                "disconn_props",
                "client_attrs",
            ],
            Event::SessionSubscribed => &["sub_props"],
            Event::SessionUnsubscribed => &["unsub_props"],
            Event::MessageDelivered => &["from_clientid", "from_username", "publish_received_at"],
            Event::MessageAcked => &["from_clientid", "from_username", "puback_props", "publish_received_at"],
            Event::MessageDropped => &["reason", "publish_received_at"],
        }
    }

    /// The names of all fields of this source, in the order `SELECT *` writes them.
    pub fn fields(self) -> impl Iterator<Item = &'static str> {
        let topic: &[&str] = match self {
            e if e.carries_message() => MESSAGE,
            e if e.has_topic() => SUBSCRIPTION,
            _ => &[],
        };
        COMMON.iter().chain(topic).chain(self.own_fields()).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_topics_round_trip() {
        for event in Event::CLIENT_EVENTS {
            assert_eq!(Event::from_topic(event.topic().unwrap()), Some(event));
        }
        assert_eq!(Event::from_topic("$events/client_conected"), None);
        assert_eq!(Event::MessageAcked.name(), "message.acked");
    }

    #[test]
    fn fields_follow_the_source() {
        let connected: Vec<_> = Event::ClientConnected.fields().collect();
        assert!(connected.contains(&"keepalive") && connected.contains(&"clientid"));
        assert!(!connected.contains(&"payload") && !connected.contains(&"topic"));
        let subscribed: Vec<_> = Event::SessionSubscribed.fields().collect();
        assert!(subscribed.contains(&"topic") && subscribed.contains(&"sub_props"));
        assert!(!subscribed.contains(&"payload"));
        let delivered: Vec<_> = Event::MessageDelivered.fields().collect();
        assert!(delivered.contains(&"payload") && delivered.contains(&"from_clientid"));
    }
}
