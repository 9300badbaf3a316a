//! Outbound redelivery when a persistent session resumes: unacknowledged PUBLISHes come back
//! with the same packet ids and DUP=1, a QoS 2 delivery the client already PUBRECed comes back
//! as PUBREL, and nothing comes back once everything is acknowledged.

mod common;

use common::*;

/// A CONNECT that keeps the session: Clean Session 0 in 3.1.1, Clean Start 0 and a Session
/// Expiry Interval in v5.
fn persistent(client_id: &str, version: ProtocolVersion) -> Connect {
    if version.is_v5() {
        connect_with_expiry(client_id, false, 300)
    } else {
        connect_packet(client_id, false)
    }
}

async fn resume(addr: std::net::SocketAddr, version: ProtocolVersion, id: &str) -> TestClient {
    let (c, ack) = TestClient::connect_ok(addr, version, persistent(id, version)).await;
    assert!(ack.session_present, "{id}: session resumed");
    c
}

async fn outbound_redelivery(version: ProtocolVersion) {
    let b = start_default().await;
    let id = format!("redeliver-{version:?}");
    let (mut sub, ack) = TestClient::connect_ok(b.addr, version, persistent(&id, version)).await;
    assert!(!ack.session_present);
    sub.subscribe("r/#", QoS::ExactlyOnce).await;

    let (mut publisher, _) = TestClient::connect_ok(b.addr, V5, connect_packet("r-pub", true)).await;
    publisher.publish_and_ack("r/one", QoS::AtLeastOnce, b"one", 1).await;
    publisher.publish_and_ack("r/two", QoS::ExactlyOnce, b"two", 2).await;

    // First delivery: not acknowledged.
    let p1 = sub.expect_publish().await;
    let p2 = sub.expect_publish().await;
    assert_eq!((&*p1.topic, p1.qos, p1.dup), ("r/one", QoS::AtLeastOnce, false));
    assert_eq!((&*p2.topic, p2.qos, p2.dup), ("r/two", QoS::ExactlyOnce, false));
    assert_ne!(p1.packet_id, p2.packet_id);
    sub.drop_socket();

    // Resume: both again, same ids, DUP set, same content.
    let mut sub = resume(b.addr, version, &id).await;
    let r1 = sub.expect_publish().await;
    let r2 = sub.expect_publish().await;
    for (first, again) in [(&p1, &r1), (&p2, &r2)] {
        assert!(again.dup, "redelivery carries DUP: {again:?}");
        assert_eq!(again.packet_id, first.packet_id);
        assert_eq!(again.qos, first.qos);
        assert_eq!(again.topic, first.topic);
        assert_eq!(again.payload, first.payload);
    }
    sub.expect_nothing(QUIET).await;

    // PUBACK the QoS 1 message, PUBREC the QoS 2 one, then vanish before PUBCOMP.
    sub.send(Packet::PubAck(Ack::new(p1.packet_id))).await;
    sub.send(Packet::PubRec(Ack::new(p2.packet_id))).await;
    match sub.expect_packet().await {
        Packet::PubRel(a) => assert_eq!(a.packet_id, p2.packet_id),
        other => panic!("expected PUBREL, got {other:?}"),
    }
    sub.drop_socket();

    // Resume: the broker resends the PUBREL, not the PUBLISH, and not the acknowledged QoS 1.
    let mut sub = resume(b.addr, version, &id).await;
    match sub.expect_packet().await {
        Packet::PubRel(a) => {
            assert_eq!(a.packet_id, p2.packet_id);
            assert_eq!(a.reason, ReasonCode::Success);
        }
        other => panic!("expected PUBREL on resume, got {other:?}"),
    }
    sub.expect_nothing(QUIET).await;
    sub.send(Packet::PubComp(Ack::new(p2.packet_id))).await;
    sub.ping().await;
    sub.drop_socket();

    // Everything acknowledged: a resumed session gets nothing.
    let mut sub = resume(b.addr, version, &id).await;
    sub.expect_nothing(QUIET).await;

    // And the session still works: a new message gets a normal first delivery.
    publisher.publish_and_ack("r/three", QoS::AtLeastOnce, b"three", 3).await;
    let p3 = sub.expect_publish().await;
    assert_eq!((&*p3.topic, p3.dup), ("r/three", false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_deliveries_are_resent_with_dup_on_resume_v311() {
    outbound_redelivery(V311).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_deliveries_are_resent_with_dup_on_resume_v5() {
    outbound_redelivery(V5).await;
}

async fn inbound_qos2_once(version: ProtocolVersion) {
    let b = start_default().await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, connect_packet("q2-sub", true)).await;
    sub.subscribe("q2/#", QoS::AtLeastOnce).await;

    let id = format!("q2-pub-{version:?}");
    let (mut publisher, _) = TestClient::connect_ok(b.addr, version, persistent(&id, version)).await;
    let first = Publish { packet_id: 9, ..publish("q2/x", QoS::ExactlyOnce, "exactly once") };
    publisher.send(Packet::Publish(first.clone())).await;
    match publisher.expect_packet().await {
        Packet::PubRec(a) => assert_eq!(a.packet_id, 9),
        other => panic!("expected PUBREC, got {other:?}"),
    }
    publisher.drop_socket();

    // The publisher does not know whether PUBREC arrived: it resends the PUBLISH with DUP.
    let mut publisher = resume(b.addr, version, &id).await;
    publisher.send(Packet::Publish(Publish { dup: true, ..first })).await;
    match publisher.expect_packet().await {
        Packet::PubRec(a) => assert_eq!((a.packet_id, a.reason), (9, ReasonCode::Success)),
        other => panic!("expected PUBREC for the resent PUBLISH, got {other:?}"),
    }
    publisher.send(Packet::PubRel(Ack::new(9))).await;
    match publisher.expect_packet().await {
        Packet::PubComp(a) => assert_eq!((a.packet_id, a.reason), (9, ReasonCode::Success)),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }

    // Exactly one copy: the marker, published after, is the next thing the subscriber sees.
    publisher.publish_and_ack("q2/marker", QoS::AtLeastOnce, b"marker", 10).await;
    let p = sub.expect_publish().await;
    assert_eq!(&p.payload[..], b"exactly once");
    sub.send(Packet::PubAck(Ack::new(p.packet_id))).await;
    let marker = sub.expect_publish().await;
    assert_eq!(&*marker.topic, "q2/marker", "a second copy was delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_qos2_resent_after_reconnect_is_delivered_once_v311() {
    inbound_qos2_once(V311).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_qos2_resent_after_reconnect_is_delivered_once_v5() {
    inbound_qos2_once(V5).await;
}

/// A v5 subscriber with Receive Maximum `recv_max` and, optionally, a Maximum Packet Size.
fn limited(client_id: &str, clean: bool, recv_max: u16, max_packet: Option<u32>) -> Connect {
    let mut c = connect_with_expiry(client_id, clean, 300);
    c.properties.receive_maximum = Some(recv_max);
    c.properties.maximum_packet_size = max_packet;
    c
}

/// A resent PUBLISH too large for the client's new Maximum Packet Size is discarded as if
/// sent [MQTT-3.1.2-25]: it must not keep its in-flight slot and stall later deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_too_large_for_the_resumed_client_does_not_stall_the_window() {
    let b = start_default().await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, limited("too-large", true, 1, None)).await;
    sub.subscribe("tl/t", QoS::AtLeastOnce).await;
    let (mut p, _) = TestClient::connect_ok(b.addr, V5, connect_packet("tl-pub", true)).await;
    p.publish_and_ack("tl/t", QoS::AtLeastOnce, &[b'x'; 500], 1).await;
    let big = sub.expect_publish().await;
    assert_eq!(big.payload.len(), 500);
    sub.drop_socket();

    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, limited("too-large", false, 1, Some(100))).await;
    p.publish_and_ack("tl/t", QoS::AtLeastOnce, b"small", 2).await;
    let got = sub.expect_publish().await;
    assert_eq!((&got.payload[..], got.dup), (&b"small"[..], false));
    assert_eq!(b.dropped(), 1, "the discarded resend counts as dropped");
}
