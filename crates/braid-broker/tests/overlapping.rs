//! Overlapping subscriptions of one session: MQTT 3.1.1 gets one copy at the highest granted
//! QoS; MQTT 5 too, carrying every matching Subscription Identifier, unless
//! `mqtt.overlapping = "per_subscription"`: then one copy per subscription, each with its own.

mod common;

use common::*;

async fn publisher(addr: std::net::SocketAddr) -> TestClient {
    TestClient::connect_ok(addr, V5, connect_packet("ov-pub", true)).await.0
}

/// Completes the QoS 2 handshake for a delivery the client received. Call it only once every
/// expected PUBLISH was read: the broker may send queued PUBLISHes before the PUBREL.
async fn complete_qos2(c: &mut TestClient, id: u16) {
    c.send(Packet::PubRec(Ack::new(id))).await;
    match c.expect_packet().await {
        Packet::PubRel(a) => assert_eq!(a.packet_id, id),
        other => panic!("expected PUBREL, got {other:?}"),
    }
    c.send(Packet::PubComp(Ack::new(id))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v311_overlapping_subscriptions_get_one_copy_at_the_highest_qos() {
    let b = start_default().await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V311, connect_packet("ov311", true)).await;
    sub.subscribe("a/#", QoS::AtMostOnce).await;
    sub.subscribe("a/b", QoS::ExactlyOnce).await;
    let mut p = publisher(b.addr).await;
    p.publish_and_ack("a/b", QoS::ExactlyOnce, b"once", 1).await;
    // Matches only a/#: if a second copy of the first message existed, it would come first.
    p.publish_and_ack("a/marker", QoS::AtMostOnce, b"marker", 0).await;

    let got = sub.expect_publish().await;
    assert_eq!((&*got.topic, got.qos), ("a/b", QoS::ExactlyOnce));
    let marker = sub.expect_publish().await;
    assert_eq!(&*marker.topic, "a/marker", "a second copy of a/b was delivered");
    assert_eq!(marker.qos, QoS::AtMostOnce);
    complete_qos2(&mut sub, got.packet_id).await;
}

/// Subscribes `c` to each `(filter, QoS, Subscription Identifier)`.
async fn subscribe_with_ids(c: &mut TestClient, subs: [(&str, QoS, u32); 2]) {
    for (filter, qos, sub_id) in subs {
        let mut s = subscribe(filter, qos);
        s.packet_id = sub_id as u16;
        s.properties.subscription_identifiers = vec![sub_id];
        c.subscribe_with(s, qos).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_overlapping_subscriptions_get_one_copy_at_the_highest_qos_with_every_identifier() {
    let b = start_default().await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, connect_packet("ov5-one", true)).await;
    subscribe_with_ids(&mut sub, [("a/+", QoS::AtMostOnce, 1), ("a/#", QoS::AtLeastOnce, 2)]).await;
    let mut p = publisher(b.addr).await;
    p.publish_and_ack("a/b", QoS::AtLeastOnce, b"once", 1).await;
    // Matches only a/#: if a second copy of the first message existed, it would come first.
    p.publish_and_ack("a/b/marker", QoS::AtMostOnce, b"marker", 0).await;

    let got = sub.expect_publish().await;
    assert_eq!((&*got.topic, &got.payload[..], got.qos), ("a/b", &b"once"[..], QoS::AtLeastOnce));
    assert_eq!(got.properties.subscription_identifiers, [1, 2], "every identifier, ascending");
    let marker = sub.expect_publish().await;
    assert_eq!(&*marker.topic, "a/b/marker", "a second copy of a/b was delivered");
    assert_eq!(marker.properties.subscription_identifiers, [2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_per_subscription_mode_gets_a_copy_each_with_its_subscription_identifier() {
    let mut config = Config::embedded();
    config.mqtt.overlapping = braid_broker::config::Overlapping::PerSubscription;
    let b = start(config).await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, connect_packet("ov5", true)).await;
    subscribe_with_ids(&mut sub, [("a/#", QoS::AtMostOnce, 1), ("a/b", QoS::ExactlyOnce, 2)]).await;
    let mut p = publisher(b.addr).await;
    p.publish_and_ack("a/b", QoS::ExactlyOnce, b"twice", 1).await;
    p.publish_and_ack("a/marker", QoS::AtMostOnce, b"marker", 0).await;

    let mut copies = Vec::new();
    let mut qos2_id = None;
    for _ in 0..2 {
        let got = sub.expect_publish().await;
        assert_eq!((&*got.topic, &got.payload[..]), ("a/b", &b"twice"[..]));
        if got.qos == QoS::ExactlyOnce {
            qos2_id = Some(got.packet_id);
        }
        copies.push((got.properties.subscription_identifiers.clone(), got.qos));
    }
    copies.sort();
    assert_eq!(copies, [(vec![1], QoS::AtMostOnce), (vec![2], QoS::ExactlyOnce)]);
    let marker = sub.expect_publish().await;
    assert_eq!(&*marker.topic, "a/marker", "a third copy of a/b was delivered");
    assert_eq!(marker.properties.subscription_identifiers, [1]);
    complete_qos2(&mut sub, qos2_id.expect("the QoS 2 copy")).await;
}
