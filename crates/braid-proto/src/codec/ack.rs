//! PUBACK, PUBREC, PUBREL and PUBCOMP ([`Ack`]), and the v5 "reason code, then properties"
//! tail they share with DISCONNECT and AUTH, including its short forms.

use bytes::{BufMut, BytesMut};

use super::primitives::{varint_len, Reader};
use super::properties::{properties_len, read_properties, write_properties, Context};
use super::Body;
use crate::{Ack, DecodeError, EncodeError, Properties, ProtocolVersion, ReasonCode};

/// The v5 tail of an ack, DISCONNECT or AUTH: a reason code and properties, either of which
/// may be left out. With Success and no properties the tail is empty; with another reason and
/// no properties it is the reason byte alone when `reason_only` allows it (acks and
/// DISCONNECT), and the reason plus a zero Property Length otherwise (AUTH).
pub(super) struct Tail<'a> {
    /// Reason code.
    pub(super) reason: ReasonCode,
    /// Properties, of which those allowed in `ctx` are written.
    pub(super) properties: &'a Properties,
    /// The packet the tail belongs to.
    pub(super) ctx: Context,
    /// Whether the packet has the "reason code without Property Length" form.
    pub(super) reason_only: bool,
}

/// The three layouts of a [`Tail`].
enum Form {
    /// Nothing: Success without properties.
    Empty,
    /// The reason code alone.
    ReasonOnly,
    /// The reason code, then the properties block with this Property Length.
    Full(usize),
}

impl Tail<'_> {
    fn form(&self) -> Form {
        let props_len = properties_len(self.properties, self.ctx);
        if props_len > 0 || (self.reason != ReasonCode::Success && !self.reason_only) {
            Form::Full(props_len)
        } else if self.reason != ReasonCode::Success {
            Form::ReasonOnly
        } else {
            Form::Empty
        }
    }

    /// Bytes the tail takes.
    pub(super) fn len(&self) -> usize {
        match self.form() {
            Form::Empty => 0,
            Form::ReasonOnly => 1,
            Form::Full(props_len) => 1 + varint_len(props_len) + props_len,
        }
    }

    /// Writes the tail.
    pub(super) fn write(&self, buf: &mut BytesMut) -> Result<(), EncodeError> {
        match self.form() {
            Form::Empty => Ok(()),
            Form::ReasonOnly => {
                buf.put_u8(self.reason as u8);
                Ok(())
            }
            Form::Full(_) => {
                buf.put_u8(self.reason as u8);
                write_properties(self.properties, self.ctx, buf)
            }
        }
    }

    /// Reads a tail that runs to the end of the packet: nothing means Success, one byte is the
    /// reason alone.
    pub(super) fn read(r: &mut Reader, ctx: Context) -> Result<(ReasonCode, Properties), DecodeError> {
        if r.is_empty() {
            return Ok((ReasonCode::Success, Properties::default()));
        }
        let reason = r.reason()?;
        let properties = if r.is_empty() { Properties::default() } else { read_properties(r, ctx)? };
        r.finish()?;
        Ok((reason, properties))
    }
}

/// Decodes the body of PUBACK, PUBREC, PUBREL or PUBCOMP. In 3.1.x the body is exactly the
/// Packet Identifier; v5 adds the optional tail.
pub(super) fn decode_ack(mut r: Reader, version: ProtocolVersion) -> Result<Ack, DecodeError> {
    let packet_id = r.packet_id()?;
    if !version.is_v5() {
        r.finish()?;
        return Ok(Ack::new(packet_id));
    }
    let (reason, properties) = Tail::read(&mut r, Context::Ack)?;
    Ok(Ack { packet_id, reason, properties })
}

impl Ack {
    fn tail(&self) -> Tail<'_> {
        Tail { reason: self.reason, properties: &self.properties, ctx: Context::Ack, reason_only: true }
    }
}

impl Body for Ack {
    fn body_len(&self, version: ProtocolVersion) -> usize {
        2 + if version.is_v5() { self.tail().len() } else { 0 }
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        buf.put_u16(self.packet_id);
        if version.is_v5() {
            self.tail().write(buf)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::{Ack, Packet, Properties, ProtocolVersion, ReasonCode};

    const V5: ProtocolVersion = ProtocolVersion::V5;

    fn all_kinds(ack: Ack) -> [Packet; 4] {
        [
            Packet::PubAck(ack.clone()),
            Packet::PubRec(ack.clone()),
            Packet::PubRel(ack.clone()),
            Packet::PubComp(ack),
        ]
    }

    #[test]
    fn round_trip_every_ack_in_every_version() {
        let full = Ack {
            packet_id: 0xBEEF,
            reason: ReasonCode::PacketIdentifierNotFound,
            properties: all_properties(),
        };
        let full_v5 = Ack { properties: allowed::ack(), ..full.clone() };
        for (packet, expected) in all_kinds(full.clone()).iter().zip(all_kinds(full_v5)) {
            round_trip_as(packet, V5, &expected);
        }
        for version in [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1] {
            for (packet, expected) in all_kinds(full.clone()).iter().zip(all_kinds(Ack::new(0xBEEF))) {
                let bytes = round_trip_as(packet, version, &expected);
                assert_eq!(bytes.len(), 4);
            }
        }
        for version in [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1, V5] {
            for packet in all_kinds(Ack::new(1)) {
                round_trip(&packet, version);
            }
        }
    }

    #[test]
    fn known_bytes_and_short_forms() {
        for version in [ProtocolVersion::V3_1_1, V5] {
            assert_eq!(encode_to_vec(&Packet::PubAck(Ack::new(1)), version), [0x40, 0x02, 0x00, 0x01]);
            assert_eq!(encode_to_vec(&Packet::PubRec(Ack::new(2)), version), [0x50, 0x02, 0x00, 0x02]);
            assert_eq!(encode_to_vec(&Packet::PubRel(Ack::new(3)), version), [0x62, 0x02, 0x00, 0x03]);
            assert_eq!(encode_to_vec(&Packet::PubComp(Ack::new(4)), version), [0x70, 0x02, 0x00, 0x04]);
        }
        // Reason without properties: remaining length 3.
        let ack = Ack::with_reason(1, ReasonCode::NoMatchingSubscribers);
        assert_eq!(encode_to_vec(&Packet::PubAck(ack.clone()), V5), [0x40, 0x03, 0x00, 0x01, 0x10]);
        assert_eq!(decode_one(&[0x40, 0x03, 0x00, 0x01, 0x10], V5), Ok(Packet::PubAck(ack.clone())));
        // The long forms decode to the same packets.
        assert_eq!(decode_one(&[0x40, 0x04, 0x00, 0x01, 0x10, 0x00], V5), Ok(Packet::PubAck(ack)));
        assert_eq!(decode_one(&[0x40, 0x04, 0x00, 0x01, 0x00, 0x00], V5), Ok(Packet::PubAck(Ack::new(1))));
        // Properties only written with success: the reason byte cannot be dropped.
        let ack = Ack {
            packet_id: 1,
            reason: ReasonCode::Success,
            properties: Properties::from(crate::PropertyValues {
                reason_string: Some("ok".into()),
                ..Default::default()
            }),
        };
        assert_eq!(
            encode_to_vec(&Packet::PubComp(ack), V5),
            [0x70, 0x09, 0x00, 0x01, 0x00, 0x05, 0x1F, 0x00, 0x02, b'o', b'k']
        );
        // Properties not allowed in an ack are not written: still the short form.
        let ack = Ack {
            packet_id: 1,
            reason: ReasonCode::Success,
            properties: Properties::from(crate::PropertyValues {
                topic_alias: Some(1),
                ..Default::default()
            }),
        };
        assert_eq!(encode_to_vec(&Packet::PubAck(ack), V5), [0x40, 0x02, 0x00, 0x01]);
    }

    #[test]
    fn invalid_acks_are_rejected() {
        for version in [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1, V5] {
            assert_malformed(&[0x40, 0x00], version);
            assert_malformed(&[0x40, 0x01, 0x00], version);
            assert_protocol(&[0x40, 0x02, 0x00, 0x00], version);
            assert_protocol(&[0x62, 0x02, 0x00, 0x00], version);
        }
        // 3.1.x acks are exactly two bytes.
        assert_malformed(&[0x40, 0x03, 0x00, 0x01, 0x00], ProtocolVersion::V3_1_1);
        // Unknown reason code.
        assert_malformed(&[0x40, 0x03, 0x00, 0x01, 0x05], V5);
        // Property Length beyond the packet.
        assert_malformed(&[0x40, 0x05, 0x00, 0x01, 0x00, 0x03, 0x1F], V5);
        // Trailing bytes after the properties.
        assert_malformed(&[0x40, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00], V5);
        // Topic Alias is not allowed in an ack.
        assert_protocol(&[0x50, 0x07, 0x00, 0x01, 0x00, 0x03, 0x23, 0x00, 0x01], V5);
        // Reason String twice.
        assert_protocol(&[0x40, 0x0A, 0x00, 0x01, 0x00, 0x06, 0x1F, 0x00, 0x00, 0x1F, 0x00, 0x00], V5);
        // User Property may repeat.
        assert!(
            decode_one(&[0x40, 0x0E, 0x00, 0x01, 0x00, 0x0A, 0x26, 0, 0, 0, 0, 0x26, 0, 0, 0, 0], V5).is_ok()
        );
    }
}
