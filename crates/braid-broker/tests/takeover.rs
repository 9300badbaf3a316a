//! Session takeover: a second connection with the same client id closes the first with
//! DISCONNECT 0x8E; the first connection's will (no delay) is published, a delayed will is
//! cancelled when the session continues; the new connection works normally. What the old
//! connection's client sent before the new CONNECT (a DISCONNECT) is handled first.

mod common;

use common::*;

fn with_will(client_id: &str, clean: bool, delay: Option<u32>) -> Connect {
    let mut c = connect_with_expiry(client_id, clean, 300);
    let properties =
        Properties::from(braid_proto::PropertyValues { will_delay_interval: delay, ..Default::default() });
    c.will = Some(LastWill {
        topic: "will/takeover".into(),
        payload: Bytes::from(format!("{client_id} is gone")),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties,
    });
    c
}

async fn watcher(addr: std::net::SocketAddr) -> TestClient {
    let (mut w, _) = TestClient::connect_ok(addr, V5, connect_packet("watcher", true)).await;
    w.subscribe("will/#", QoS::AtLeastOnce).await;
    w
}

async fn takeover(clean_b: bool) {
    let b = start_default().await;
    let mut w = watcher(b.addr).await;
    let (mut a, _) = TestClient::connect_ok(b.addr, V5, with_will("dup-id", true, None)).await;
    a.subscribe("takeover/a", QoS::AtLeastOnce).await;

    let (mut bb, ack) = TestClient::connect_ok(b.addr, V5, connect_with_expiry("dup-id", clean_b, 300)).await;
    assert_eq!(ack.session_present, !clean_b);

    a.expect_disconnect(ReasonCode::SessionTakenOver).await;
    let will = w.expect_publish().await;
    assert_eq!((&*will.topic, &will.payload[..]), ("will/takeover", &b"dup-id is gone"[..]));
    w.send(Packet::PubAck(Ack::new(will.packet_id))).await;

    // B keeps working: its own subscription, and A's when the session continued.
    bb.subscribe("takeover/b", QoS::AtLeastOnce).await;
    let (mut p, _) = TestClient::connect_ok(b.addr, V5, connect_packet("tk-pub", true)).await;
    p.publish_and_ack("takeover/a", QoS::AtLeastOnce, b"to a", 1).await;
    p.publish_and_ack("takeover/b", QoS::AtLeastOnce, b"to b", 2).await;
    if !clean_b {
        let got = bb.expect_publish().await;
        assert_eq!(&*got.topic, "takeover/a", "the session kept A's subscription");
        bb.send(Packet::PubAck(Ack::new(got.packet_id))).await;
    }
    let got = bb.expect_publish().await;
    assert_eq!(&*got.topic, "takeover/b");
    bb.send(Packet::PubAck(Ack::new(got.packet_id))).await;
    bb.ping().await;
    w.expect_nothing(QUIET).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_with_clean_start_closes_old_with_0x8e_and_publishes_its_will() {
    takeover(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_resuming_the_session_closes_old_with_0x8e_and_publishes_its_will() {
    takeover(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_resuming_the_session_cancels_a_delayed_will() {
    let b = start_default().await;
    let mut w = watcher(b.addr).await;
    let (mut a, _) = TestClient::connect_ok(b.addr, V5, with_will("delayed", true, Some(60))).await;
    a.ping().await;
    let (mut bb, ack) = TestClient::connect_ok(b.addr, V5, connect_with_expiry("delayed", false, 300)).await;
    assert!(ack.session_present);
    a.expect_disconnect(ReasonCode::SessionTakenOver).await;
    // A will sent at takeover would be routed before B's CONNACK, so before this marker.
    bb.publish_and_ack("will/marker", QoS::AtLeastOnce, b"marker", 1).await;
    let got = w.expect_publish().await;
    assert_eq!(&*got.topic, "will/marker", "the delayed will was published");
}

/// A client that sends DISCONNECT and at once CONNECTs again on a new socket: the DISCONNECT
/// is honoured (no will, the session ended or kept as its expiry says), not lost to a takeover
/// that would publish the will. Many rounds, since a lost DISCONNECT is a matter of timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_then_reconnect_at_once_is_never_a_takeover() {
    let b = start_default().await;
    let mut w = watcher(b.addr).await;
    for round in 0..500u32 {
        // Even rounds: the session ends at DISCONNECT (expiry 0); odd rounds: it is kept.
        let expiry = if round % 2 == 0 { 0 } else { 300 };
        let mut c = connect_with_expiry("reconnects", true, expiry);
        c.will = will("will/reconnects", b"lost a DISCONNECT");
        let (mut a, _) = TestClient::connect_ok(b.addr, V5, c).await;
        a.send(Packet::Disconnect(Disconnect {
            reason: ReasonCode::Success,
            properties: Properties::default(),
        }))
        .await;
        let (bb, ack) = TestClient::connect_ok(b.addr, V5, connect_with_expiry("reconnects", false, 0)).await;
        assert_eq!(ack.session_present, expiry != 0, "round {round}: session present");
        assert_eq!(a.expect_closed().await, None, "round {round}: the old connection was not taken over");
        bb.disconnect().await;
    }
    // A will published at a takeover would be routed before this marker.
    let (mut p, _) = TestClient::connect_ok(b.addr, V5, connect_packet("reconnect-marker", true)).await;
    p.publish_and_ack("will/marker", QoS::AtLeastOnce, b"marker", 1).await;
    assert_eq!(&*w.expect_publish().await.topic, "will/marker", "a will was published");
}
