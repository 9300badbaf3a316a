//! Property tests: arbitrary packets round trip, and arbitrary or mutated bytes never panic.

use bytes::{Bytes, BytesMut};
use bytestring::ByteString;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

use super::test_util::encode_to_vec;
use super::{decode, encode};
use crate::{
    Connect, LastWill, Packet, Properties, ProtocolVersion, Publish, QoS, RetainHandling, Subscribe,
    SubscriptionOptions,
};

const VERSIONS: [ProtocolVersion; 3] = [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1, ProtocolVersion::V5];

/// Any string a UTF-8 Encoded String may hold (no U+0000).
fn string() -> impl Strategy<Value = ByteString> {
    "[^\u{0}]{0,12}".prop_map(ByteString::from)
}

/// A valid topic name.
fn topic_name() -> impl Strategy<Value = ByteString> {
    "[^\u{0}+#]{1,12}".prop_map(ByteString::from)
}

fn binary() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..16).prop_map(Bytes::from)
}

fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![Just(QoS::AtMostOnce), Just(QoS::AtLeastOnce), Just(QoS::ExactlyOnce)]
}

fn flag() -> impl Strategy<Value = Option<u8>> {
    option::of(0..=1u8)
}

fn user_properties() -> impl Strategy<Value = Vec<(ByteString, ByteString)>> {
    vec((string(), string()), 0..3)
}

fn subscription_id() -> impl Strategy<Value = u32> {
    1..=268_435_455u32
}

/// Properties a PUBLISH may carry, with valid values.
fn publish_properties() -> impl Strategy<Value = Properties> {
    (
        flag(),
        option::of(any::<u32>()),
        option::of(string()),
        option::of(topic_name()),
        option::of(binary()),
        vec(subscription_id(), 0..3),
        option::of(1..=u16::MAX),
        user_properties(),
    )
        .prop_map(|(pfi, expiry, content, response, correlation, ids, alias, users)| {
            Properties::from(crate::PropertyValues {
                payload_format_indicator: pfi,
                message_expiry_interval: expiry,
                content_type: content,
                response_topic: response,
                correlation_data: correlation,
                subscription_identifiers: ids,
                topic_alias: alias,
                user_properties: users,
                ..Default::default()
            })
        })
}

/// Properties a CONNECT may carry.
fn connect_properties() -> impl Strategy<Value = Properties> {
    (
        option::of(any::<u32>()),
        option::of(string()),
        option::of(binary()),
        flag(),
        flag(),
        option::of(1..=u16::MAX),
        option::of(any::<u16>()),
        option::of(1..=u32::MAX),
        user_properties(),
    )
        .prop_map(|(expiry, method, data, problem, response, receive, alias, size, users)| {
            Properties::from(crate::PropertyValues {
                session_expiry_interval: expiry,
                authentication_method: method,
                authentication_data: data,
                request_problem_information: problem,
                request_response_information: response,
                receive_maximum: receive,
                topic_alias_maximum: alias,
                maximum_packet_size: size,
                user_properties: users,
                ..Default::default()
            })
        })
}

/// Properties a CONNECT will may carry.
fn will_properties() -> impl Strategy<Value = Properties> {
    (publish_properties(), option::of(any::<u32>())).prop_map(|(publish, delay)| {
        Properties::from(crate::PropertyValues {
            will_delay_interval: delay,
            subscription_identifiers: Vec::new(),
            topic_alias: None,
            ..publish.into_values()
        })
    })
}

/// Properties a SUBSCRIBE may carry.
fn subscribe_properties() -> impl Strategy<Value = Properties> {
    (option::of(subscription_id()), user_properties()).prop_map(|(id, users)| {
        Properties::from(crate::PropertyValues {
            subscription_identifiers: id.into_iter().collect(),
            user_properties: users,
            ..Default::default()
        })
    })
}

/// `properties` in v5, nothing in 3.1.x.
fn if_v5(
    version: ProtocolVersion,
    properties: impl Strategy<Value = Properties>,
) -> impl Strategy<Value = Properties> {
    let v5 = version.is_v5();
    properties.prop_map(move |p| if v5 { p } else { Properties::default() })
}

fn publish(version: ProtocolVersion) -> impl Strategy<Value = Publish> {
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        topic_name(),
        1..=u16::MAX,
        if_v5(version, publish_properties()),
        binary(),
    )
        .prop_map(|(qos, dup, retain, topic, id, properties, payload)| {
            let at_most_once = qos == QoS::AtMostOnce;
            Publish {
                dup: dup && !at_most_once,
                qos,
                retain,
                topic,
                packet_id: if at_most_once { 0 } else { id },
                properties,
                payload,
            }
        })
}

fn options(version: ProtocolVersion) -> impl Strategy<Value = SubscriptionOptions> {
    let v5 = version.is_v5();
    let retain_handling = prop_oneof![
        Just(RetainHandling::SendAtSubscribe),
        Just(RetainHandling::SendIfNew),
        Just(RetainHandling::DoNotSend)
    ];
    (qos(), any::<bool>(), any::<bool>(), retain_handling).prop_map(move |(qos, nl, rap, rh)| {
        if v5 {
            SubscriptionOptions { qos, no_local: nl, retain_as_published: rap, retain_handling: rh }
        } else {
            SubscriptionOptions { qos, ..SubscriptionOptions::default() }
        }
    })
}

fn subscribe(version: ProtocolVersion) -> impl Strategy<Value = Subscribe> {
    (1..=u16::MAX, if_v5(version, subscribe_properties()), vec((string(), options(version)), 1..4))
        .prop_map(|(packet_id, properties, filters)| Subscribe { packet_id, properties, filters })
}

fn connect(version: ProtocolVersion) -> impl Strategy<Value = Connect> {
    let will = (topic_name(), binary(), qos(), any::<bool>(), if_v5(version, will_properties())).prop_map(
        |(topic, payload, qos, retain, properties)| LastWill { topic, payload, qos, retain, properties },
    );
    (
        any::<bool>(),
        any::<u16>(),
        if_v5(version, connect_properties()),
        string(),
        option::of(will),
        option::of(string()),
        option::of(binary()),
    )
        .prop_map(move |(clean_start, keep_alive, properties, client_id, will, username, password)| {
            // 3.1.x has no password without a user name.
            let password = if version.is_v5() || username.is_some() { password } else { None };
            Connect {
                protocol: version,
                clean_start,
                keep_alive,
                properties,
                client_id,
                will,
                username,
                password,
            }
        })
}

/// Encodes `packet`, checks `encoded_len`, and decodes it back.
fn round_trip(packet: &Packet, version: ProtocolVersion) -> Result<(), TestCaseError> {
    let bytes = encode_to_vec(packet, version);
    let mut buf = BytesMut::from(&bytes[..]);
    let decoded = decode(&mut buf, version, u32::MAX);
    prop_assert_eq!(decoded, Ok(Some(packet.clone())));
    prop_assert!(buf.is_empty());
    Ok(())
}

/// Decodes packets from `bytes` until it needs more input or fails. Must not panic.
fn decode_all(bytes: &[u8], version: ProtocolVersion, max: u32) {
    let mut buf = BytesMut::from(bytes);
    let mut before = buf.len();
    while let Ok(Some(_)) = decode(&mut buf, version, max) {
        assert!(buf.len() < before, "decode made no progress");
        before = buf.len();
    }
}

/// Some valid packet in some version, for mutation.
fn any_valid() -> impl Strategy<Value = (Packet, ProtocolVersion)> {
    prop_oneof![
        publish(ProtocolVersion::V5).prop_map(|p| (Packet::Publish(p), ProtocolVersion::V5)),
        publish(ProtocolVersion::V3_1_1).prop_map(|p| (Packet::Publish(p), ProtocolVersion::V3_1_1)),
        subscribe(ProtocolVersion::V5).prop_map(|p| (Packet::Subscribe(p), ProtocolVersion::V5)),
        subscribe(ProtocolVersion::V3_1_1).prop_map(|p| (Packet::Subscribe(p), ProtocolVersion::V3_1_1)),
        connect(ProtocolVersion::V5).prop_map(|p| (Packet::Connect(Box::new(p)), ProtocolVersion::V5)),
        connect(ProtocolVersion::V3_1).prop_map(|p| (Packet::Connect(Box::new(p)), ProtocolVersion::V3_1)),
    ]
}

proptest! {
    #[test]
    fn publish_round_trips_v5(p in publish(ProtocolVersion::V5)) {
        round_trip(&Packet::Publish(p), ProtocolVersion::V5)?;
    }

    #[test]
    fn publish_round_trips_v3(p in publish(ProtocolVersion::V3_1_1)) {
        round_trip(&Packet::Publish(p.clone()), ProtocolVersion::V3_1_1)?;
        round_trip(&Packet::Publish(p), ProtocolVersion::V3_1)?;
    }

    #[test]
    fn subscribe_round_trips_v5(s in subscribe(ProtocolVersion::V5)) {
        round_trip(&Packet::Subscribe(s), ProtocolVersion::V5)?;
    }

    #[test]
    fn subscribe_round_trips_v3(s in subscribe(ProtocolVersion::V3_1_1)) {
        round_trip(&Packet::Subscribe(s.clone()), ProtocolVersion::V3_1_1)?;
        round_trip(&Packet::Subscribe(s), ProtocolVersion::V3_1)?;
    }

    #[test]
    fn connect_round_trips_v5(c in connect(ProtocolVersion::V5)) {
        round_trip(&Packet::Connect(Box::new(c)), ProtocolVersion::V5)?;
    }

    #[test]
    fn connect_round_trips_v3_1_1(c in connect(ProtocolVersion::V3_1_1)) {
        round_trip(&Packet::Connect(Box::new(c)), ProtocolVersion::V3_1_1)?;
    }

    #[test]
    fn connect_round_trips_v3_1(c in connect(ProtocolVersion::V3_1)) {
        round_trip(&Packet::Connect(Box::new(c)), ProtocolVersion::V3_1)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..256), max in prop_oneof![Just(u32::MAX), 0..300u32]) {
        for version in VERSIONS {
            decode_all(&bytes, version, max);
        }
    }

    #[test]
    fn arbitrary_bodies_never_panic(first in any::<u8>(), body in vec(any::<u8>(), 0..128)) {
        // A correct Remaining Length, so the body is actually parsed.
        let mut bytes = BytesMut::new();
        bytes.extend_from_slice(&[first]);
        super::primitives::put_varint(&mut bytes, body.len()).unwrap();
        bytes.extend_from_slice(&body);
        for version in VERSIONS {
            decode_all(&bytes, version, u32::MAX);
        }
    }

    #[test]
    fn mutated_packets_never_panic(
        (packet, version) in any_valid(),
        edits in vec((any::<usize>(), any::<u8>(), 0..4u8), 1..4),
    ) {
        let mut bytes = BytesMut::new();
        encode(&packet, version, &mut bytes).unwrap();
        let mut bytes = bytes.to_vec();
        for (at, byte, how) in edits {
            let at = at % (bytes.len() + 1);
            match how {
                0 if at < bytes.len() => bytes[at] = byte,
                1 if at < bytes.len() => bytes[at] ^= 1 << (byte % 8),
                2 => bytes.insert(at, byte),
                _ => bytes.truncate(at),
            }
        }
        for version in VERSIONS {
            decode_all(&bytes, version, u32::MAX);
        }
    }

    #[test]
    fn no_decoded_packet_exceeds_the_maximum(bytes in vec(any::<u8>(), 0..512), max in 2..600u32) {
        // Hostile input cannot smuggle a packet larger than the limit past the decoder.
        for version in VERSIONS {
            let mut buf = BytesMut::from(&bytes[..]);
            let mut before = buf.len();
            while let Ok(Some(_)) = decode(&mut buf, version, max) {
                prop_assert!((before - buf.len()) as u32 <= max);
                before = buf.len();
            }
        }
    }

    #[test]
    fn a_stream_split_anywhere_decodes_like_the_whole(
        packets in vec(any_valid().prop_filter("one version", |(_, v)| *v == ProtocolVersion::V5), 1..5),
        cuts in vec(any::<prop::sample::Index>(), 0..6),
    ) {
        // The broker sees TCP segments, not packets: however the bytes are split (a slow-loris
        // client trickles them), the same packets come out.
        let version = ProtocolVersion::V5;
        let mut stream = BytesMut::new();
        for (p, _) in &packets {
            encode(p, version, &mut stream).unwrap();
        }
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        points.push(stream.len());
        points.sort_unstable();
        let (mut buf, mut got, mut from) = (BytesMut::new(), Vec::new(), 0);
        for to in points {
            buf.extend_from_slice(&stream[from..to]);
            from = to;
            while let Some(p) = decode(&mut buf, version, u32::MAX).unwrap() {
                got.push(p);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, packets.into_iter().map(|(p, _)| p).collect::<Vec<_>>());
    }
}
