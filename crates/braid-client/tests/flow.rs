//! Flow control both ways: the outbound window (max_inflight and the server's Receive
//! Maximum) makes `publish` wait, and inbound messages are acknowledged only when the
//! application takes them, so our Receive Maximum is a real prefetch limit. Also inbound QoS 2
//! exactly-once against a scripted server.

mod common;

use std::time::Duration;

use common::*;

fn publish_packet(id: u16, qos: QoS, topic: &str, dup: bool) -> Packet {
    Packet::Publish(Publish {
        dup,
        qos,
        topic: topic.into(),
        packet_id: id,
        payload: Bytes::from(format!("m{id}")),
        ..Default::default()
    })
}

#[tokio::test]
async fn third_publish_waits_for_an_ack_with_max_inflight_2() {
    let server = FakeServer::new().await;
    let mut o = server.options(V5);
    o.max_inflight = 2;
    let props =
        Properties::from(braid_proto::PropertyValues { receive_maximum: Some(10), ..Default::default() });
    let FakeSession { client, server: _server, mut conn, .. } = server.connect_client(o, props).await;

    let h1 = within(client.publish(Message::new("w/1", "a", QoS::AtLeastOnce))).await.unwrap();
    let h2 = within(client.publish(Message::new("w/2", "b", QoS::ExactlyOnce))).await.unwrap();
    let c3 = client.clone();
    let third = tokio::spawn(async move { c3.publish(Message::new("w/3", "c", QoS::AtLeastOnce)).await });
    let p1 = conn.expect_publish().await;
    let p2 = conn.expect_publish().await;
    assert_eq!((&*p1.topic, &*p2.topic), ("w/1", "w/2"));
    // The window is full: the third publish neither returns nor reaches the wire.
    conn.expect_nothing().await;
    assert!(!third.is_finished(), "publish must wait for a free slot");

    // PUBREC does not free a QoS 2 slot; PUBCOMP does.
    conn.send(Packet::PubRec(Ack::new(p2.packet_id))).await;
    assert_eq!(conn.expect().await, Packet::PubRel(Ack::new(p2.packet_id)));
    conn.expect_nothing().await;
    assert!(!third.is_finished());
    conn.send(Packet::PubComp(Ack::new(p2.packet_id))).await;
    assert_eq!(within(h2.acked()).await.unwrap(), ReasonCode::Success);
    let h3 = within(third).await.unwrap().expect("third publish");
    let p3 = conn.expect_publish().await;
    assert_eq!(&*p3.topic, "w/3");
    assert_ne!(p3.packet_id, p1.packet_id, "in-flight ids are not reused");

    conn.send(Packet::PubAck(Ack::new(p3.packet_id))).await;
    conn.send(Packet::PubAck(Ack::with_reason(p1.packet_id, ReasonCode::NoMatchingSubscribers))).await;
    assert_eq!(within(h3.acked()).await.unwrap(), ReasonCode::Success);
    assert_eq!(within(h1.acked()).await.unwrap(), ReasonCode::NoMatchingSubscribers);
}

#[tokio::test]
async fn server_receive_maximum_caps_the_window() {
    let server = FakeServer::new().await;
    let mut o = server.options(V5);
    o.max_inflight = 100;
    let props =
        Properties::from(braid_proto::PropertyValues { receive_maximum: Some(1), ..Default::default() });
    let FakeSession { client, server: _server, mut conn, .. } = server.connect_client(o, props).await;
    let c2 = client.clone();
    let publisher = tokio::spawn(async move {
        let mut handles = Vec::new();
        for i in 0..3 {
            handles.push(c2.publish(Message::new("rm/t", format!("{i}"), QoS::AtLeastOnce)).await.unwrap());
        }
        handles
    });
    for i in 0..3 {
        let p = conn.expect_publish().await;
        assert_eq!(&p.payload[..], format!("{i}").as_bytes());
        conn.expect_nothing().await;
        conn.send(Packet::PubAck(Ack::new(p.packet_id))).await;
    }
    for h in within(publisher).await.unwrap() {
        within(h.acked()).await.unwrap();
    }
    // QoS 0 does not use the window.
    let p = within(client.publish(Message::new("rm/q0", "z", QoS::AtMostOnce))).await.unwrap();
    within(p.acked()).await.unwrap();
    assert_eq!(&*conn.expect_publish().await.topic, "rm/q0");
}

#[tokio::test]
async fn publish_failures_resolve_the_handle_and_free_the_slot() {
    let server = FakeServer::new().await;
    let mut o = server.options(V5);
    o.max_inflight = 1;
    let FakeSession { client, server: _server, mut conn, .. } =
        server.connect_client(o, Properties::default()).await;
    let h = within(client.publish(Message::new("f/1", "a", QoS::ExactlyOnce))).await.unwrap();
    let p = conn.expect_publish().await;
    conn.send(Packet::PubRec(Ack::with_reason(p.packet_id, ReasonCode::QuotaExceeded))).await;
    assert!(matches!(within(h.acked()).await, Err(Error::Rejected(ReasonCode::QuotaExceeded))));
    // No PUBREL after a failed PUBREC, and the slot is free again.
    let h = within(client.publish(Message::new("f/2", "b", QoS::AtLeastOnce))).await.unwrap();
    let p = conn.expect_publish().await;
    assert_eq!(&*p.topic, "f/2");
    conn.send(Packet::PubAck(Ack::with_reason(p.packet_id, ReasonCode::NotAuthorized))).await;
    assert!(matches!(within(h.acked()).await, Err(Error::Rejected(ReasonCode::NotAuthorized))));
}

#[tokio::test]
async fn server_limits_from_connack_are_checked_before_sending() {
    let server = FakeServer::new().await;
    let o = server.options(V5);
    let props = Properties::from(braid_proto::PropertyValues {
        maximum_qos: Some(1),
        retain_available: Some(0),
        maximum_packet_size: Some(64),
        ..Default::default()
    });
    let FakeSession { client, server: _server, mut conn, .. } = server.connect_client(o, props).await;
    let r = client.publish(Message::new("l/t", "x", QoS::ExactlyOnce)).await;
    assert!(matches!(r, Err(Error::Rejected(ReasonCode::QoSNotSupported))), "{r:?}");
    let r = client.publish(Message::new("l/t", "x", QoS::AtMostOnce).retain(true)).await;
    assert!(matches!(r, Err(Error::Rejected(ReasonCode::RetainNotSupported))), "{r:?}");
    let r = client.publish(Message::new("l/t", vec![0u8; 100], QoS::AtMostOnce)).await;
    assert!(matches!(r, Err(Error::Rejected(ReasonCode::PacketTooLarge))), "{r:?}");
    conn.expect_nothing().await;
    let h = within(client.publish(Message::new("l/t", "small", QoS::AtLeastOnce))).await.unwrap();
    let p = conn.expect_publish().await;
    assert_eq!(&p.payload[..], b"small");
    conn.send(Packet::PubAck(Ack::new(p.packet_id))).await;
    within(h.acked()).await.unwrap();
}

#[tokio::test]
async fn acks_are_sent_when_the_application_takes_the_message() {
    let server = FakeServer::new().await;
    let o = server.options(V311);
    let FakeSession { client, server: _server, mut conn, .. } =
        server.connect_client(o, Properties::default()).await;
    conn.send(publish_packet(1, QoS::AtLeastOnce, "a/1", false)).await;
    conn.send(publish_packet(2, QoS::ExactlyOnce, "a/2", false)).await;
    conn.send(publish_packet(0, QoS::AtMostOnce, "a/0", false)).await;
    conn.expect_nothing().await;
    assert_eq!(&*next_message(&client).await.topic, "a/1");
    assert_eq!(conn.expect().await, Packet::PubAck(Ack::new(1)));
    conn.expect_nothing().await;
    assert_eq!(&*next_message(&client).await.topic, "a/2");
    assert_eq!(conn.expect().await, Packet::PubRec(Ack::new(2)));
    assert_eq!(&*next_message(&client).await.topic, "a/0");
    conn.send(Packet::PubRel(Ack::new(2))).await;
    assert_eq!(conn.expect().await, Packet::PubComp(Ack::new(2)));
    conn.expect_nothing().await;
}

#[tokio::test]
async fn inbound_qos2_is_delivered_exactly_once() {
    let server = FakeServer::new().await;
    let o = server.options(V5);
    let FakeSession { client, server: _server, mut conn, .. } =
        server.connect_client(o, Properties::default()).await;
    conn.send(publish_packet(5, QoS::ExactlyOnce, "x/1", false)).await;
    // Resent before we acknowledged: not delivered again, not acknowledged yet.
    conn.send(publish_packet(5, QoS::ExactlyOnce, "x/1", true)).await;
    let p = next_message(&client).await;
    assert_eq!((p.packet_id, p.dup), (5, false));
    assert_eq!(conn.expect().await, Packet::PubRec(Ack::new(5)));
    // Resent after our PUBREC (as if it was lost): PUBREC again, still one delivery.
    conn.send(publish_packet(5, QoS::ExactlyOnce, "x/1", true)).await;
    assert_eq!(conn.expect().await, Packet::PubRec(Ack::new(5)));
    expect_no_event(&client).await;
    conn.send(Packet::PubRel(Ack::new(5))).await;
    assert_eq!(conn.expect().await, Packet::PubComp(Ack::new(5)));
    // After PUBREL the id is free: a new message with it is a new message.
    conn.send(publish_packet(5, QoS::ExactlyOnce, "x/2", false)).await;
    assert_eq!(&*next_message(&client).await.topic, "x/2");
    assert_eq!(conn.expect().await, Packet::PubRec(Ack::new(5)));
    // PUBREL for an id we do not know.
    conn.send(Packet::PubRel(Ack::new(77))).await;
    assert_eq!(
        conn.expect().await,
        Packet::PubComp(Ack::with_reason(77, ReasonCode::PacketIdentifierNotFound))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_maximum_2_bounds_unacked_deliveries_from_the_broker() {
    let b = start_default().await;
    let mut o = b.options(V5, "rm-sub");
    o.receive_maximum = 2;
    let (sub, connected) = connect(o).await;
    assert!(connected.properties.receive_maximum.is_some());
    subscribe(&sub, "rm/#", QoS::ExactlyOnce).await;
    let publisher = b.client(V5, "rm-pub").await;
    for i in 0..6 {
        let qos = if i % 2 == 0 { QoS::AtLeastOnce } else { QoS::ExactlyOnce };
        let h = within(publisher.publish(Message::new("rm/t", format!("{i}"), qos))).await.unwrap();
        // Acknowledged by the broker: routed into the subscriber's session.
        within(h.acked()).await.unwrap();
    }
    // We take nothing: the broker may send exactly two, and must then wait for our acks.
    eventually("two deliveries", || b.messages_sent() == 2).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(b.messages_sent(), 2, "the broker sent more than Receive Maximum unacknowledged messages");
    // Each message taken acknowledges one delivery, which lets exactly one more out.
    for i in 0..6u64 {
        let p = next_message(&sub).await;
        assert_eq!(&p.payload[..], i.to_string().as_bytes());
        let expected = (i + 3).min(6);
        eventually("one more delivery", || b.messages_sent() == expected).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(b.messages_sent(), expected, "after taking message {i}");
    }
    expect_no_event(&sub).await;
}

#[tokio::test]
async fn a_full_event_queue_pauses_reading_but_not_writing_and_loses_nothing() {
    let server = FakeServer::new().await;
    let o = server.options(V5);
    let FakeSession { client, server: _server, mut conn, .. } =
        server.connect_client(o, Properties::default()).await;
    // Far more than the event queue holds, while the application takes nothing.
    const N: u16 = 3000;
    for i in 0..N {
        let qos = if i % 3 == 0 { QoS::AtLeastOnce } else { QoS::AtMostOnce };
        conn.send(Packet::Publish(Publish {
            qos,
            topic: "flood".into(),
            packet_id: if qos == QoS::AtMostOnce { 0 } else { i + 1 },
            payload: Bytes::from(i.to_string()),
            ..Default::default()
        }))
        .await;
    }
    // Writing goes on while reading is paused.
    let h = within(client.publish(Message::new("out", "still writing", QoS::AtMostOnce))).await.unwrap();
    within(h.acked()).await.unwrap();
    assert_eq!(&conn.expect_publish().await.payload[..], b"still writing");
    for i in 0..N {
        let p = next_message(&client).await;
        assert_eq!(&p.payload[..], i.to_string().as_bytes());
    }
    // Acks for the QoS 1 messages went out as they were taken, in order.
    for i in (0..N).step_by(3) {
        assert_eq!(conn.expect().await, Packet::PubAck(Ack::new(i + 1)));
    }
}
