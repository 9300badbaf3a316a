//! SUBSCRIBE, SUBACK, UNSUBSCRIBE and UNSUBACK: a Packet Identifier, v5 properties, then a
//! list (of filters, or of reason codes).

use bytes::{BufMut, BytesMut};

use super::primitives::{prefixed_len, put_prefixed, Reader};
use super::properties::{read_v5_properties, v5_properties_len, write_v5_properties, Context};
use super::Body;
use crate::{
    DecodeError, EncodeError, Properties, ProtocolVersion, QoS, ReasonCode, RetainHandling, SubAck,
    Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe,
};

/// Reads the Packet Identifier and (v5) properties that start all four packets.
fn read_header(
    r: &mut Reader,
    version: ProtocolVersion,
    ctx: Context,
) -> Result<(u16, Properties), DecodeError> {
    let packet_id = r.packet_id()?;
    let properties = read_v5_properties(r, version, ctx)?;
    Ok((packet_id, properties))
}

/// Bytes of the Packet Identifier and (v5) properties.
fn header_len(properties: &Properties, version: ProtocolVersion, ctx: Context) -> usize {
    2 + v5_properties_len(properties, version, ctx)
}

/// Writes the Packet Identifier and (v5) properties.
fn write_header(
    packet_id: u16,
    properties: &Properties,
    version: ProtocolVersion,
    ctx: Context,
    buf: &mut BytesMut,
) -> Result<(), EncodeError> {
    buf.put_u16(packet_id);
    write_v5_properties(properties, version, ctx, buf)
}

/// Reads `item`s up to the end of the packet; an empty list is a Protocol error.
fn read_list<T>(
    r: &mut Reader,
    mut item: impl FnMut(&mut Reader) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    let mut items = Vec::new();
    while !r.is_empty() {
        items.push(item(r)?);
    }
    if items.is_empty() {
        return Err(DecodeError::Protocol("empty topic filter or reason code list"));
    }
    Ok(items)
}

/// Decodes a Subscription Options byte. v5 uses bits 0-5 (QoS, No Local, Retain As
/// Published, Retain Handling), 3.1.x only the QoS bits; the others must be 0.
fn decode_options(byte: u8, version: ProtocolVersion) -> Result<SubscriptionOptions, DecodeError> {
    let reserved = if version.is_v5() { 0b1100_0000 } else { 0b1111_1100 };
    if byte & reserved != 0 {
        return Err(DecodeError::Malformed("reserved subscription option bits set"));
    }
    let qos = QoS::from_u8(byte & 0b11).ok_or(DecodeError::Malformed("subscription QoS 3"))?;
    let retain_handling = match (byte >> 4) & 0b11 {
        0 => RetainHandling::SendAtSubscribe,
        1 => RetainHandling::SendIfNew,
        2 => RetainHandling::DoNotSend,
        _ => return Err(DecodeError::Malformed("retain handling 3")),
    };
    Ok(SubscriptionOptions {
        qos,
        no_local: byte & 0b0100 != 0,
        retain_as_published: byte & 0b1000 != 0,
        retain_handling,
    })
}

/// The Subscription Options byte; 3.1.x carries only the QoS.
fn encode_options(options: &SubscriptionOptions, version: ProtocolVersion) -> u8 {
    let qos = options.qos as u8;
    if !version.is_v5() {
        return qos;
    }
    qos | u8::from(options.no_local) << 2
        | u8::from(options.retain_as_published) << 3
        | (options.retain_handling as u8) << 4
}

/// The 3.1.x SUBACK return code: the granted QoS, or 0x80 for any failure.
fn v3_suback_code(reason: ReasonCode) -> u8 {
    match reason {
        ReasonCode::Success => 0,
        ReasonCode::GrantedQoS1 => 1,
        ReasonCode::GrantedQoS2 => 2,
        _ => 0x80,
    }
}

/// The reason code for a 3.1.x SUBACK return code; 0x80 is Unspecified error.
fn v3_suback_reason(code: u8) -> Result<ReasonCode, DecodeError> {
    match code {
        0 => Ok(ReasonCode::Success),
        1 => Ok(ReasonCode::GrantedQoS1),
        2 => Ok(ReasonCode::GrantedQoS2),
        0x80 => Ok(ReasonCode::UnspecifiedError),
        _ => Err(DecodeError::Malformed("unknown SUBACK return code")),
    }
}

/// Decodes the body of a SUBSCRIBE: at least one filter, each with its options byte. The
/// filters' syntax is left to the broker, which answers invalid ones in SUBACK.
pub(super) fn decode_subscribe(mut r: Reader, version: ProtocolVersion) -> Result<Subscribe, DecodeError> {
    let (packet_id, properties) = read_header(&mut r, version, Context::Subscribe)?;
    let filters = read_list(&mut r, |r| {
        let filter = r.string()?;
        let options = decode_options(r.u8()?, version)?;
        Ok((filter, options))
    })?;
    Ok(Subscribe { packet_id, properties, filters })
}

/// Decodes the body of a SUBACK: at least one reason code.
pub(super) fn decode_suback(mut r: Reader, version: ProtocolVersion) -> Result<SubAck, DecodeError> {
    let (packet_id, properties) = read_header(&mut r, version, Context::SubAck)?;
    let reasons = if version.is_v5() {
        read_list(&mut r, Reader::reason)?
    } else {
        read_list(&mut r, |r| v3_suback_reason(r.u8()?))?
    };
    Ok(SubAck { packet_id, properties, reasons })
}

/// Decodes the body of an UNSUBSCRIBE: at least one filter.
pub(super) fn decode_unsubscribe(
    mut r: Reader,
    version: ProtocolVersion,
) -> Result<Unsubscribe, DecodeError> {
    let (packet_id, properties) = read_header(&mut r, version, Context::Unsubscribe)?;
    let filters = read_list(&mut r, Reader::string)?;
    Ok(Unsubscribe { packet_id, properties, filters })
}

/// Decodes the body of an UNSUBACK: v5 has at least one reason code, 3.1.x nothing after the
/// Packet Identifier.
pub(super) fn decode_unsuback(mut r: Reader, version: ProtocolVersion) -> Result<UnsubAck, DecodeError> {
    let (packet_id, properties) = read_header(&mut r, version, Context::UnsubAck)?;
    let reasons = if version.is_v5() {
        read_list(&mut r, Reader::reason)?
    } else {
        r.finish()?;
        Vec::new()
    };
    Ok(UnsubAck { packet_id, properties, reasons })
}

impl Body for Subscribe {
    fn body_len(&self, version: ProtocolVersion) -> usize {
        let filters: usize = self.filters.iter().map(|(f, _)| prefixed_len(f.len()) + 1).sum();
        header_len(&self.properties, version, Context::Subscribe) + filters
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        write_header(self.packet_id, &self.properties, version, Context::Subscribe, buf)?;
        for (filter, options) in &self.filters {
            put_prefixed(buf, filter.as_bytes())?;
            buf.put_u8(encode_options(options, version));
        }
        Ok(())
    }
}

impl Body for SubAck {
    fn body_len(&self, version: ProtocolVersion) -> usize {
        header_len(&self.properties, version, Context::SubAck) + self.reasons.len()
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        write_header(self.packet_id, &self.properties, version, Context::SubAck, buf)?;
        for &reason in &self.reasons {
            buf.put_u8(if version.is_v5() { reason as u8 } else { v3_suback_code(reason) });
        }
        Ok(())
    }
}

impl Body for Unsubscribe {
    fn body_len(&self, version: ProtocolVersion) -> usize {
        let filters: usize = self.filters.iter().map(|f| prefixed_len(f.len())).sum();
        header_len(&self.properties, version, Context::Unsubscribe) + filters
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        write_header(self.packet_id, &self.properties, version, Context::Unsubscribe, buf)?;
        for filter in &self.filters {
            put_prefixed(buf, filter.as_bytes())?;
        }
        Ok(())
    }
}

impl Body for UnsubAck {
    fn body_len(&self, version: ProtocolVersion) -> usize {
        let reasons = if version.is_v5() { self.reasons.len() } else { 0 };
        header_len(&self.properties, version, Context::UnsubAck) + reasons
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        write_header(self.packet_id, &self.properties, version, Context::UnsubAck, buf)?;
        if version.is_v5() {
            for &reason in &self.reasons {
                buf.put_u8(reason as u8);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::{
        Packet, Properties, ProtocolVersion, QoS, ReasonCode, RetainHandling, SubAck, Subscribe,
        SubscriptionOptions, UnsubAck, Unsubscribe,
    };

    const V3_1: ProtocolVersion = ProtocolVersion::V3_1;
    const V3_1_1: ProtocolVersion = ProtocolVersion::V3_1_1;
    const V5: ProtocolVersion = ProtocolVersion::V5;

    fn options(qos: QoS) -> SubscriptionOptions {
        SubscriptionOptions { qos, ..SubscriptionOptions::default() }
    }

    fn rich_options() -> SubscriptionOptions {
        SubscriptionOptions {
            qos: QoS::ExactlyOnce,
            no_local: true,
            retain_as_published: true,
            retain_handling: RetainHandling::DoNotSend,
        }
    }

    fn subscribe(properties: Properties, rich: SubscriptionOptions) -> Packet {
        Packet::Subscribe(Subscribe {
            packet_id: 10,
            properties,
            filters: vec![
                ("a/b".into(), options(QoS::AtLeastOnce)),
                ("$share/g/#".into(), rich),
                (
                    "+/é".into(),
                    SubscriptionOptions {
                        retain_handling: RetainHandling::SendIfNew,
                        ..options(QoS::AtMostOnce)
                    },
                ),
            ],
        })
    }

    #[test]
    fn subscribe_known_bytes() {
        let packet = Packet::Subscribe(Subscribe {
            packet_id: 10,
            properties: Properties::default(),
            filters: vec![("a/b".into(), options(QoS::AtLeastOnce)), ("c".into(), options(QoS::ExactlyOnce))],
        });
        let v3 = [0x82, 0x0C, 0x00, 0x0A, 0x00, 0x03, b'a', b'/', b'b', 0x01, 0x00, 0x01, b'c', 0x02];
        assert_eq!(round_trip(&packet, V3_1_1), v3);
        let packet = Packet::Subscribe(Subscribe {
            packet_id: 10,
            properties: Properties::from(crate::PropertyValues {
                subscription_identifiers: vec![300],
                ..Default::default()
            }),
            filters: vec![("a/b".into(), rich_options())],
        });
        let v5 = [0x82, 0x0C, 0x00, 0x0A, 0x03, 0x0B, 0xAC, 0x02, 0x00, 0x03, b'a', b'/', b'b', 0x2E];
        assert_eq!(round_trip(&packet, V5), v5);
    }

    #[test]
    fn subscribe_round_trips() {
        // v5 keeps every option and one Subscription Identifier.
        round_trip_as(
            &subscribe(all_properties(), rich_options()),
            V5,
            &subscribe(allowed::subscribe(), rich_options()),
        );
        // 3.1.x keeps only the QoS.
        for version in [V3_1, V3_1_1] {
            let bytes = round_trip_as(
                &subscribe(all_properties(), rich_options()),
                version,
                &Packet::Subscribe(Subscribe {
                    packet_id: 10,
                    properties: Properties::default(),
                    filters: vec![
                        ("a/b".into(), options(QoS::AtLeastOnce)),
                        ("$share/g/#".into(), options(QoS::ExactlyOnce)),
                        ("+/é".into(), options(QoS::AtMostOnce)),
                    ],
                }),
            );
            assert_eq!(bytes[0], 0x82);
        }
    }

    #[test]
    fn subscribe_is_checked() {
        for version in [V3_1, V3_1_1] {
            // No filter.
            assert_protocol(&[0x82, 0x02, 0x00, 0x01], version);
            // Packet identifier 0.
            assert_protocol(&[0x82, 0x06, 0x00, 0x00, 0x00, 0x01, b'a', 0x00], version);
            // Options byte: bits 2-7 reserved, QoS 3.
            for byte in [0x03, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80] {
                assert_malformed(&[0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', byte], version);
            }
            // Missing options byte, invalid UTF-8 filter.
            assert_malformed(&[0x82, 0x05, 0x00, 0x01, 0x00, 0x01, b'a'], version);
            assert_malformed(&[0x82, 0x06, 0x00, 0x01, 0x00, 0x01, 0xFF, 0x00], version);
        }
        assert_protocol(&[0x82, 0x03, 0x00, 0x01, 0x00], V5);
        assert_protocol(&[0x82, 0x07, 0x00, 0x00, 0x00, 0x00, 0x01, b'a', 0x00], V5);
        // v5 options: bits 6-7 reserved, QoS 3, Retain Handling 3.
        for byte in [0x40, 0x80, 0x03, 0x30] {
            assert_malformed(&[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', byte], V5);
        }
        assert!(decode_one(&[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0x2E], V5).is_ok());
        // Subscription Identifier: once only, not 0.
        assert_protocol(&[0x82, 0x0B, 0x00, 0x01, 0x04, 0x0B, 0x01, 0x0B, 0x02, 0x00, 0x01, b'a', 0x00], V5);
        assert_protocol(&[0x82, 0x09, 0x00, 0x01, 0x02, 0x0B, 0x00, 0x00, 0x01, b'a', 0x00], V5);
        // Subscription Identifier of five bytes.
        assert_malformed(
            &[0x82, 0x0C, 0x00, 0x01, 0x05, 0x0B, 0x80, 0x80, 0x80, 0x80, 0x00, 0x01, b'a', 0x00],
            V5,
        );
        // Reason String is not allowed in SUBSCRIBE.
        assert_protocol(&[0x82, 0x0A, 0x00, 0x01, 0x03, 0x1F, 0x00, 0x00, 0x00, 0x01, b'a', 0x00], V5);
    }

    fn suback(properties: Properties, reasons: Vec<ReasonCode>) -> Packet {
        Packet::SubAck(SubAck { packet_id: 10, properties, reasons })
    }

    #[test]
    fn suback_known_bytes() {
        use ReasonCode::*;
        // The 3.1.1 spec's example: granted QoS 0, 1, 2 and a failure.
        let v3 = [0x90, 0x06, 0x00, 0x0A, 0x00, 0x01, 0x02, 0x80];
        let packet = suback(Properties::default(), vec![Success, GrantedQoS1, GrantedQoS2, UnspecifiedError]);
        assert_eq!(round_trip(&packet, V3_1_1), v3);
        let v5 = [0x90, 0x07, 0x00, 0x0A, 0x00, 0x00, 0x01, 0x02, 0x80];
        assert_eq!(round_trip(&packet, V5), v5);
        let packet = suback(Properties::default(), vec![GrantedQoS1, NotAuthorized, TopicFilterInvalid]);
        assert_eq!(round_trip(&packet, V5), [0x90, 0x06, 0x00, 0x0A, 0x00, 0x01, 0x87, 0x8F]);
    }

    #[test]
    fn suback_round_trips() {
        use ReasonCode::*;
        let reasons = vec![
            Success,
            GrantedQoS1,
            GrantedQoS2,
            NotAuthorized,
            QuotaExceeded,
            SharedSubscriptionsNotSupported,
        ];
        round_trip_as(
            &suback(all_properties(), reasons.clone()),
            V5,
            &suback(allowed::ack(), reasons.clone()),
        );
        // 3.1.x: every failure is 0x80, which decodes as Unspecified error.
        let v3 =
            vec![Success, GrantedQoS1, GrantedQoS2, UnspecifiedError, UnspecifiedError, UnspecifiedError];
        for version in [V3_1, V3_1_1] {
            let bytes = round_trip_as(
                &suback(all_properties(), reasons.clone()),
                version,
                &suback(Properties::default(), v3.clone()),
            );
            assert_eq!(bytes[4..], [0x00, 0x01, 0x02, 0x80, 0x80, 0x80]);
        }
    }

    #[test]
    fn suback_is_checked() {
        assert_malformed(&[0x90, 0x03, 0x00, 0x01, 0x03], V3_1_1);
        assert_malformed(&[0x90, 0x03, 0x00, 0x01, 0x87], V3_1_1);
        assert_malformed(&[0x90, 0x04, 0x00, 0x01, 0x00, 0x03], V5);
        assert_protocol(&[0x90, 0x02, 0x00, 0x01], V3_1_1);
        assert_protocol(&[0x90, 0x03, 0x00, 0x01, 0x00], V5);
        assert_protocol(&[0x90, 0x03, 0x00, 0x00, 0x00], V3_1_1);
    }

    fn unsubscribe(properties: Properties) -> Packet {
        Packet::Unsubscribe(Unsubscribe { packet_id: 7, properties, filters: vec!["a/b".into(), "#".into()] })
    }

    #[test]
    fn unsubscribe_round_trips_and_checks() {
        let v3 = [0xA2, 0x0A, 0x00, 0x07, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x01, b'#'];
        for version in [V3_1, V3_1_1] {
            assert_eq!(
                round_trip_as(&unsubscribe(all_properties()), version, &unsubscribe(Properties::default())),
                v3
            );
        }
        round_trip_as(&unsubscribe(all_properties()), V5, &unsubscribe(allowed::unsubscribe()));
        assert_protocol(&[0xA2, 0x02, 0x00, 0x01], V3_1_1);
        assert_protocol(&[0xA2, 0x03, 0x00, 0x01, 0x00], V5);
        assert_protocol(&[0xA2, 0x05, 0x00, 0x00, 0x00, 0x01, b'a'], V3_1_1);
        assert_malformed(&[0xA2, 0x05, 0x00, 0x01, 0x00, 0x02, b'a'], V3_1_1);
        // Subscription Identifier is not allowed in UNSUBSCRIBE.
        assert_protocol(&[0xA2, 0x08, 0x00, 0x01, 0x02, 0x0B, 0x01, 0x00, 0x01, b'a'], V5);
    }

    fn unsuback(properties: Properties, reasons: Vec<ReasonCode>) -> Packet {
        Packet::UnsubAck(UnsubAck { packet_id: 7, properties, reasons })
    }

    #[test]
    fn unsuback_round_trips_and_checks() {
        let reasons = vec![ReasonCode::Success, ReasonCode::NoSubscriptionExisted, ReasonCode::NotAuthorized];
        for version in [V3_1, V3_1_1] {
            let bytes = round_trip_as(
                &unsuback(all_properties(), reasons.clone()),
                version,
                &unsuback(Properties::default(), vec![]),
            );
            assert_eq!(bytes, [0xB0, 0x02, 0x00, 0x07]);
        }
        round_trip_as(
            &unsuback(all_properties(), reasons.clone()),
            V5,
            &unsuback(allowed::ack(), reasons.clone()),
        );
        assert_eq!(
            round_trip(&unsuback(Properties::default(), reasons), V5),
            [0xB0, 0x06, 0x00, 0x07, 0x00, 0x00, 0x11, 0x87]
        );
        assert_malformed(&[0xB0, 0x03, 0x00, 0x07, 0x00], V3_1_1);
        assert_protocol(&[0xB0, 0x03, 0x00, 0x07, 0x00], V5);
        assert_malformed(&[0xB0, 0x04, 0x00, 0x07, 0x00, 0x12], V5);
    }
}
