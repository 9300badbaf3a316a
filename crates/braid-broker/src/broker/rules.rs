//! The broker's side of rules (see [`crate::rules`]): they run on a client's PUBLISH once it
//! is routed, and on the client events (connected, disconnected, subscribed, unsubscribed)
//! when a rule takes them, with no lock held; what they republish is routed as the broker
//! routes its own messages (`$SYS`, wills): no ACL, and no rule runs on it again. An output
//! for a sink goes, as a QoS 1 message, straight into the queue of the sink's outbox session
//! (never through the router: no client can subscribe to it, and in a cluster no other node
//! gets it), kept in the store as any persistent session's queue.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::Guard;
use tokio::sync::watch;

use braid_proto::{ByteString, Bytes, Connect, ProtocolVersion, Publish, QoS, ReasonCode};
use braid_rules::{Context, Event};
use serde_json::Value;

use super::Ending;
use super::{presence_events, Broker, Published};
use crate::config::{RuleConfig, SinkConfig};
use crate::message::{Delivery, Message};
use crate::rules::{Actions, Publisher, Rules, SinkOutbox};
use crate::session::{Enqueued, Origin, Session, SessionState};
use crate::transport_kind::Transport;

impl Broker {
    /// The rules in force, with their counters.
    pub fn rules(&self) -> Guard<Arc<Rules>> {
        self.rules.load()
    }

    /// The sinks in force, and their changes.
    pub fn sinks(&self) -> watch::Receiver<Arc<[SinkConfig]>> {
        self.sinks.subscribe()
    }

    /// Puts `rules` sending to `sinks` in force (checked together by the caller, as
    /// `config::check_rules` does): a rule or sink whose configuration is the same keeps its
    /// counters; the sinks' workers follow ([`Broker::sinks`]).
    pub fn install_rules(&self, rules: &[RuleConfig], sinks: &[SinkConfig]) {
        let compiled = self.rules.load().recompile(rules, sinks);
        self.rule_events.store(compiled.events() | presence_events(&self.config), Ordering::Relaxed);
        self.rules.store(Arc::new(compiled));
        self.sinks.send_replace(Arc::from(sinks));
    }

    /// True when a rule (or presence) takes `event` ([`Event::MessagePublish`]: some rule has topic filters):
    /// one relaxed load, so that paths that run for every message or acknowledgement pay
    /// nothing more when no rule takes them.
    pub fn rules_take(&self, event: Event) -> bool {
        self.rule_events.load(Ordering::Relaxed) & 1 << event as u8 != 0
    }

    /// Runs the rules on `msg`, which a client published at `now`; returns what the client's
    /// acknowledgement waits for (what they republished, and the outputs put in sinks'
    /// outboxes, stored) and the connections to wake.
    pub(crate) fn apply_rules(&self, msg: &Message, publisher: Publisher<'_>, now: Instant) -> Published {
        let mut effects = Effects::new(self, msg.origin_client.clone(), now);
        self.rules.load().apply(msg, publisher, self.clock.unix_ms(now) as i64, &mut effects);
        effects.out
    }
}

/// What the actions of rules make, at `now`, on behalf of client `origin_client`.
struct Effects<'b> {
    broker: &'b Broker,
    origin_client: ByteString,
    now: Instant,
    out: Published,
}

impl<'b> Effects<'b> {
    fn new(broker: &'b Broker, origin_client: ByteString, now: Instant) -> Effects<'b> {
        Effects { broker, origin_client, now, out: Published::default() }
    }
}

impl Actions for Effects<'_> {
    fn republish(&mut self, publish: Publish) {
        let msg = Message::from_publish(publish, self.now, 0, self.origin_client.clone());
        self.out.merge(self.broker.publish(msg, self.now));
    }

    fn to_sink(&mut self, outbox: &SinkOutbox, output: Bytes) -> Result<(), String> {
        let Some(session) = self.broker.session_of(&outbox.client_id) else {
            return Err("its outbox is not open yet".into());
        };
        let mut properties = braid_proto::Properties::default();
        let waiter = outbox.waiting().map(|waiting| {
            let (n, confirm) = waiting.wait();
            properties.user_properties.push((SinkOutbox::WAITER.into(), n.to_string().into()));
            self.out.confirms.push(confirm);
            (waiting, n)
        });
        let publish = Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: format!("$sink/{}", outbox.sink).into(),
            packet_id: 0,
            properties,
            payload: output,
        };
        let msg = Message::from_publish(publish, self.now, 0, self.origin_client.clone());
        let d = Delivery::of(msg, QoS::AtLeastOnce);
        match self.broker.deliver_holding(&session, d, &mut self.out, self.now) {
            Enqueued::DroppedFull => {
                if let Some((waiting, n)) = waiter {
                    waiting.confirm(n, ReasonCode::QuotaExceeded);
                }
                Err("its outbox is full (queue_overflow = \"drop_newest\")".into())
            }
            Enqueued::QueuedDroppedOldest(_) => {
                outbox.count_dropped();
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// Who a client event is about: what its connection told the broker.
#[derive(Debug, Clone)]
pub(super) struct Who {
    pub(super) username: Option<Box<str>>,
    pub(super) peer: SocketAddr,
    pub(super) version: ProtocolVersion,
    /// The listener it came through (None: in-process).
    pub(super) transport: Option<Transport>,
}

impl Who {
    /// A client that came from `origin` speaking `version`.
    pub(super) fn new(origin: &Origin, version: ProtocolVersion) -> Who {
        Who { username: origin.username.clone(), peer: origin.peer, version, transport: origin.transport }
    }

    /// The attached connection of `st`, if any.
    pub(super) fn of(st: &SessionState) -> Option<Who> {
        st.link.as_ref().map(|l| Who::new(&l.origin, l.version))
    }

    fn proto(&self) -> [(&'static str, Value); 3] {
        [
            ("peername", Value::from(self.peer.to_string())),
            ("proto_name", Value::from(self.proto_name())),
            ("proto_ver", Value::from(self.version as u8)),
        ]
    }

    /// The protocol's name, as its CONNECT gave it.
    pub(super) fn proto_name(&self) -> &'static str {
        if self.version == ProtocolVersion::V3_1 {
            "MQIsdp"
        } else {
            "MQTT"
        }
    }
}

impl Broker {
    /// `$events/client_connected` for `client_id`, who connected at `now` as `who` with
    /// `connect`'s settings (keep alive and session expiry as granted).
    pub(super) fn raise_connected(
        &self,
        client_id: &str,
        who: &Who,
        connect: &Connect,
        (keep_alive, expiry): (u16, u32),
        now: Instant,
    ) {
        let at = self.clock.unix_ms(now) as i64;
        let session = [
            ("keepalive", Value::from(keep_alive)),
            ("clean_start", Value::from(connect.clean_start)),
            ("expiry_interval", Value::from(expiry)),
        ];
        if self.config.sys.presence {
            let mut fields = session.to_vec();
            fields.extend([("connack", Value::from(0)), ("connected_at", Value::from(at))]);
            self.announce_presence(client_id, who, "connected", &fields, now);
        }
        let mut fields: Vec<(&str, Value)> = who.proto().into();
        fields.extend(session);
        fields.extend([("is_bridge", Value::from(false)), ("connected_at", Value::from(at))]);
        self.raise(Event::ClientConnected, client_id, who, ("", 0), &fields, now);
    }

    /// `$events/client_disconnected` for `client_id`, whose connection (`who`) ended at `now`
    /// for `reason` (EMQX's words: `normal`, `takenover`, `kicked`, `keepalive_timeout`, ...).
    pub(super) fn raise_disconnected(&self, client_id: &str, who: &Who, reason: &str, now: Instant) {
        let at = self.clock.unix_ms(now) as i64;
        let ending = [("reason", Value::from(reason)), ("disconnected_at", Value::from(at))];
        if self.config.sys.presence {
            self.announce_presence(client_id, who, "disconnected", &ending, now);
        }
        let mut fields: Vec<(&str, Value)> = who.proto().into();
        fields.extend(ending);
        self.raise(Event::ClientDisconnected, client_id, who, ("", 0), &fields, now);
    }

    /// `$events/session_subscribed` or `session_unsubscribed` for each of `filters` (with the
    /// QoS granted) of `session`, at `now`.
    pub(super) fn raise_subscriptions(
        &self,
        event: Event,
        session: &Session,
        filters: &[(ByteString, u8)],
        now: Instant,
    ) {
        let Some(who) = Who::of(&session.lock()) else { return };
        for (filter, qos) in filters {
            self.raise(event, &session.client_id, &who, (filter, *qos), &[], now);
        }
    }

    /// Runs the rules that take `event` and routes what they republish (its subscribers are
    /// woken as each routing's result drops: no lock is held here).
    fn raise(
        &self,
        event: Event,
        client_id: &str,
        who: &Who,
        (topic, qos): (&str, u8),
        fields: &[(&str, Value)],
        now: Instant,
    ) {
        let peerhost = who.peer.ip().to_string();
        let ctx = Context {
            event,
            clientid: client_id,
            username: who.username.as_deref(),
            peerhost: Some(&peerhost),
            topic,
            qos,
            timestamp: self.clock.unix_ms(now) as i64,
            fields,
            ..Context::default()
        };
        let mut effects = Effects::new(self, ByteString::from(client_id), now);
        self.rules.load().on_event(&ctx, &mut effects);
    }
}

/// Which message events the rules take for a message.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MessageEvents {
    /// `$events/message_delivered`.
    pub(super) delivered: bool,
    /// `$events/message_dropped`.
    pub(super) dropped: bool,
}

impl MessageEvents {
    pub(super) fn any(self) -> bool {
        self.delivered || self.dropped
    }
}

impl Broker {
    /// Which message events the rules take for `msg`: none for a message the broker made
    /// (`$SYS`, what rules republish: no event loops).
    pub(super) fn message_events_wanted(&self, msg: &Message) -> MessageEvents {
        if msg.origin == 0 {
            return MessageEvents::default();
        }
        MessageEvents {
            delivered: self.rules_take(Event::MessageDelivered),
            dropped: self.rules_take(Event::MessageDropped),
        }
    }

    /// `$events/message_delivered` for each session `msg` was handed to (at the QoS given),
    /// and `$events/message_dropped` (`no_subscribers`) when `nobody` took it; at `now`, with
    /// no lock held.
    pub(super) fn raise_message_events(
        &self,
        msg: &Message,
        delivered: &[(Arc<Session>, QoS)],
        nobody: bool,
        now: Instant,
    ) {
        for (session, qos) in delivered {
            let who = Who::of(&session.lock());
            self.raise_message(Event::MessageDelivered, msg, *qos, (&session.client_id, who.as_ref()), now);
        }
        if nobody {
            let who = self.session_of(&msg.origin_client).and_then(|s| Who::of(&s.lock()));
            self.raise_message(Event::MessageDropped, msg, msg.qos, (&msg.origin_client, who.as_ref()), now);
        }
    }

    /// `$events/message_acked` for `msg`, which the client of `session` acknowledged at `now`
    /// (PUBACK, or PUBCOMP for QoS 2), delivered at `qos`; none for a message the broker made.
    pub(crate) fn raise_acked(&self, session: &Session, msg: &Message, qos: QoS, now: Instant) {
        if msg.origin != 0 {
            let who = Who::of(&session.lock());
            self.raise_message(Event::MessageAcked, msg, qos, (&session.client_id, who.as_ref()), now);
        }
    }

    /// Runs the rules that take the message event `event` about `msg` at `qos`, for `client`
    /// (the receiver; for a drop, the publisher).
    fn raise_message(
        &self,
        event: Event,
        msg: &Message,
        qos: QoS,
        client: (&str, Option<&Who>),
        now: Instant,
    ) {
        let (client_id, who) = client;
        let peerhost = who.map(|w| w.peer.ip().to_string());
        let fields = match event {
            Event::MessageDropped => [("reason", Value::from("no_subscribers"))],
            _ => [("from_clientid", Value::from(&*msg.origin_client))],
        };
        let ctx = Context {
            event,
            clientid: client_id,
            username: who.and_then(|w| w.username.as_deref()),
            peerhost: peerhost.as_deref(),
            topic: &msg.topic,
            payload: &msg.payload,
            qos: qos as u8,
            retain: msg.retain,
            timestamp: self.clock.unix_ms(now) as i64,
            user_properties: &msg.properties.user_properties,
            fields: &fields,
            ..Context::default()
        };
        let mut effects = Effects::new(self, ByteString::from(client_id), now);
        self.rules.load().on_event(&ctx, &mut effects);
    }
}

/// Why a connection ended, in EMQX's words for `client_disconnected`'s `reason`: how it
/// `ending`ed, and the reason the broker closed it with, if it did.
pub(super) fn disconnect_reason(ending: Ending, closed_with: Option<ReasonCode>) -> &'static str {
    match (ending, closed_with) {
        (Ending::Normal, _) => "normal",
        (_, Some(ReasonCode::AdministrativeAction)) => "kicked",
        (_, Some(ReasonCode::KeepAliveTimeout)) => "keepalive_timeout",
        (_, Some(ReasonCode::ServerShuttingDown)) => "shutdown",
        (_, Some(ReasonCode::UseAnotherServer)) => "discarded",
        (_, Some(ReasonCode::ProtocolError | ReasonCode::MalformedPacket)) => "protocol_error",
        _ => "sock_closed",
    }
}
