//! What the application sends ([`Message`]) and receives ([`Event`], [`Connected`]).

use braid_proto::{Bytes, Properties, Publish, QoS, ReasonCode};

/// A message to publish.
#[derive(Clone, Debug, Default)]
pub struct Message {
    /// Topic name (no wildcards).
    pub topic: String,
    /// Payload.
    pub payload: Bytes,
    /// QoS.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// v5 PUBLISH properties (user properties, Message Expiry, Content Type, Response Topic,
    /// ...); ignored by 3.1.x.
    pub properties: Properties,
}

impl Message {
    /// A message with no retain flag and no properties.
    pub fn new(topic: impl Into<String>, payload: impl Into<Bytes>, qos: QoS) -> Self {
        Message { topic: topic.into(), payload: payload.into(), qos, ..Default::default() }
    }

    /// The same message with the RETAIN flag set to `retain`.
    pub fn retain(mut self, retain: bool) -> Self {
        self.retain = retain;
        self
    }
}

/// CONNACK as seen by the application.
#[derive(Clone, Debug)]
pub struct Connected {
    /// The server resumed an existing session.
    pub session_present: bool,
    /// The client identifier in use: the server's v5 Assigned Client Identifier if it sent
    /// one, otherwise the one from [`crate::ClientOptions::client_id`].
    pub client_id: String,
    /// v5 CONNACK properties (Receive Maximum, Topic Alias Maximum, Server Keep Alive, ...).
    pub properties: Properties,
}

/// What [`crate::Client::recv`] yields.
#[derive(Debug)]
pub enum Event {
    /// A message delivered by the server, topic alias already resolved (a Topic Alias property
    /// is left in `properties` as received). For QoS 1/2 the client acknowledges it when it is
    /// handed out here, so the Receive Maximum is real consumer backpressure, like a prefetch
    /// count. A QoS 2 message is handed out once even if the server resends it.
    Message(Publish),
    /// Reconnected (not sent for the first connection, which [`crate::Client::connect`]
    /// reports); unacknowledged publishes have been resent with DUP.
    ///
    /// `Connected` and `Disconnected` are dropped if the event queue is full, so that an
    /// application that never calls `recv` (a pure publisher) does not hold up reconnects.
    Connected(Connected),
    /// The connection ended: the reason of the server's DISCONNECT if it sent one, `None` for
    /// a network error, a keep-alive timeout or a protocol error. With
    /// [`crate::ClientOptions::reconnect`] set, a [`Event::Connected`] follows when it is
    /// back; otherwise [`crate::Client::recv`] returns `None` next.
    Disconnected(Option<ReasonCode>),
}
