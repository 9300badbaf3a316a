//! A client that breaks the protocol loses its own connection, with the v5 reason the spec
//! allows for the case, and nobody else notices: a canary publisher/subscriber pair keeps
//! exchanging messages before and after each bad client.

mod common;

use common::*;
use ReasonCode::{MalformedPacket, PacketTooLarge, ProtocolError, TopicNameInvalid};

/// Connects a v5 (or 3.1.1) client, sends `bytes`, and returns what the broker closed with.
async fn send_bad(
    addr: std::net::SocketAddr,
    version: ProtocolVersion,
    name: &str,
    bytes: &[u8],
) -> Option<ReasonCode> {
    let (mut c, _) = TestClient::connect_ok(addr, version, connect_packet(name, true)).await;
    c.send_raw(bytes).await;
    c.expect_closed().await
}

fn assert_reason_in(got: Option<ReasonCode>, allowed: &[ReasonCode], case: &str) {
    match got {
        Some(r) if allowed.contains(&r) => {}
        other => panic!("{case}: DISCONNECT {other:?}, expected one of {allowed:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_wildcard_topic_closes_only_that_client() {
    let b = start_default().await;
    let mut canary = Canary::new(b.addr, "wild").await;
    canary.check().await;
    for (i, topic) in ["a/+", "a/#", "+", "#/x"].into_iter().enumerate() {
        for qos in [QoS::AtMostOnce, QoS::AtLeastOnce] {
            let p = Packet::Publish(publish(topic, qos, "x"));
            let got = send_bad(b.addr, V5, &format!("wild{i}"), &encode_packet(&p, V5)).await;
            // Topic Name invalid is the precise answer; Malformed Packet / Protocol Error are
            // what the spec's general error handling (4.13) allows.
            assert_reason_in(got, &[TopicNameInvalid, MalformedPacket, ProtocolError], topic);
            canary.check().await;
        }
    }
    // 3.1.1: no DISCONNECT, just the close.
    let p = Packet::Publish(publish("a/+", QoS::AtMostOnce, "x"));
    assert_eq!(send_bad(b.addr, V311, "wild311", &encode_packet(&p, V311)).await, None);
    canary.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packet_over_max_packet_size_gets_0x95() {
    let mut config = Config::embedded();
    config.mqtt.max_packet_size = 1024;
    let b = start(config).await;
    let mut canary = Canary::new(b.addr, "big").await;
    canary.check().await;

    let (mut c, ack) = TestClient::connect_ok(b.addr, V5, connect_packet("too-big", true)).await;
    assert_eq!(ack.properties.maximum_packet_size, Some(1024));
    let p = Packet::Publish(publish("big", QoS::AtMostOnce, vec![b'x'; 1100]));
    let bytes = encode_packet(&p, V5);
    // The fixed header alone announces the size; the broker need not read the body. (Only a
    // prefix is sent so that no unread bytes turn the broker's close into a reset.)
    c.send_raw(&bytes[..64]).await;
    assert_eq!(c.expect_closed().await, Some(PacketTooLarge));
    canary.check().await;

    // One byte over, fixed header included: a packet of exactly 1025 bytes.
    let payload = 1025 - (bytes.len() - 1100);
    let p = Packet::Publish(publish("big", QoS::AtMostOnce, vec![b'x'; payload]));
    let bytes = encode_packet(&p, V5);
    assert_eq!(bytes.len(), 1025);
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("too-big2", true)).await;
    c.send_raw(&bytes[..64]).await;
    assert_eq!(c.expect_closed().await, Some(PacketTooLarge));
    canary.check().await;

    // Exactly at the limit is fine.
    let p = Packet::Publish(publish("big", QoS::AtMostOnce, vec![b'x'; payload - 1]));
    let bytes = encode_packet(&p, V5);
    assert_eq!(bytes.len(), 1024);
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("fits", true)).await;
    c.send_raw(&bytes).await;
    c.ping().await;
    canary.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_connect_is_a_protocol_error() {
    let b = start_default().await;
    let mut canary = Canary::new(b.addr, "reconnect").await;
    let mut c = connect_packet("twice", true);
    c.protocol = V5;
    let bytes = encode_packet(&Packet::Connect(Box::new(c)), V5);
    assert_eq!(send_bad(b.addr, V5, "twice", &bytes).await, Some(ProtocolError));
    canary.check().await;
    let mut c = connect_packet("twice311", true);
    c.protocol = V311;
    let bytes = encode_packet(&Packet::Connect(Box::new(c)), V311);
    assert_eq!(send_bad(b.addr, V311, "twice311", &bytes).await, None);
    canary.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remaining_length_that_lies_is_malformed() {
    let b = start_default().await;
    let mut canary = Canary::new(b.addr, "liar").await;
    let cases: [(&str, &[u8]); 4] = [
        // PUBLISH whose topic length (5) runs past the remaining length (3).
        ("topic past the end", &[0x30, 0x03, 0x00, 0x05, b'a']),
        // SUBSCRIBE that ends inside its packet id.
        ("subscribe cut short", &[0x82, 0x01, 0x00]),
        // PINGREQ announcing a body.
        ("ping with body", &[0xC0, 0x02, 0x00, 0x00]),
        // Remaining length encoded in five bytes.
        ("five byte length", &[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]),
    ];
    for (i, (case, bytes)) in cases.into_iter().enumerate() {
        let got = send_bad(b.addr, V5, &format!("liar{i}"), bytes).await;
        assert_reason_in(got, &[MalformedPacket], case);
        canary.check().await;
        let got = send_bad(b.addr, V311, &format!("liar311-{i}"), bytes).await;
        assert_eq!(got, None, "{case}: 3.1.1 has no DISCONNECT");
        canary.check().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_qos_3_closes_the_connection() {
    let b = start_default().await;
    let mut canary = Canary::new(b.addr, "qos3").await;
    // PUBLISH, QoS bits 11, topic "a", packet id 1, (v5: empty properties), payload "x".
    let v5 = [0x36, 0x07, 0x00, 0x01, b'a', 0x00, 0x01, 0x00, b'x'];
    let got = send_bad(b.addr, V5, "qos3", &v5).await;
    assert_reason_in(got, &[MalformedPacket], "QoS 3");
    canary.check().await;
    let v311 = [0x36, 0x06, 0x00, 0x01, b'a', 0x00, 0x01, b'x'];
    assert_eq!(send_bad(b.addr, V311, "qos3-311", &v311).await, None);
    canary.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_client_will_is_published() {
    let b = start_default().await;
    let mut canary = Canary::new(b.addr, "badwill").await;
    let (mut w, _) = TestClient::connect_ok(b.addr, V5, connect_packet("bw-watch", true)).await;
    w.subscribe("bad/will", QoS::AtMostOnce).await;
    let mut c = connect_packet("bw", true);
    c.will = will("bad/will", b"protocol error");
    let (mut bad, _) = TestClient::connect_ok(b.addr, V5, c).await;
    bad.send_raw(&[0x30, 0x03, 0x00, 0x05, b'a']).await;
    assert_eq!(bad.expect_closed().await, Some(MalformedPacket));
    let will = w.expect_publish().await;
    assert_eq!(&will.payload[..], b"protocol error");
    canary.check().await;
}
