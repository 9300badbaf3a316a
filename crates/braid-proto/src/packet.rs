//! The control packets of MQTT 3.1, 3.1.1 and 5.0 as plain data.

use bytes::Bytes;
use bytestring::ByteString;

use crate::{Properties, ReasonCode};

/// The protocol level carried in CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProtocolVersion {
    /// MQTT 3.1, protocol name "MQIsdp", level 3.
    V3_1 = 3,
    /// MQTT 3.1.1, protocol name "MQTT", level 4.
    V3_1_1 = 4,
    /// MQTT 5.0, protocol name "MQTT", level 5.
    V5 = 5,
}

impl ProtocolVersion {
    /// True for MQTT 5.0, the only version with properties and reason codes everywhere.
    pub fn is_v5(self) -> bool {
        self == ProtocolVersion::V5
    }
}

/// Quality of service of a message or subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum QoS {
    /// QoS 0: fire and forget.
    #[default]
    AtMostOnce = 0,
    /// QoS 1: acknowledged with PUBACK, may be duplicated.
    AtLeastOnce = 1,
    /// QoS 2: four-way handshake, delivered once.
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS for a wire value 0..=2.
    pub fn from_u8(v: u8) -> Option<QoS> {
        match v {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

/// The will message declared in CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastWill {
    /// Topic the will is published to.
    pub topic: ByteString,
    /// Will payload.
    pub payload: Bytes,
    /// Will QoS.
    pub qos: QoS,
    /// Will retain flag.
    pub retain: bool,
    /// v5 will properties (Will Delay Interval, Message Expiry, Content Type, ...).
    pub properties: Properties,
}

impl LastWill {
    /// A copy with bytes of its own: a decoded will's strings are slices of the buffer it was
    /// read into, which a will kept for a session's life would otherwise keep whole. (Only the
    /// properties a will may have are copied.)
    pub fn detached(&self) -> LastWill {
        let mut properties = self.properties.clone();
        if !properties.is_unset() {
            let p = &mut *properties;
            p.correlation_data = p.correlation_data.as_deref().map(Bytes::copy_from_slice);
            let users = p.user_properties.iter_mut().flat_map(|(k, v)| [k, v]);
            for s in p.content_type.iter_mut().chain(&mut p.response_topic).chain(users) {
                *s = ByteString::from(&**s);
            }
        }
        LastWill {
            topic: ByteString::from(&*self.topic),
            payload: Bytes::copy_from_slice(&self.payload),
            qos: self.qos,
            retain: self.retain,
            properties,
        }
    }
}

/// CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// Protocol version requested by the client.
    pub protocol: ProtocolVersion,
    /// Clean Session (3.1.x) / Clean Start (5.0).
    pub clean_start: bool,
    /// Keep alive in seconds, 0 = off.
    pub keep_alive: u16,
    /// v5 CONNECT properties.
    pub properties: Properties,
    /// Client identifier, possibly empty.
    pub client_id: ByteString,
    /// Will message, if the will flag is set.
    pub will: Option<LastWill>,
    /// User name, if the flag is set.
    pub username: Option<ByteString>,
    /// Password, if the flag is set.
    pub password: Option<Bytes>,
}

/// CONNACK. `reason` uses v5 codes; for 3.1.x the codec maps them to return codes 0..=5.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnAck {
    /// Session Present flag.
    pub session_present: bool,
    /// Connect reason code.
    pub reason: ReasonCode,
    /// v5 CONNACK properties.
    pub properties: Properties,
}

/// PUBLISH. Topic and payload are slices of the buffer the packet was decoded from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Publish {
    /// DUP flag.
    pub dup: bool,
    /// QoS.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic name; may be empty in v5 when a Topic Alias is used.
    pub topic: ByteString,
    /// Packet identifier; 0 for QoS 0.
    pub packet_id: u16,
    /// v5 PUBLISH properties.
    pub properties: Properties,
    /// Application payload.
    pub payload: Bytes,
}

/// A PUBLISH to encode from borrowed parts (see [`crate::encode_publish`]): a broker writes
/// each delivery of a message from the message's own topic and payload, cloning nothing and
/// touching no reference count they share with the other deliveries.
#[derive(Debug, Clone, Copy)]
pub struct PublishView<'a> {
    /// DUP flag.
    pub dup: bool,
    /// QoS.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic name; may be empty in v5 when a Topic Alias is used.
    pub topic: &'a str,
    /// Packet identifier; 0 for QoS 0.
    pub packet_id: u16,
    /// v5 PUBLISH properties.
    pub properties: &'a Properties,
    /// Application payload.
    pub payload: &'a [u8],
}

impl Publish {
    /// This PUBLISH as a [`PublishView`].
    pub fn view(&self) -> PublishView<'_> {
        PublishView {
            dup: self.dup,
            qos: self.qos,
            retain: self.retain,
            topic: &self.topic,
            packet_id: self.packet_id,
            properties: &self.properties,
            payload: &self.payload,
        }
    }
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP share this shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// Packet identifier.
    pub packet_id: u16,
    /// v5 reason code (Success for 3.1.x).
    pub reason: ReasonCode,
    /// v5 properties (Reason String, User Property).
    pub properties: Properties,
}

impl Ack {
    /// A successful ack with no properties.
    pub fn new(packet_id: u16) -> Ack {
        Ack::with_reason(packet_id, ReasonCode::Success)
    }

    /// An ack with the given reason code and no properties.
    pub fn with_reason(packet_id: u16, reason: ReasonCode) -> Ack {
        Ack { packet_id, reason, properties: Properties::default() }
    }
}

/// Retain Handling subscription option (v5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RetainHandling {
    /// Send retained messages at the time of the subscribe.
    #[default]
    SendAtSubscribe = 0,
    /// Send retained messages only if the subscription did not already exist.
    SendIfNew = 1,
    /// Never send retained messages for this subscription.
    DoNotSend = 2,
}

/// The options byte of one SUBSCRIBE entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubscriptionOptions {
    /// Maximum QoS.
    pub qos: QoS,
    /// v5 No Local.
    pub no_local: bool,
    /// v5 Retain As Published.
    pub retain_as_published: bool,
    /// v5 Retain Handling.
    pub retain_handling: RetainHandling,
}

/// SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    /// Packet identifier.
    pub packet_id: u16,
    /// v5 properties (Subscription Identifier, User Property).
    pub properties: Properties,
    /// Topic filters with their options, at least one.
    pub filters: Vec<(ByteString, SubscriptionOptions)>,
}

/// SUBACK. v5 reason codes; 3.1.x uses 0, 1, 2 and 0x80 (any failure code maps to 0x80).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubAck {
    /// Packet identifier.
    pub packet_id: u16,
    /// v5 properties.
    pub properties: Properties,
    /// One reason code per filter.
    pub reasons: Vec<ReasonCode>,
}

/// UNSUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    /// Packet identifier.
    pub packet_id: u16,
    /// v5 properties.
    pub properties: Properties,
    /// Topic filters, at least one.
    pub filters: Vec<ByteString>,
}

/// UNSUBACK. `reasons` is empty for 3.1.x, which has no payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsubAck {
    /// Packet identifier.
    pub packet_id: u16,
    /// v5 properties.
    pub properties: Properties,
    /// One reason code per filter (v5 only).
    pub reasons: Vec<ReasonCode>,
}

/// DISCONNECT (a reason and properties in v5, empty in 3.1.x).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    /// Reason code.
    pub reason: ReasonCode,
    /// v5 properties (Session Expiry Interval, Reason String, Server Reference, ...).
    pub properties: Properties,
}

/// AUTH (v5 only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    /// Reason code (Success, Continue authentication, Re-authenticate).
    pub reason: ReasonCode,
    /// Properties (Authentication Method, Authentication Data, ...).
    pub properties: Properties,
}

/// Any MQTT control packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// CONNECT.
    Connect(Box<Connect>),
    /// CONNACK.
    ConnAck(ConnAck),
    /// PUBLISH.
    Publish(Publish),
    /// PUBACK.
    PubAck(Ack),
    /// PUBREC.
    PubRec(Ack),
    /// PUBREL.
    PubRel(Ack),
    /// PUBCOMP.
    PubComp(Ack),
    /// SUBSCRIBE.
    Subscribe(Subscribe),
    /// SUBACK.
    SubAck(SubAck),
    /// UNSUBSCRIBE.
    Unsubscribe(Unsubscribe),
    /// UNSUBACK.
    UnsubAck(UnsubAck),
    /// PINGREQ.
    PingReq,
    /// PINGRESP.
    PingResp,
    /// DISCONNECT.
    Disconnect(Disconnect),
    /// AUTH.
    Auth(Auth),
}

impl Packet {
    /// The packet's name as the spec writes it, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Packet::Connect(_) => "CONNECT",
            Packet::ConnAck(_) => "CONNACK",
            Packet::Publish(_) => "PUBLISH",
            Packet::PubAck(_) => "PUBACK",
            Packet::PubRec(_) => "PUBREC",
            Packet::PubRel(_) => "PUBREL",
            Packet::PubComp(_) => "PUBCOMP",
            Packet::Subscribe(_) => "SUBSCRIBE",
            Packet::SubAck(_) => "SUBACK",
            Packet::Unsubscribe(_) => "UNSUBSCRIBE",
            Packet::UnsubAck(_) => "UNSUBACK",
            Packet::PingReq => "PINGREQ",
            Packet::PingResp => "PINGRESP",
            Packet::Disconnect(_) => "DISCONNECT",
            Packet::Auth(_) => "AUTH",
        }
    }
}
