//! PUBLISH: topic name, Packet Identifier (QoS 1 and 2), v5 properties, then the payload.
//! Encoding is on the hot path (once per delivery): two length passes over the properties and
//! straight writes, no allocation besides the one reservation in [`super::encode`].

use bytes::{BufMut, BytesMut};

use super::primitives::{prefixed_len, put_prefixed, Reader};
use super::properties::{read_v5_properties, v5_properties_len, write_v5_properties, Context};
use super::{Body, PublishFlags};
use crate::topic::valid_topic_name;
use crate::{DecodeError, EncodeError, ProtocolVersion, Publish, PublishView, QoS};

/// Decodes the body of a PUBLISH whose fixed header carried `flags`.
///
/// A topic name with wildcards is [`DecodeError::TopicNameInvalid`], and so is an empty one,
/// except in v5 with a Topic Alias property. QoS 1 and 2 need a non-zero Packet Identifier.
pub(super) fn decode_publish(
    flags: PublishFlags,
    mut r: Reader,
    version: ProtocolVersion,
) -> Result<Publish, DecodeError> {
    let topic = r.string()?;
    if !(topic.is_empty() || valid_topic_name(&topic)) {
        return Err(DecodeError::TopicNameInvalid);
    }
    let packet_id = if flags.qos == QoS::AtMostOnce { 0 } else { r.packet_id()? };
    let properties = read_v5_properties(&mut r, version, Context::Publish)?;
    if topic.is_empty() && properties.topic_alias.is_none() {
        return Err(DecodeError::TopicNameInvalid);
    }
    Ok(Publish {
        dup: flags.dup,
        qos: flags.qos,
        retain: flags.retain,
        topic,
        packet_id,
        properties,
        payload: r.rest(),
    })
}

impl Body for Publish {
    fn body_len(&self, version: ProtocolVersion) -> usize {
        self.view().body_len(version)
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        self.view().write_body(version, buf)
    }
}

impl Body for PublishView<'_> {
    fn body_len(&self, version: ProtocolVersion) -> usize {
        let packet_id = if self.qos == QoS::AtMostOnce { 0 } else { 2 };
        let properties = v5_properties_len(self.properties, version, Context::Publish);
        prefixed_len(self.topic.len()) + packet_id + properties + self.payload.len()
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        put_prefixed(buf, self.topic.as_bytes())?;
        if self.qos != QoS::AtMostOnce {
            buf.put_u16(self.packet_id);
        }
        write_v5_properties(self.properties, version, Context::Publish, buf)?;
        buf.put_slice(self.payload);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};

    use super::super::test_util::*;
    use crate::{DecodeError, Packet, Properties, ProtocolVersion, Publish, QoS};

    const V3_1: ProtocolVersion = ProtocolVersion::V3_1;
    const V3_1_1: ProtocolVersion = ProtocolVersion::V3_1_1;
    const V5: ProtocolVersion = ProtocolVersion::V5;
    const VERSIONS: [ProtocolVersion; 3] = [V3_1, V3_1_1, V5];

    fn publish(qos: QoS, packet_id: u16, properties: Properties) -> Publish {
        Publish {
            dup: qos != QoS::AtMostOnce,
            qos,
            retain: true,
            topic: "sport/tennis/ü".into(),
            packet_id,
            properties,
            payload: Bytes::from_static(b"\x00\x01payload\xFF"),
        }
    }

    #[test]
    fn known_bytes() {
        let qos0 = Publish { topic: "a/b".into(), payload: Bytes::from_static(b"hi"), ..Publish::default() };
        let bytes = [0x30, 0x07, 0x00, 0x03, b'a', b'/', b'b', b'h', b'i'];
        assert_eq!(round_trip(&Packet::Publish(qos0.clone()), V3_1_1), bytes);
        let bytes = [0x30, 0x08, 0x00, 0x03, b'a', b'/', b'b', 0x00, b'h', b'i'];
        assert_eq!(round_trip(&Packet::Publish(qos0.clone()), V5), bytes);

        let qos1 = Publish { qos: QoS::AtLeastOnce, packet_id: 10, retain: true, ..qos0.clone() };
        let bytes = [0x33, 0x09, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x0A, b'h', b'i'];
        assert_eq!(round_trip(&Packet::Publish(qos1), V3_1_1), bytes);

        let aliased = Publish {
            qos: QoS::ExactlyOnce,
            packet_id: 10,
            dup: true,
            properties: Properties::from(crate::PropertyValues {
                topic_alias: Some(5),
                ..Default::default()
            }),
            ..qos0
        };
        let bytes =
            [0x3C, 0x0D, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x0A, 0x03, 0x23, 0x00, 0x05, b'h', b'i'];
        assert_eq!(round_trip(&Packet::Publish(aliased), V5), bytes);
    }

    #[test]
    fn round_trip_every_version_and_qos() {
        for version in VERSIONS {
            for (qos, id) in [(QoS::AtMostOnce, 0), (QoS::AtLeastOnce, 1), (QoS::ExactlyOnce, 0xFFFF)] {
                let plain = Packet::Publish(publish(qos, id, Properties::default()));
                round_trip(&plain, version);
                let expected = if version.is_v5() { allowed::publish() } else { Properties::default() };
                round_trip_as(
                    &Packet::Publish(publish(qos, id, all_properties())),
                    version,
                    &Packet::Publish(publish(qos, id, expected)),
                );
            }
            let empty_payload = Publish { topic: "t".into(), ..Publish::default() };
            round_trip(&Packet::Publish(empty_payload), version);
        }
    }

    #[test]
    fn a_view_encodes_as_its_publish() {
        for version in VERSIONS {
            for (qos, id) in [(QoS::AtMostOnce, 0), (QoS::AtLeastOnce, 1), (QoS::ExactlyOnce, 0xFFFF)] {
                let p = publish(
                    qos,
                    id,
                    if version.is_v5() { allowed::publish() } else { Properties::default() },
                );
                let (mut from_packet, mut from_view) = (BytesMut::new(), BytesMut::new());
                crate::encode(&Packet::Publish(p.clone()), version, &mut from_packet).unwrap();
                crate::encode_publish(&p.view(), version, &mut from_view).unwrap();
                assert_eq!(from_view, from_packet);
                assert_eq!(p.view().encoded_len(version), from_view.len());
            }
        }
    }

    #[test]
    fn topic_and_payload_are_slices_of_the_buffer() {
        let bytes = encode_to_vec(&Packet::Publish(publish(QoS::AtLeastOnce, 1, all_properties())), V5);
        let mut buf = BytesMut::from(&bytes[..]);
        let start = buf.as_ptr() as usize;
        let end = start + buf.len();
        let Some(Packet::Publish(p)) = super::super::decode(&mut buf, V5, u32::MAX).unwrap() else {
            panic!("not a PUBLISH");
        };
        for ptr in [
            p.topic.as_bytes().as_ptr(),
            p.payload.as_ptr(),
            p.properties.content_type.as_ref().unwrap().as_bytes().as_ptr(),
            p.properties.correlation_data.as_ref().unwrap().as_ptr(),
        ] {
            assert!((start..end).contains(&(ptr as usize)), "copied");
        }
    }

    #[test]
    fn topic_names_are_checked() {
        for version in VERSIONS {
            for topic in [&b"a/+"[..], b"+", b"#", b"a/#", b"a+b"] {
                let mut body = vec![0x00, u8::try_from(topic.len()).unwrap()];
                body.extend_from_slice(topic);
                if version.is_v5() {
                    body.push(0x00);
                }
                assert_eq!(
                    decode_one(&frame(0x30, &body), version),
                    Err(DecodeError::TopicNameInvalid),
                    "{topic:?}"
                );
            }
            // Invalid UTF-8 and U+0000.
            assert_malformed(&[0x30, 0x04, 0x00, 0x02, 0xC3, 0x28], version);
            assert_malformed(&[0x30, 0x04, 0x00, 0x02, b'a', 0x00], version);
            // Topic longer than the packet.
            assert_malformed(&[0x30, 0x03, 0x00, 0x05, b'a'], version);
        }
    }

    #[test]
    fn empty_topic_needs_a_topic_alias() {
        for version in [V3_1, V3_1_1] {
            assert_eq!(
                decode_one(&[0x30, 0x03, 0x00, 0x00, b'x'], version),
                Err(DecodeError::TopicNameInvalid)
            );
        }
        assert_eq!(decode_one(&[0x30, 0x04, 0x00, 0x00, 0x00, b'x'], V5), Err(DecodeError::TopicNameInvalid));
        let aliased = Publish {
            topic: "".into(),
            properties: Properties::from(crate::PropertyValues {
                topic_alias: Some(1),
                ..Default::default()
            }),
            payload: Bytes::from_static(b"x"),
            ..Publish::default()
        };
        assert_eq!(
            round_trip(&Packet::Publish(aliased), V5),
            [0x30, 0x07, 0x00, 0x00, 0x03, 0x23, 0x00, 0x01, b'x']
        );
    }

    #[test]
    fn packet_identifier_is_checked() {
        for version in VERSIONS {
            assert_protocol(&[0x32, 0x05, 0x00, 0x01, b'a', 0x00, 0x00], version);
            assert_protocol(&[0x34, 0x05, 0x00, 0x01, b'a', 0x00, 0x00], version);
            assert_malformed(&[0x32, 0x04, 0x00, 0x01, b'a', 0x00], version);
        }
    }

    #[test]
    fn publish_properties_are_checked() {
        let with_props = |props: &[u8]| {
            let mut body = vec![0x00, 0x01, b'a', u8::try_from(props.len()).unwrap()];
            body.extend_from_slice(props);
            body.push(b'x');
            frame(0x30, &body)
        };
        // Subscription Identifier may repeat in PUBLISH; 0 is a Protocol error.
        let Packet::Publish(p) = decode_one(&with_props(&[0x0B, 0x01, 0x0B, 0xFF, 0x7F]), V5).unwrap() else {
            panic!("not a PUBLISH");
        };
        assert_eq!(p.properties.subscription_identifiers, [1, 16_383]);
        assert_protocol(&with_props(&[0x0B, 0x00]), V5);
        // Topic Alias 0 and twice.
        assert_protocol(&with_props(&[0x23, 0x00, 0x00]), V5);
        assert_protocol(&with_props(&[0x23, 0x00, 0x01, 0x23, 0x00, 0x02]), V5);
        // Payload Format Indicator must be 0 or 1.
        assert_protocol(&with_props(&[0x01, 0x02]), V5);
        // Response Topic must be a topic name.
        assert_protocol(&with_props(&[0x08, 0x00, 0x01, b'#']), V5);
        // Not allowed in PUBLISH.
        assert_protocol(&with_props(&[0x11, 0, 0, 0, 1]), V5);
        assert_protocol(&with_props(&[0x1F, 0x00, 0x00]), V5);
        // Unknown identifier.
        assert_malformed(&with_props(&[0x05, 0x00]), V5);
        // Value cut short by the Property Length.
        assert_malformed(&with_props(&[0x02, 0x00, 0x00]), V5);
        // A property is not a payload in 3.1.1: the same bytes are a PUBLISH with a payload.
        assert!(decode_one(&with_props(&[0x11, 0, 0, 0, 1]), V3_1_1).is_ok());
    }
}
