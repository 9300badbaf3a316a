//! Inbound flow control: the broker's Receive Maximum bounds the QoS 2 PUBLISHes a client may
//! have unreleased; one more is answered with DISCONNECT 0x93.

mod common;

use common::*;

fn config_with_receive_maximum(n: u16) -> braid_broker::Config {
    let mut config = Config::embedded();
    config.mqtt.receive_maximum = n;
    config
}

fn qos2(id: u16) -> Packet {
    Packet::Publish(Publish { packet_id: id, ..publish("rm/t", QoS::ExactlyOnce, "x") })
}

async fn expect_pubrec(c: &mut TestClient, id: u16) {
    match c.expect_packet().await {
        Packet::PubRec(a) => assert_eq!((a.packet_id, a.reason), (id, ReasonCode::Success)),
        other => panic!("expected PUBREC {id}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_unreleased_qos2_publish_exceeds_receive_maximum_2() {
    let b = start(config_with_receive_maximum(2)).await;
    let mut canary = Canary::new(b.addr, "rm").await;
    let (mut c, ack) = TestClient::connect_ok(b.addr, V5, connect_packet("rm", true)).await;
    assert_eq!(ack.properties.receive_maximum, Some(2));
    c.send(qos2(1)).await;
    c.send(qos2(2)).await;
    expect_pubrec(&mut c, 1).await;
    expect_pubrec(&mut c, 2).await;
    c.send(qos2(3)).await;
    c.expect_disconnect(ReasonCode::ReceiveMaximumExceeded).await;
    canary.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_qos2_publish_frees_its_slot() {
    let b = start(config_with_receive_maximum(2)).await;
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("rm-ok", true)).await;
    c.send(qos2(1)).await;
    c.send(qos2(2)).await;
    expect_pubrec(&mut c, 1).await;
    expect_pubrec(&mut c, 2).await;
    // A resent PUBLISH of an id already held takes no new slot.
    c.send(Packet::Publish(Publish { dup: true, packet_id: 2, ..publish("rm/t", QoS::ExactlyOnce, "x") }))
        .await;
    expect_pubrec(&mut c, 2).await;
    c.send(Packet::PubRel(Ack::new(1))).await;
    match c.expect_packet().await {
        Packet::PubComp(a) => assert_eq!(a.packet_id, 1),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
    c.send(qos2(3)).await;
    expect_pubrec(&mut c, 3).await;
    // QoS 1 is acknowledged at once and never counts.
    for id in 10..20 {
        c.publish_and_ack("rm/t", QoS::AtLeastOnce, b"q1", id).await;
    }
    c.ping().await;
}
