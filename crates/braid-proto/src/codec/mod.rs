//! Decoding and encoding of whole packets: the fixed header, then one module per packet shape.
//!
//! Every packet module provides a `decode_*` function that parses the body of a frame with a
//! [`Reader`] and an implementation of [`Body`] that sizes and writes it. This module owns the
//! fixed header: the packet type and flags byte and the Remaining Length.

mod ack;
mod connect;
mod disconnect;
mod primitives;
mod properties;
mod publish;
mod subscribe;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod test_util;

use bytes::{BufMut, BytesMut};

use self::primitives::{parse_varint, put_varint, varint_len, Reader, MAX_VARINT};
use crate::{DecodeError, EncodeError, Packet, ProtocolVersion, PublishView, QoS};

/// The body of a packet after the fixed header: how long it is and how to write it.
trait Body {
    /// Bytes the body takes, which is the Remaining Length.
    fn body_len(&self, version: ProtocolVersion) -> usize;
    /// Writes the body; `buf` already has room for `body_len` bytes.
    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError>;
}

/// The empty body of PINGREQ and PINGRESP.
struct Empty;

impl Body for Empty {
    fn body_len(&self, _: ProtocolVersion) -> usize {
        0
    }
    fn write_body(&self, _: ProtocolVersion, _: &mut BytesMut) -> Result<(), EncodeError> {
        Ok(())
    }
}

/// The flags of a PUBLISH fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PublishFlags {
    dup: bool,
    qos: QoS,
    retain: bool,
}

/// What the first byte of a fixed header announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Connect,
    ConnAck,
    Publish(PublishFlags),
    PubAck,
    PubRec,
    PubRel,
    PubComp,
    Subscribe,
    SubAck,
    Unsubscribe,
    UnsubAck,
    PingReq,
    PingResp,
    Disconnect,
    Auth,
}

/// Validates the packet type and flags of a fixed header's first byte.
///
/// PUBREL, SUBSCRIBE and UNSUBSCRIBE need flags 0b0010 and every other packet but PUBLISH 0.
/// MQTT 3.1 clients may set DUP (0b1000) on retried PUBREL, SUBSCRIBE and UNSUBSCRIBE, and 3.1
/// did not forbid DUP on a QoS 0 PUBLISH, so these two rules are 3.1.1/5.0 only.
fn parse_first_byte(byte: u8, version: ProtocolVersion) -> Result<Kind, DecodeError> {
    let flags = byte & 0x0F;
    let legacy = version == ProtocolVersion::V3_1;
    let kind = match byte >> 4 {
        1 => Kind::Connect,
        2 => Kind::ConnAck,
        3 => {
            let qos =
                QoS::from_u8((flags >> 1) & 0b11).ok_or(DecodeError::Malformed("PUBLISH with QoS 3"))?;
            let dup = flags & 0b1000 != 0;
            if dup && qos == QoS::AtMostOnce && !legacy {
                return Err(DecodeError::Malformed("PUBLISH with QoS 0 and DUP set"));
            }
            return Ok(Kind::Publish(PublishFlags { dup, qos, retain: flags & 1 != 0 }));
        }
        4 => Kind::PubAck,
        5 => Kind::PubRec,
        6 => Kind::PubRel,
        7 => Kind::PubComp,
        8 => Kind::Subscribe,
        9 => Kind::SubAck,
        10 => Kind::Unsubscribe,
        11 => Kind::UnsubAck,
        12 => Kind::PingReq,
        13 => Kind::PingResp,
        14 => Kind::Disconnect,
        15 if version.is_v5() => Kind::Auth,
        _ => return Err(DecodeError::Malformed("reserved packet type")),
    };
    let required = match kind {
        Kind::PubRel | Kind::Subscribe | Kind::Unsubscribe => 0b0010,
        _ => 0,
    };
    let dup_allowed = legacy && required != 0;
    let checked = if dup_allowed { flags & !0b1000 } else { flags };
    if checked != required {
        return Err(DecodeError::Malformed("invalid fixed header flags"));
    }
    Ok(kind)
}

/// Decodes one packet from the front of `buf`.
///
/// When `buf` holds a whole packet, it is removed from `buf` and returned; strings and
/// payloads in it are slices of that frame, not copies. When more bytes are needed the result
/// is `Ok(None)` and `buf` is left untouched. As soon as the fixed header is complete, the
/// total size (fixed header plus Remaining Length) is checked against `max_packet_size`, so an
/// oversized packet is refused before its body arrives ([`DecodeError::TooLarge`]).
///
/// `version` is the version negotiated on the connection; a CONNECT ignores it and is decoded
/// with the version it names itself (see [`crate::Connect::protocol`]).
///
/// Every error is fatal for the connection: after an error, the contents of `buf` are
/// unspecified (the offending frame may or may not have been removed).
pub fn decode(
    buf: &mut BytesMut,
    version: ProtocolVersion,
    max_packet_size: u32,
) -> Result<Option<Packet>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let kind = parse_first_byte(first, version)?;
    let Some((header_len, size)) = fixed_header(buf)? else {
        return Ok(None);
    };
    if size > max_packet_size as usize {
        return Err(DecodeError::TooLarge { size, max: max_packet_size });
    }
    if buf.len() < size {
        return Ok(None);
    }
    let mut frame = buf.split_to(size).freeze();
    let body = Reader::new(frame.split_off(header_len));
    decode_body(kind, body, version).map(Some)
}

/// The size of the packet whose first bytes are `head` (fixed header plus Remaining Length),
/// once its fixed header (at most 5 bytes) is complete; `Ok(None)` before. An error for a
/// malformed Remaining Length. The packet type is not checked.
pub fn packet_size(head: &[u8]) -> Result<Option<usize>, DecodeError> {
    Ok(fixed_header(head)?.map(|(_, size)| size))
}

/// The length of the fixed header at the start of `buf` and the size of its packet.
fn fixed_header(buf: &[u8]) -> Result<Option<(usize, usize)>, DecodeError> {
    let Some((remaining, len_bytes)) = parse_varint(buf.get(1..).unwrap_or_default())? else {
        return Ok(None);
    };
    Ok(Some((1 + len_bytes, 1 + len_bytes + remaining)))
}

fn decode_body(kind: Kind, mut r: Reader, version: ProtocolVersion) -> Result<Packet, DecodeError> {
    let packet = match kind {
        Kind::Connect => Packet::Connect(Box::new(connect::decode_connect(r)?)),
        Kind::ConnAck => Packet::ConnAck(connect::decode_connack(r, version)?),
        Kind::Publish(flags) => Packet::Publish(publish::decode_publish(flags, r, version)?),
        Kind::PubAck => Packet::PubAck(ack::decode_ack(r, version)?),
        Kind::PubRec => Packet::PubRec(ack::decode_ack(r, version)?),
        Kind::PubRel => Packet::PubRel(ack::decode_ack(r, version)?),
        Kind::PubComp => Packet::PubComp(ack::decode_ack(r, version)?),
        Kind::Subscribe => Packet::Subscribe(subscribe::decode_subscribe(r, version)?),
        Kind::SubAck => Packet::SubAck(subscribe::decode_suback(r, version)?),
        Kind::Unsubscribe => Packet::Unsubscribe(subscribe::decode_unsubscribe(r, version)?),
        Kind::UnsubAck => Packet::UnsubAck(subscribe::decode_unsuback(r, version)?),
        Kind::PingReq => {
            r.finish()?;
            Packet::PingReq
        }
        Kind::PingResp => {
            r.finish()?;
            Packet::PingResp
        }
        Kind::Disconnect => Packet::Disconnect(disconnect::decode_disconnect(&mut r, version)?),
        Kind::Auth => Packet::Auth(disconnect::decode_auth(&mut r)?),
    };
    Ok(packet)
}

/// The first byte of the fixed header: packet type and flags.
fn first_byte(packet: &Packet) -> u8 {
    match packet {
        Packet::Connect(_) => 0x10,
        Packet::ConnAck(_) => 0x20,
        Packet::Publish(p) => publish_first_byte(p.dup, p.qos, p.retain),
        Packet::PubAck(_) => 0x40,
        Packet::PubRec(_) => 0x50,
        Packet::PubRel(_) => 0x62,
        Packet::PubComp(_) => 0x70,
        Packet::Subscribe(_) => 0x82,
        Packet::SubAck(_) => 0x90,
        Packet::Unsubscribe(_) => 0xA2,
        Packet::UnsubAck(_) => 0xB0,
        Packet::PingReq => 0xC0,
        Packet::PingResp => 0xD0,
        Packet::Disconnect(_) => 0xE0,
        Packet::Auth(_) => 0xF0,
    }
}

fn publish_first_byte(dup: bool, qos: QoS, retain: bool) -> u8 {
    0x30 | u8::from(dup) << 3 | (qos as u8) << 1 | u8::from(retain)
}

fn body(packet: &Packet) -> &dyn Body {
    match packet {
        Packet::Connect(p) => &**p,
        Packet::ConnAck(p) => p,
        Packet::Publish(p) => p,
        Packet::PubAck(p) | Packet::PubRec(p) | Packet::PubRel(p) | Packet::PubComp(p) => p,
        Packet::Subscribe(p) => p,
        Packet::SubAck(p) => p,
        Packet::Unsubscribe(p) => p,
        Packet::UnsubAck(p) => p,
        Packet::PingReq | Packet::PingResp => &Empty,
        Packet::Disconnect(p) => p,
        Packet::Auth(p) => p,
    }
}

/// Appends the encoding of `packet` for a connection speaking `version` to `buf`.
///
/// Lengths are computed first, `buf` grows once by exactly the packet's size, and the packet
/// is written straight into it. Version differences are applied here: 3.1.x packets carry no
/// properties and no reason codes except the CONNACK return code and SUBACK codes (mapped from
/// [`crate::ReasonCode`], see [`crate::ConnAck`] and [`crate::SubAck`]); v5 acks, DISCONNECT
/// and AUTH use their short forms when the reason is Success and there are no properties.
/// Properties the packet type does not allow are not written. A CONNECT is encoded with its own
/// [`crate::Connect::protocol`], whatever `version` says.
///
/// On error nothing is appended: AUTH below v5 is [`EncodeError::Unsupported`], a string or
/// binary field over 65,535 bytes is [`EncodeError::FieldTooLong`], and a Remaining Length (or
/// Subscription Identifier) above 268,435,455 is [`EncodeError::TooLarge`].
pub fn encode(packet: &Packet, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
    if matches!(packet, Packet::Auth(_)) && !version.is_v5() {
        return Err(EncodeError::Unsupported);
    }
    encode_body(first_byte(packet), body(packet), version, buf)
}

/// Appends the encoding of a PUBLISH made of borrowed parts to `buf`, as [`encode`] does for a
/// [`Packet::Publish`].
pub fn encode_publish(
    p: &PublishView<'_>,
    version: ProtocolVersion,
    buf: &mut BytesMut,
) -> Result<(), EncodeError> {
    encode_body(publish_first_byte(p.dup, p.qos, p.retain), p, version, buf)
}

/// The fixed header's first byte, then the Remaining Length and `body`.
fn encode_body(
    first: u8,
    body: &dyn Body,
    version: ProtocolVersion,
    buf: &mut BytesMut,
) -> Result<(), EncodeError> {
    let body_len = body.body_len(version);
    if body_len > MAX_VARINT {
        return Err(EncodeError::TooLarge);
    }
    let start = buf.len();
    buf.reserve(1 + varint_len(body_len) + body_len);
    buf.put_u8(first);
    let written = put_varint(buf, body_len).and_then(|()| body.write_body(version, buf));
    if written.is_err() {
        buf.truncate(start);
    }
    debug_assert!(written.is_err() || buf.len() - start == 1 + varint_len(body_len) + body_len);
    written
}

/// The number of bytes [`encode`] appends for `packet` and `version`: the fixed header plus
/// the Remaining Length. Meant for checking a peer's Maximum Packet Size before encoding.
/// For a packet that [`encode`] rejects, the value is meaningless (but computing it is safe).
pub fn encoded_len(packet: &Packet, version: ProtocolVersion) -> usize {
    frame_len(body(packet).body_len(version))
}

/// Fixed header plus body.
fn frame_len(body_len: usize) -> usize {
    1 + varint_len(body_len) + body_len
}

impl crate::Publish {
    /// Bytes [`encode`] writes for this PUBLISH, fixed header included (what a receiver's
    /// Maximum Packet Size is compared with), without wrapping it in a [`Packet`].
    pub fn encoded_len(&self, version: ProtocolVersion) -> usize {
        self.view().encoded_len(version)
    }
}

impl PublishView<'_> {
    /// Bytes [`encode_publish`] writes for this PUBLISH, fixed header included.
    pub fn encoded_len(&self, version: ProtocolVersion) -> usize {
        frame_len(self.body_len(version))
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;
    use crate::ReasonCode;

    const VERSIONS: [ProtocolVersion; 3] =
        [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1, ProtocolVersion::V5];

    #[test]
    fn empty_buffer_needs_more() {
        for version in VERSIONS {
            let mut buf = BytesMut::new();
            assert_eq!(decode(&mut buf, version, u32::MAX), Ok(None));
        }
    }

    #[test]
    fn ping_round_trip_and_known_bytes() {
        for version in VERSIONS {
            assert_eq!(encode_to_vec(&Packet::PingReq, version), [0xC0, 0x00]);
            assert_eq!(encode_to_vec(&Packet::PingResp, version), [0xD0, 0x00]);
            round_trip(&Packet::PingReq, version);
            round_trip(&Packet::PingResp, version);
        }
    }

    #[test]
    fn ping_with_body_is_malformed() {
        assert_malformed(&[0xC0, 0x01, 0x00], ProtocolVersion::V5);
        assert_malformed(&[0xD0, 0x01, 0x00], ProtocolVersion::V3_1_1);
    }

    #[test]
    fn too_large_is_reported_from_the_fixed_header_alone() {
        // PUBLISH announcing 2,097,151 bytes of body, none of which has arrived.
        let mut buf = BytesMut::from(&[0x30, 0xFF, 0xFF, 0x7F][..]);
        assert_eq!(
            decode(&mut buf, ProtocolVersion::V5, 1024),
            Err(DecodeError::TooLarge { size: 4 + 2_097_151, max: 1024 })
        );
        // The limit counts the fixed header: a 10 byte packet fits 10 but not 9.
        let packet = [0xC0, 0x08, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut buf = BytesMut::from(&packet[..2]);
        assert_eq!(decode(&mut buf, ProtocolVersion::V5, 9), Err(DecodeError::TooLarge { size: 10, max: 9 }));
        let mut buf = BytesMut::from(&packet[..2]);
        assert_eq!(decode(&mut buf, ProtocolVersion::V5, 10), Ok(None));
    }

    #[test]
    fn remaining_length_of_five_bytes_is_malformed() {
        assert_malformed(&[0x30, 0x80, 0x80, 0x80, 0x80, 0x01], ProtocolVersion::V5);
        // Four continuation bytes are enough to know, without the fifth.
        assert_malformed(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF], ProtocolVersion::V3_1_1);
    }

    #[test]
    fn packet_size_is_known_once_the_fixed_header_is_complete() {
        assert_eq!(packet_size(&[]).unwrap(), None);
        assert_eq!(packet_size(&[0x10]).unwrap(), None);
        assert_eq!(packet_size(&[0x10, 0x0C, 0x00]).unwrap(), Some(14));
        assert_eq!(packet_size(&[0x10, 0x80]).unwrap(), None);
        assert_eq!(packet_size(&[0x10, 0x80, 0x01]).unwrap(), Some(3 + 128));
        assert!(packet_size(&[0x10, 0xFF, 0xFF, 0xFF, 0xFF]).is_err());
    }

    #[test]
    fn reserved_packet_types_are_malformed() {
        for version in VERSIONS {
            assert_malformed(&[0x00, 0x00], version);
        }
        assert_malformed(&[0xF0, 0x00], ProtocolVersion::V3_1_1);
        assert_malformed(&[0xF0, 0x00], ProtocolVersion::V3_1);
        assert!(decode_one(&[0xF0, 0x00], ProtocolVersion::V5).is_ok());
    }

    #[test]
    fn fixed_header_flags_are_checked() {
        let v = ProtocolVersion::V3_1_1;
        // Packets that need flags 0.
        for first in [0x20, 0x40, 0x50, 0x70, 0x90, 0xB0, 0xC0, 0xD0, 0xE0] {
            for flags in 1..16u8 {
                assert_malformed(&[first | flags, 0x00], v);
            }
        }
        assert_malformed(&[0x11, 0x00], v);
        assert_malformed(&[0xF1, 0x00], ProtocolVersion::V5);
        // Packets that need flags 0b0010.
        for first in [0x60, 0x80, 0xA0] {
            for flags in (0..16u8).filter(|&f| f != 0b0010) {
                assert_malformed(&[first | flags, 0x02, 0x00, 0x01], v);
                assert_malformed(&[first | flags, 0x02, 0x00, 0x01], ProtocolVersion::V5);
            }
        }
        // MQTT 3.1 allows DUP on retried PUBREL / SUBSCRIBE / UNSUBSCRIBE, nothing else.
        assert_eq!(
            decode_one(&[0x6A, 0x02, 0x00, 0x01], ProtocolVersion::V3_1),
            Ok(Packet::PubRel(crate::Ack::new(1)))
        );
        assert_malformed(&[0x6B, 0x02, 0x00, 0x01], ProtocolVersion::V3_1);
        assert_malformed(&[0x68, 0x02, 0x00, 0x01], ProtocolVersion::V3_1);
        assert_malformed(&[0x41, 0x02, 0x00, 0x01], ProtocolVersion::V3_1);
    }

    #[test]
    fn publish_flags_are_checked() {
        // QoS 3.
        for version in VERSIONS {
            assert_malformed(&[0x36, 0x05, 0x00, 0x01, b'a', 0x00, 0x01], version);
        }
        // QoS 0 with DUP.
        assert_malformed(&[0x38, 0x04, 0x00, 0x01, b'a', b'x'], ProtocolVersion::V3_1_1);
        assert_malformed(&[0x38, 0x05, 0x00, 0x01, b'a', 0x00, b'x'], ProtocolVersion::V5);
        let Packet::Publish(p) =
            decode_one(&[0x38, 0x04, 0x00, 0x01, b'a', b'x'], ProtocolVersion::V3_1).unwrap()
        else {
            panic!("not a PUBLISH");
        };
        assert!(p.dup);
    }

    #[test]
    fn decode_takes_one_packet_at_a_time() {
        let mut buf = BytesMut::new();
        let packets = [
            Packet::PingReq,
            Packet::PubAck(crate::Ack::with_reason(7, ReasonCode::NoMatchingSubscribers)),
            Packet::PingResp,
        ];
        for packet in &packets {
            encode(packet, ProtocolVersion::V5, &mut buf).unwrap();
        }
        buf.extend_from_slice(&[0x30]);
        for packet in &packets {
            assert_eq!(decode(&mut buf, ProtocolVersion::V5, u32::MAX).unwrap().as_ref(), Some(packet));
        }
        assert_eq!(decode(&mut buf, ProtocolVersion::V5, u32::MAX), Ok(None));
        assert_eq!(&buf[..], [0x30]);
    }

    #[test]
    fn encode_appends_and_reserves_exactly() {
        let mut buf = BytesMut::from(&b"xy"[..]);
        encode(&Packet::PingReq, ProtocolVersion::V5, &mut buf).unwrap();
        assert_eq!(&buf[..], [b'x', b'y', 0xC0, 0x00]);
    }

    #[test]
    fn encode_errors_leave_the_buffer_untouched() {
        let auth = Packet::Auth(crate::Auth {
            reason: ReasonCode::Success,
            properties: crate::Properties::default(),
        });
        for version in [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1] {
            let mut buf = BytesMut::from(&b"x"[..]);
            assert_eq!(encode(&auth, version, &mut buf), Err(EncodeError::Unsupported));
            assert_eq!(&buf[..], b"x");
        }
        let long = crate::ByteString::from("a".repeat(65_536));
        let publish = Packet::Publish(crate::Publish { topic: long, ..Default::default() });
        let mut buf = BytesMut::from(&b"x"[..]);
        assert_eq!(encode(&publish, ProtocolVersion::V5, &mut buf), Err(EncodeError::FieldTooLong));
        assert_eq!(&buf[..], b"x");
    }

    #[test]
    fn encode_rejects_remaining_length_over_the_maximum() {
        let publish = Packet::Publish(crate::Publish {
            topic: "t".into(),
            payload: bytes::Bytes::from(vec![0u8; MAX_VARINT]),
            ..Default::default()
        });
        let mut buf = BytesMut::new();
        assert_eq!(encode(&publish, ProtocolVersion::V3_1_1, &mut buf), Err(EncodeError::TooLarge));
        assert!(buf.is_empty());
    }
}
