//! Helpers shared by the codec tests.

use bytes::{Bytes, BytesMut};

use super::{decode, encode, encoded_len};
use crate::{DecodeError, Packet, Properties, ProtocolVersion};

/// Encodes `packet` into a fresh vector, checking `encoded_len` on the way.
pub(super) fn encode_to_vec(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
    let mut buf = BytesMut::new();
    encode(packet, version, &mut buf).expect("encode");
    assert_eq!(buf.len(), encoded_len(packet, version), "encoded_len of {packet:?}");
    buf.to_vec()
}

/// Decodes exactly one packet that fills `bytes`.
pub(super) fn decode_one(bytes: &[u8], version: ProtocolVersion) -> Result<Packet, DecodeError> {
    let mut buf = BytesMut::from(bytes);
    let packet = decode(&mut buf, version, u32::MAX)?.expect("a whole packet");
    assert!(buf.is_empty(), "decode left {} bytes", buf.len());
    Ok(packet)
}

/// Asserts that every strict prefix of `bytes` decodes to `Ok(None)` without consuming.
pub(super) fn assert_prefixes_incomplete(bytes: &[u8], version: ProtocolVersion) {
    for end in 0..bytes.len() {
        let mut buf = BytesMut::from(&bytes[..end]);
        assert_eq!(decode(&mut buf, version, u32::MAX), Ok(None), "prefix of {end} bytes");
        assert_eq!(&buf[..], &bytes[..end], "prefix of {end} bytes was consumed");
    }
}

/// Encodes `packet`, decodes it back to `expected`, checks that every prefix is incomplete
/// and returns the bytes.
pub(super) fn round_trip_as(packet: &Packet, version: ProtocolVersion, expected: &Packet) -> Vec<u8> {
    let bytes = encode_to_vec(packet, version);
    assert_eq!(decode_one(&bytes, version).as_ref(), Ok(expected), "{version:?} {bytes:02X?}");
    assert_prefixes_incomplete(&bytes, version);
    bytes
}

/// [`round_trip_as`] for packets that decode to themselves.
pub(super) fn round_trip(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
    round_trip_as(packet, version, packet)
}

/// Asserts that `bytes` decode to a Malformed error.
#[track_caller]
pub(super) fn assert_malformed(bytes: &[u8], version: ProtocolVersion) {
    let mut buf = BytesMut::from(bytes);
    let result = decode(&mut buf, version, u32::MAX);
    assert!(matches!(result, Err(DecodeError::Malformed(_))), "{bytes:02X?}: {result:?}");
}

/// Asserts that `bytes` decode to a Protocol error.
#[track_caller]
pub(super) fn assert_protocol(bytes: &[u8], version: ProtocolVersion) {
    let mut buf = BytesMut::from(bytes);
    let result = decode(&mut buf, version, u32::MAX);
    assert!(matches!(result, Err(DecodeError::Protocol(_))), "{bytes:02X?}: {result:?}");
}

/// Prepends a fixed header (with a one byte Remaining Length) to `body`.
pub(super) fn frame(first: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![first, u8::try_from(body.len()).expect("short body")];
    bytes.extend_from_slice(body);
    bytes
}

/// A `Properties` with every field set, each to a value valid in its packets.
pub(super) fn all_properties() -> Properties {
    Properties::from(crate::PropertyValues {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(3600),
        content_type: Some("text/plain".into()),
        response_topic: Some("reply/here".into()),
        correlation_data: Some(Bytes::from_static(b"\x00corr")),
        subscription_identifiers: vec![7, 268_435_455],
        session_expiry_interval: Some(u32::MAX),
        assigned_client_identifier: Some("auto-1".into()),
        server_keep_alive: Some(30),
        authentication_method: Some("SCRAM-SHA-1".into()),
        authentication_data: Some(Bytes::from_static(b"\x01\x02")),
        request_problem_information: Some(0),
        will_delay_interval: Some(10),
        request_response_information: Some(1),
        response_information: Some("resp/".into()),
        server_reference: Some("other:1883".into()),
        reason_string: Some("because".into()),
        receive_maximum: Some(20),
        topic_alias_maximum: Some(10),
        topic_alias: Some(3),
        maximum_qos: Some(1),
        retain_available: Some(0),
        user_properties: vec![("k".into(), "v1".into()), ("k".into(), "v2".into()), ("é".into(), "".into())],
        maximum_packet_size: Some(1 << 20),
        wildcard_subscription_available: Some(1),
        subscription_identifier_available: Some(0),
        shared_subscription_available: Some(1),
    })
}

/// The fields of [`all_properties`] that a packet allows, built by hand from the spec's table
/// (section 2.2.2.2) rather than from the codec's.
pub(super) mod allowed {
    use super::all_properties;
    use crate::Properties;

    fn user_only() -> Properties {
        Properties::from(crate::PropertyValues {
            user_properties: all_properties().into_values().user_properties,
            ..Default::default()
        })
    }

    /// CONNECT.
    pub(crate) fn connect() -> Properties {
        let all = all_properties().into_values();
        Properties::from(crate::PropertyValues {
            session_expiry_interval: all.session_expiry_interval,
            authentication_method: all.authentication_method,
            authentication_data: all.authentication_data,
            request_problem_information: all.request_problem_information,
            request_response_information: all.request_response_information,
            receive_maximum: all.receive_maximum,
            topic_alias_maximum: all.topic_alias_maximum,
            maximum_packet_size: all.maximum_packet_size,
            ..user_only().into_values()
        })
    }

    /// The CONNECT will.
    pub(crate) fn will() -> Properties {
        let all = all_properties().into_values();
        Properties::from(crate::PropertyValues {
            payload_format_indicator: all.payload_format_indicator,
            message_expiry_interval: all.message_expiry_interval,
            content_type: all.content_type,
            response_topic: all.response_topic,
            correlation_data: all.correlation_data,
            will_delay_interval: all.will_delay_interval,
            ..user_only().into_values()
        })
    }

    /// CONNACK.
    pub(crate) fn connack() -> Properties {
        let all = all_properties().into_values();
        Properties::from(crate::PropertyValues {
            session_expiry_interval: all.session_expiry_interval,
            receive_maximum: all.receive_maximum,
            maximum_qos: all.maximum_qos,
            retain_available: all.retain_available,
            maximum_packet_size: all.maximum_packet_size,
            assigned_client_identifier: all.assigned_client_identifier,
            topic_alias_maximum: all.topic_alias_maximum,
            reason_string: all.reason_string,
            wildcard_subscription_available: all.wildcard_subscription_available,
            subscription_identifier_available: all.subscription_identifier_available,
            shared_subscription_available: all.shared_subscription_available,
            server_keep_alive: all.server_keep_alive,
            response_information: all.response_information,
            server_reference: all.server_reference,
            authentication_method: all.authentication_method,
            authentication_data: all.authentication_data,
            ..user_only().into_values()
        })
    }

    /// PUBLISH.
    pub(crate) fn publish() -> Properties {
        let all = all_properties().into_values();
        Properties::from(crate::PropertyValues {
            payload_format_indicator: all.payload_format_indicator,
            message_expiry_interval: all.message_expiry_interval,
            topic_alias: all.topic_alias,
            response_topic: all.response_topic,
            correlation_data: all.correlation_data,
            subscription_identifiers: all.subscription_identifiers,
            content_type: all.content_type,
            ..user_only().into_values()
        })
    }

    /// PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK and UNSUBACK.
    pub(crate) fn ack() -> Properties {
        Properties::from(crate::PropertyValues {
            reason_string: all_properties().into_values().reason_string,
            ..user_only().into_values()
        })
    }

    /// SUBSCRIBE: one Subscription Identifier at most.
    pub(crate) fn subscribe() -> Properties {
        Properties::from(crate::PropertyValues {
            subscription_identifiers: vec![7],
            ..user_only().into_values()
        })
    }

    /// UNSUBSCRIBE.
    pub(crate) fn unsubscribe() -> Properties {
        user_only()
    }

    /// DISCONNECT.
    pub(crate) fn disconnect() -> Properties {
        let all = all_properties().into_values();
        Properties::from(crate::PropertyValues {
            session_expiry_interval: all.session_expiry_interval,
            reason_string: all.reason_string,
            server_reference: all.server_reference,
            ..user_only().into_values()
        })
    }

    /// AUTH.
    pub(crate) fn auth() -> Properties {
        let all = all_properties().into_values();
        Properties::from(crate::PropertyValues {
            authentication_method: all.authentication_method,
            authentication_data: all.authentication_data,
            reason_string: all.reason_string,
            ..user_only().into_values()
        })
    }
}
