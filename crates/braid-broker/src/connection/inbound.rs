//! What the broker does with each packet a connected client sends.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_proto::{
    encode, Ack, ByteString, BytesMut, Disconnect, Packet, ProtocolVersion, Publish, QoS, ReasonCode,
};

use crate::broker::{Broker, Ending};
use crate::message::{Message, StreamTag};
use crate::metrics::Metrics;
use crate::session::Session;

/// What the read loop does after a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flow {
    /// Keep reading.
    Continue,
    /// The client said DISCONNECT.
    End(Ending),
    /// Close the connection with this reason and detail (sent in a v5 DISCONNECT).
    Close(ReasonCode, Cow<'static, str>),
}

/// Per-connection inbound state.
pub struct Inbound<'a> {
    broker: &'a Arc<Broker>,
    session: &'a Arc<Session>,
    version: ProtocolVersion,
    /// Topic aliases the client defined on this connection.
    aliases: HashMap<u16, ByteString>,
    /// An ack freed in-flight room or a subscription queued retained messages.
    transmit: bool,
    /// The acknowledgement of the last PUBLISH, while full subscriber queues hold it back.
    held: Option<Box<Held>>,
    /// The stream this state reads (QUIC); subscriptions made here deliver on it.
    stream: StreamTag,
    /// Inbound QoS 2 ids of a QUIC data stream, whose packet ids are its own; `None` uses the
    /// session's set, which outlives the connection. Boxed so that TCP connections, which
    /// never have one, carry one word for it.
    #[allow(clippy::box_collection)]
    stream_qos2: Option<Box<HashSet<u16>>>,
}

impl<'a> Inbound<'a> {
    /// State for a connection that has just been accepted.
    pub fn new(broker: &'a Arc<Broker>, session: &'a Arc<Session>, version: ProtocolVersion) -> Self {
        Inbound {
            broker,
            session,
            version,
            aliases: HashMap::new(),
            transmit: false,
            held: None,
            stream: StreamTag::default(),
            stream_qos2: None,
        }
    }

    /// State for a QUIC data stream `stream`: its packet ids (and so its unreleased QoS 2 ids)
    /// and its topic aliases are its own, and its subscriptions deliver on it.
    pub fn for_stream(
        broker: &'a Arc<Broker>,
        session: &'a Arc<Session>,
        version: ProtocolVersion,
        stream: StreamTag,
    ) -> Self {
        Inbound { stream, stream_qos2: Some(Box::default()), ..Inbound::new(broker, session, version) }
    }

    /// True (once) if the session may have deliveries to send since the last call.
    pub fn take_transmit(&mut self) -> bool {
        std::mem::take(&mut self.transmit)
    }

    /// Handles one packet; replies are encoded into `out`.
    pub fn handle(&mut self, p: Packet, out: &mut BytesMut) -> Flow {
        let reply = match p {
            Packet::Publish(p) => return self.publish(p, out),
            Packet::PubAck(a) => {
                self.transmit |= self.session.lock().on_puback(a.packet_id);
                None
            }
            Packet::PubRec(a) => {
                self.transmit = true;
                self.session.lock().on_pubrec(&a).map(Packet::PubRel)
            }
            Packet::PubComp(a) => {
                self.transmit |= self.session.lock().on_pubcomp(a.packet_id);
                None
            }
            Packet::PubRel(a) => {
                let known = match self.stream_qos2.as_mut() {
                    Some(ids) => ids.remove(&a.packet_id),
                    None => self.session.lock().incoming_qos2.remove(&a.packet_id),
                };
                let reason = if known { ReasonCode::Success } else { ReasonCode::PacketIdentifierNotFound };
                Some(Packet::PubComp(Ack::with_reason(a.packet_id, reason)))
            }
            Packet::Subscribe(s) => {
                self.transmit = true;
                Some(Packet::SubAck(self.broker.subscribe_on(self.session, self.version, s, self.stream)))
            }
            Packet::Unsubscribe(u) => {
                Some(Packet::UnsubAck(self.broker.unsubscribe(self.session, self.version, u)))
            }
            Packet::PingReq => Some(Packet::PingResp),
            Packet::Disconnect(d) => return self.disconnect(d),
            Packet::Connect(_) => return close(ReasonCode::ProtocolError, "second CONNECT on a connection"),
            // No authentication method is configured, so AUTH has nothing to continue; packets
            // only a server sends are errors too.
            Packet::Auth(_)
            | Packet::ConnAck(_)
            | Packet::SubAck(_)
            | Packet::UnsubAck(_)
            | Packet::PingResp => return close(ReasonCode::ProtocolError, "a packet only a server may send"),
        };
        if let Some(p) = reply {
            self.reply(&p, out);
        }
        Flow::Continue
    }

    /// Encodes a reply to the client into `out`.
    pub fn reply(&self, p: &Packet, out: &mut BytesMut) {
        // Replies are well-formed packets of this connection's version; encoding cannot fail.
        let _ = encode(p, self.version, out);
    }

    fn disconnect(&mut self, d: Disconnect) -> Flow {
        if let Some(expiry) = d.properties.session_expiry_interval {
            let mut st = self.session.lock();
            // A session that was to end at disconnect may not be revived here (MQTT-3.14.2-2).
            if st.expiry_secs == 0 && expiry != 0 {
                return close(
                    ReasonCode::ProtocolError,
                    "session expiry set at DISCONNECT after connecting with 0",
                );
            }
            st.expiry_secs = expiry.min(self.broker.config.session.max_session_expiry_secs);
        }
        match d.reason {
            ReasonCode::DisconnectWithWill => Flow::End(Ending::WithWill),
            _ => Flow::End(Ending::Normal),
        }
    }

    fn publish(&mut self, mut p: Publish, out: &mut BytesMut) -> Flow {
        let cfg = &self.broker.config.mqtt;
        if let Some(alias) = p.properties.topic_alias {
            if alias == 0 || alias > cfg.topic_alias_maximum {
                return close(ReasonCode::TopicAliasInvalid, "topic alias 0 or above Topic Alias Maximum");
            }
            if p.topic.is_empty() {
                match self.aliases.get(&alias) {
                    Some(topic) => p.topic = topic.clone(),
                    None => {
                        return close(ReasonCode::ProtocolError, "topic alias used before it was defined")
                    }
                }
            } else {
                self.aliases.insert(alias, p.topic.clone());
            }
        }
        if p.qos as u8 > cfg.max_qos {
            return close(ReasonCode::QoSNotSupported, "QoS above Maximum QoS");
        }
        if p.retain && !cfg.retain_available {
            return close(ReasonCode::RetainNotSupported, "retained messages are disabled");
        }
        Metrics::add(&self.broker.metrics.messages_received, 1);
        let (qos, id) = (p.qos, p.packet_id);
        if is_sys_topic(&p.topic) {
            // Only the broker publishes under $SYS: acknowledge (v5: Not authorized) and drop.
            Metrics::add(&self.broker.metrics.messages_dropped, 1);
            let ack = Ack::with_reason(id, ReasonCode::NotAuthorized);
            match qos {
                QoS::AtMostOnce => {}
                QoS::AtLeastOnce => self.reply(&Packet::PubAck(ack), out),
                QoS::ExactlyOnce => self.reply(&Packet::PubRec(ack), out),
            }
            return Flow::Continue;
        }
        let msg = Message::from_publish(p, Instant::now(), self.session.id, self.session.client_id.clone());
        let ack = match qos {
            QoS::AtMostOnce => {
                let _ = self.broker.publish(msg);
                return Flow::Continue;
            }
            QoS::AtLeastOnce => Packet::PubAck(Ack::new(id)),
            QoS::ExactlyOnce => {
                let first = {
                    let mut session = None;
                    let ids = match self.stream_qos2.as_deref_mut() {
                        Some(ids) => ids,
                        None => &mut session.insert(self.session.lock()).incoming_qos2,
                    };
                    if ids.contains(&id) {
                        false
                    } else if ids.len() >= usize::from(cfg.receive_maximum) {
                        return close(
                            ReasonCode::ReceiveMaximumExceeded,
                            "more unreleased QoS 2 messages than Receive Maximum",
                        );
                    } else {
                        ids.insert(id)
                    }
                };
                let ack = Packet::PubRec(Ack::new(id));
                // A PUBLISH resent before PUBREL is acknowledged again but not delivered twice.
                if !first {
                    self.reply(&ack, out);
                    return Flow::Continue;
                }
                ack
            }
        };
        let held = self.broker.publish(msg);
        if held.is_empty() {
            self.reply(&ack, out);
        } else {
            Metrics::add(&self.broker.metrics.publishes_held, 1);
            self.held = Some(Box::new(Held { ack, sessions: held, since: Instant::now() }));
        }
        Flow::Continue
    }

    /// True while an acknowledgement is held back by full subscriber queues: the connection
    /// reads nothing more from this client until [`Inbound::release_held`] returns.
    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// Waits until every subscriber queue that held the acknowledgement has drained (or its
    /// client went away), then returns the acknowledgement to send. A subscriber that holds it
    /// past `session.slow_consumer_timeout_secs` is disconnected. Cancel-safe; never resolves
    /// when nothing is held.
    pub async fn release_held(&mut self) -> Packet {
        let timeout = self.broker.config.session.slow_consumer_timeout_secs;
        let Some(held) = self.held.as_mut() else { return std::future::pending().await };
        while let Some(s) = held.sessions.last() {
            if timeout == 0 {
                s.wait_for_space().await;
            } else {
                let deadline = held.since + Duration::from_secs(timeout);
                if tokio::time::timeout_at(deadline.into(), s.wait_for_space()).await.is_err() {
                    s.evict_slow_consumer(timeout);
                    s.wait_for_space().await;
                }
            }
            held.sessions.pop();
        }
        match self.held.take() {
            Some(h) => h.ack,
            None => std::future::pending().await,
        }
    }
}

/// An acknowledgement waiting for subscriber queues to drain.
struct Held {
    ack: Packet,
    sessions: Vec<Arc<Session>>,
    since: Instant,
}

/// True for `$SYS` and everything below it.
fn is_sys_topic(topic: &str) -> bool {
    topic.strip_prefix("$SYS").is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn close(reason: ReasonCode, detail: &'static str) -> Flow {
    Flow::Close(reason, Cow::Borrowed(detail))
}
