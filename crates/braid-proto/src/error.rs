//! Codec errors, each mapped to the v5 reason code a broker closes the connection with.

use crate::ReasonCode;

/// Why bytes could not be decoded into a packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes break the packet grammar (bad flags, lengths, UTF-8, varints, ...).
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    /// Well-formed bytes that the protocol forbids here (duplicate property, property not
    /// allowed in this packet, QoS 0 with packet id, ...).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// The remaining length exceeds the configured maximum packet size.
    #[error("packet of {size} bytes exceeds the maximum packet size {max}")]
    TooLarge {
        /// Size the packet announced (fixed header included).
        size: usize,
        /// The limit.
        max: u32,
    },
    /// CONNECT names a protocol or level this codec does not speak.
    #[error("unsupported protocol name or level")]
    UnsupportedProtocol,
    /// A PUBLISH topic name is empty where not allowed or contains wildcards.
    #[error("invalid topic name")]
    TopicNameInvalid,
}

impl DecodeError {
    /// The v5 reason code to put in the DISCONNECT (or CONNACK) that answers this error.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            DecodeError::Malformed(_) => ReasonCode::MalformedPacket,
            DecodeError::Protocol(_) => ReasonCode::ProtocolError,
            DecodeError::TooLarge { .. } => ReasonCode::PacketTooLarge,
            DecodeError::UnsupportedProtocol => ReasonCode::UnsupportedProtocolVersion,
            DecodeError::TopicNameInvalid => ReasonCode::TopicNameInvalid,
        }
    }
}

/// Why a packet could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The packet is longer than MQTT's 268,435,455-byte remaining length allows.
    #[error("packet too large to encode")]
    TooLarge,
    /// A string or binary field is longer than 65,535 bytes.
    #[error("field longer than 65535 bytes")]
    FieldTooLong,
    /// The packet does not exist in the target protocol version (e.g. AUTH in 3.1.1).
    #[error("packet not supported by this protocol version")]
    Unsupported,
}
