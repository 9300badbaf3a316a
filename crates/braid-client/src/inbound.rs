//! What the client does with the PUBLISHes and PUBRELs the server sends: topic alias
//! resolution, QoS 2 exactly-once (ids remembered until PUBREL) and the acks sent when the
//! application takes a message.
//!
//! Sans-IO: packets in, packets and deliveries out.

use std::collections::HashMap;

use braid_proto::{Ack, ByteString, Packet, Publish, QoS, ReasonCode};

/// Token of a QoS 1/2 message handed to the application: the ack to send when it is taken.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken {
    /// [`Inbound::epoch`] at delivery; acks of a session the server no longer has are dropped.
    pub epoch: u32,
    pub packet_id: u16,
    pub qos: QoS,
}

/// The state of one inbound QoS 2 packet id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Qos2 {
    /// Handed to the application's queue, not taken yet: PUBREC not sent.
    Pending,
    /// Taken, PUBREC sent; waiting for PUBREL.
    Received,
}

/// What to do with a PUBLISH from the server.
#[derive(Debug)]
pub(crate) enum Action {
    /// Hand it to the application.
    Deliver(Publish),
    /// Send this packet (a PUBREC for a resent QoS 2 publish already taken).
    Reply(Packet),
    /// Nothing (a resent QoS 2 publish the application has not taken yet).
    Ignore,
    /// The server broke the protocol: close with this reason.
    Close(ReasonCode, &'static str),
}

/// Inbound session state.
#[derive(Debug, Default)]
pub(crate) struct Inbound {
    /// Topic Alias Maximum we announced.
    alias_max: u16,
    /// Aliases the server defined on this connection.
    aliases: HashMap<u16, ByteString>,
    /// QoS 2 ids received and not yet released; session state, kept across reconnects.
    qos2: HashMap<u16, Qos2>,
    /// Bumped whenever the server loses the session.
    epoch: u32,
}

impl Inbound {
    /// State for a connection that announced `alias_max` topic aliases.
    pub(crate) fn new(alias_max: u16) -> Inbound {
        Inbound { alias_max, ..Default::default() }
    }

    /// The current session epoch.
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }

    /// A new connection: aliases start over; without a resumed session the QoS 2 state is
    /// gone too, and acks for messages of the old session will not be sent.
    pub(crate) fn on_connect(&mut self, session_present: bool) {
        self.aliases.clear();
        if !session_present {
            self.qos2.clear();
            self.epoch = self.epoch.wrapping_add(1);
        }
    }

    /// Handles a PUBLISH.
    pub(crate) fn on_publish(&mut self, mut p: Publish) -> Action {
        if let Some(alias) = p.properties.topic_alias {
            if alias == 0 || alias > self.alias_max {
                return Action::Close(
                    ReasonCode::TopicAliasInvalid,
                    "topic alias 0 or above our Topic Alias Maximum",
                );
            }
            if p.topic.is_empty() {
                match self.aliases.get(&alias) {
                    Some(topic) => p.topic = topic.clone(),
                    None => {
                        return Action::Close(
                            ReasonCode::ProtocolError,
                            "topic alias used before it was defined",
                        )
                    }
                }
            } else {
                self.aliases.insert(alias, p.topic.clone());
            }
        }
        if p.qos == QoS::ExactlyOnce {
            match self.qos2.get(&p.packet_id) {
                None => {
                    self.qos2.insert(p.packet_id, Qos2::Pending);
                }
                Some(Qos2::Pending) => return Action::Ignore,
                Some(Qos2::Received) => return Action::Reply(Packet::PubRec(Ack::new(p.packet_id))),
            }
        }
        Action::Deliver(p)
    }

    /// The application took a QoS 1/2 message: the PUBACK or PUBREC to send, if any.
    pub(crate) fn on_taken(&mut self, t: Taken) -> Option<Packet> {
        if t.epoch != self.epoch {
            return None;
        }
        match t.qos {
            QoS::AtMostOnce => None,
            QoS::AtLeastOnce => Some(Packet::PubAck(Ack::new(t.packet_id))),
            QoS::ExactlyOnce => {
                let state = self.qos2.get_mut(&t.packet_id)?;
                *state = Qos2::Received;
                Some(Packet::PubRec(Ack::new(t.packet_id)))
            }
        }
    }

    /// PUBREL: forget the id and answer with PUBCOMP (0x92 if the id is unknown).
    pub(crate) fn on_pubrel(&mut self, id: u16) -> Packet {
        match self.qos2.get(&id) {
            Some(Qos2::Received) => {
                self.qos2.remove(&id);
                Packet::PubComp(Ack::new(id))
            }
            // PUBREL before our PUBREC: the server is early; release anyway, the message is
            // already in the application's queue and the id must not block a new message.
            Some(Qos2::Pending) => {
                self.qos2.remove(&id);
                Packet::PubComp(Ack::new(id))
            }
            None => Packet::PubComp(Ack::with_reason(id, ReasonCode::PacketIdentifierNotFound)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::Properties;

    fn publish(topic: &str, qos: QoS, id: u16, alias: Option<u16>) -> Publish {
        Publish {
            qos,
            topic: topic.into(),
            packet_id: id,
            properties: Properties::from(braid_proto::PropertyValues {
                topic_alias: alias,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn delivered(a: Action) -> Publish {
        match a {
            Action::Deliver(p) => p,
            other => panic!("expected a delivery, got {other:?}"),
        }
    }

    #[test]
    fn aliases_are_defined_then_resolved() {
        let mut s = Inbound::new(5);
        let p = delivered(s.on_publish(publish("a/b", QoS::AtMostOnce, 0, Some(2))));
        assert_eq!(&*p.topic, "a/b");
        let p = delivered(s.on_publish(publish("", QoS::AtMostOnce, 0, Some(2))));
        assert_eq!(&*p.topic, "a/b");
        assert_eq!(p.properties.topic_alias, Some(2));
        // Redefinition.
        delivered(s.on_publish(publish("c", QoS::AtMostOnce, 0, Some(2))));
        assert_eq!(&*delivered(s.on_publish(publish("", QoS::AtMostOnce, 0, Some(2)))).topic, "c");
    }

    #[test]
    fn bad_aliases_close() {
        let mut s = Inbound::new(2);
        assert!(matches!(
            s.on_publish(publish("a", QoS::AtMostOnce, 0, Some(3))),
            Action::Close(ReasonCode::TopicAliasInvalid, _)
        ));
        assert!(matches!(
            s.on_publish(publish("a", QoS::AtMostOnce, 0, Some(0))),
            Action::Close(ReasonCode::TopicAliasInvalid, _)
        ));
        assert!(matches!(
            s.on_publish(publish("", QoS::AtMostOnce, 0, Some(1))),
            Action::Close(ReasonCode::ProtocolError, _)
        ));
    }

    #[test]
    fn aliases_do_not_survive_a_reconnect() {
        let mut s = Inbound::new(2);
        delivered(s.on_publish(publish("a", QoS::AtMostOnce, 0, Some(1))));
        s.on_connect(true);
        assert!(matches!(s.on_publish(publish("", QoS::AtMostOnce, 0, Some(1))), Action::Close(..)));
    }

    #[test]
    fn qos1_is_acked_when_taken() {
        let mut s = Inbound::new(0);
        let p = delivered(s.on_publish(publish("a", QoS::AtLeastOnce, 9, None)));
        let t = Taken { epoch: s.epoch(), packet_id: p.packet_id, qos: p.qos };
        assert_eq!(s.on_taken(t), Some(Packet::PubAck(Ack::new(9))));
    }

    #[test]
    fn qos2_is_delivered_once_until_pubrel() {
        let mut s = Inbound::new(0);
        delivered(s.on_publish(publish("a", QoS::ExactlyOnce, 4, None)));
        // Resent before the application took it: nothing, the PUBREC comes with the take.
        assert!(matches!(s.on_publish(publish("a", QoS::ExactlyOnce, 4, None)), Action::Ignore));
        let t = Taken { epoch: s.epoch(), packet_id: 4, qos: QoS::ExactlyOnce };
        assert_eq!(s.on_taken(t), Some(Packet::PubRec(Ack::new(4))));
        // Resent after PUBREC (ours was lost): PUBREC again, no second delivery.
        assert!(matches!(
            s.on_publish(publish("a", QoS::ExactlyOnce, 4, None)),
            Action::Reply(Packet::PubRec(_))
        ));
        // Survives a resumed session.
        s.on_connect(true);
        assert!(matches!(s.on_publish(publish("a", QoS::ExactlyOnce, 4, None)), Action::Reply(_)));
        assert_eq!(s.on_pubrel(4), Packet::PubComp(Ack::new(4)));
        // Released: the id is free for a new message.
        delivered(s.on_publish(publish("b", QoS::ExactlyOnce, 4, None)));
        assert_eq!(
            s.on_pubrel(5),
            Packet::PubComp(Ack::with_reason(5, ReasonCode::PacketIdentifierNotFound))
        );
    }

    #[test]
    fn acks_of_a_lost_session_are_not_sent() {
        let mut s = Inbound::new(0);
        delivered(s.on_publish(publish("a", QoS::AtLeastOnce, 1, None)));
        delivered(s.on_publish(publish("a", QoS::ExactlyOnce, 2, None)));
        let old = s.epoch();
        s.on_connect(false);
        assert_eq!(s.on_taken(Taken { epoch: old, packet_id: 1, qos: QoS::AtLeastOnce }), None);
        assert_eq!(s.on_taken(Taken { epoch: old, packet_id: 2, qos: QoS::ExactlyOnce }), None);
        // The QoS 2 id is forgotten: a new message with it is delivered.
        delivered(s.on_publish(publish("b", QoS::ExactlyOnce, 2, None)));
    }
}
