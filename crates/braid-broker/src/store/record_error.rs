//! A stored record that does not read back, and why (see [`crate::store::record`]).

use braid_proto::DecodeError;

/// A stored record (or a record's body) that does not read back: cut short, failing its
/// checksum, or holding what its kind does not allow.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Fewer bytes than a record header.
    #[error("truncated record header ({len} bytes)")]
    TruncatedHeader {
        /// The bytes there are.
        len: usize,
    },
    /// A header whose length runs past the bytes there are (or is 0).
    #[error("truncated record (needs {needs} bytes, {left} left)")]
    Truncated {
        /// The length the header gives.
        needs: usize,
        /// The bytes after the header.
        left: usize,
    },
    /// The CRC does not match the kind and body.
    #[error("record checksum mismatch")]
    Checksum,
    /// A field runs past the end of the body.
    #[error("record body too short")]
    TooShort,
    /// A packet in the record is cut short.
    #[error("incomplete packet in record")]
    IncompletePacket,
    /// A packet in the record does not decode.
    #[error("bad packet in record: {0}")]
    BadPacket(#[source] DecodeError),
    /// A packet of another type than the record holds there.
    #[error("{record} holds no {packet}")]
    WrongPacket {
        /// The record: "record", "session record".
        record: &'static str,
        /// The packet type expected.
        packet: &'static str,
    },
    /// A QoS that is not 0, 1 or 2.
    #[error("bad QoS in record")]
    BadQos(u8),
    /// A shared group name that is not UTF-8.
    #[error("bad group name in record")]
    BadGroupName(#[source] std::str::Utf8Error),
    /// A STAGE record without a known stage.
    #[error("bad stage record")]
    BadStage,
    /// A record kind this version does not know.
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    /// A record of another kind where a queued delivery was expected.
    #[error("not a delivery")]
    NotADelivery,
}
