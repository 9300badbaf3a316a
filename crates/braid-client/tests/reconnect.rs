//! Lost connections: server DISCONNECT surfaced as an event, keep alive, and reconnect with
//! backoff that resumes the session (queued messages arrive, unacknowledged publishes are
//! resent with DUP, released QoS 2 with PUBREL) or re-subscribes when the session is gone.

mod common;

use std::time::Duration;

use common::*;

fn fast_reconnect(initial_ms: u64) -> Option<Reconnect> {
    Some(Reconnect {
        initial_delay: Duration::from_millis(initial_ms),
        max_delay: Duration::from_millis(initial_ms * 4),
    })
}

async fn expect_connected(c: &Client) -> Connected {
    match next_event(c).await {
        Event::Connected(c) => c,
        other => panic!("expected Connected, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taken_over_client_reconnects_resumes_the_session_and_gets_queued_messages() {
    let b = start_default().await;
    let mut o = b.options(V5, "rc-takeover");
    o.session_expiry = Some(60);
    o.reconnect = fast_reconnect(600);
    let (c, _) = connect(o).await;
    subscribe(&c, "rc/#", QoS::AtLeastOnce).await;

    // Another connection takes the session over, then leaves it (kept for 60 s).
    let mut t = b.options(V5, "rc-takeover");
    t.clean_start = false;
    t.session_expiry = Some(60);
    let (thief, connected) = connect(t).await;
    assert!(connected.session_present);
    assert!(matches!(next_event(&c).await, Event::Disconnected(Some(ReasonCode::SessionTakenOver))));
    within(thief.disconnect(ReasonCode::Success)).await.unwrap();

    // Published while nobody is connected: queued in the session.
    let publisher = b.client(V5, "rc-pub").await;
    for i in 0..3 {
        let h = within(publisher.publish(Message::new("rc/t", format!("queued {i}"), QoS::AtLeastOnce)))
            .await
            .unwrap();
        within(h.acked()).await.unwrap();
    }
    let back = expect_connected(&c).await;
    assert!(back.session_present, "reconnect resumes the session");
    for i in 0..3 {
        assert_eq!(&next_message(&c).await.payload[..], format!("queued {i}").as_bytes());
    }
    publish_acked(&c, "rc/t", "own", QoS::ExactlyOnce).await;
    assert_eq!(&next_message(&c).await.payload[..], b"own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_server_gets_the_subscriptions_again_and_the_publishes_made_offline() {
    let mut b = start_default().await;
    let addr = b.addr;
    let mut o = b.options(V5, "rc-restart");
    o.reconnect = fast_reconnect(50);
    let (c, _) = connect(o).await;
    subscribe(&c, "restart/#", QoS::AtLeastOnce).await;

    b.shutdown().await;
    assert!(matches!(next_event(&c).await, Event::Disconnected(Some(ReasonCode::ServerShuttingDown))));
    // Accepted while offline; sent once connected again.
    let offline =
        within(c.publish(Message::new("restart/own", "made offline", QoS::AtLeastOnce))).await.unwrap();
    let offline_q0 =
        within(c.publish(Message::new("restart/own", "q0 offline", QoS::AtMostOnce))).await.unwrap();
    within(offline_q0.acked()).await.unwrap();

    let mut config = Config::embedded();
    config.listeners.tcp = addr;
    let b2 = start(config).await;
    let back = expect_connected(&c).await;
    assert!(!back.session_present, "a new broker has no session");
    within(offline.acked()).await.unwrap();
    // The client subscribed again before sending what was queued, so it sees its own messages.
    assert_eq!(&next_message(&c).await.payload[..], b"made offline");
    assert_eq!(&next_message(&c).await.payload[..], b"q0 offline");
    let publisher = b2.client(V311, "rc-restart-pub").await;
    publish_acked(&publisher, "restart/t", "after restart", QoS::AtLeastOnce).await;
    assert_eq!(&next_message(&c).await.payload[..], b"after restart");
}

#[tokio::test]
async fn reconnect_resends_unacked_publishes_with_dup_and_pubrel() {
    let server = FakeServer::new().await;
    let mut o = server.options(V5);
    o.client_id = String::new();
    o.session_expiry = Some(100);
    o.reconnect = fast_reconnect(20);
    let assigned = Properties::from(braid_proto::PropertyValues {
        assigned_client_identifier: Some("assigned-1".into()),
        ..Default::default()
    });
    let props = assigned.clone();
    let FakeSession { client, connected, server, mut conn, connect } = server.connect_client(o, props).await;
    assert!(connect.clean_start);
    assert_eq!(connected.client_id, "assigned-1");

    let h1 = within(client.publish(Message::new("d/1", "a", QoS::AtLeastOnce))).await.unwrap();
    let h2 = within(client.publish(Message::new("d/2", "b", QoS::ExactlyOnce))).await.unwrap();
    let h3 = within(client.publish(Message::new("d/3", "c", QoS::ExactlyOnce))).await.unwrap();
    let (p1, p2, p3) =
        (conn.expect_publish().await, conn.expect_publish().await, conn.expect_publish().await);
    assert!(!p1.dup && !p2.dup && !p3.dup);
    conn.send(Packet::PubRec(Ack::new(p2.packet_id))).await;
    assert_eq!(conn.expect().await, Packet::PubRel(Ack::new(p2.packet_id)));
    // A QoS 2 message from the server, taken (PUBREC sent), not yet released.
    conn.send(Packet::Publish(Publish {
        qos: QoS::ExactlyOnce,
        topic: "in/q2".into(),
        packet_id: 9,
        ..Default::default()
    }))
    .await;
    assert_eq!(&*next_message(&client).await.topic, "in/q2");
    assert_eq!(conn.expect().await, Packet::PubRec(Ack::new(9)));
    drop(conn);
    assert!(matches!(next_event(&client).await, Event::Disconnected(None)));

    let (mut conn, connect) = server.accept_ok(true, Properties::default()).await;
    assert!(!connect.clean_start, "reconnects resume the session");
    assert_eq!(&*connect.client_id, "assigned-1", "the assigned client id is used");
    let r1 = conn.expect_publish().await;
    assert_eq!((r1.packet_id, r1.dup, &*r1.topic), (p1.packet_id, true, "d/1"));
    assert_eq!(conn.expect().await, Packet::PubRel(Ack::new(p2.packet_id)));
    let r3 = conn.expect_publish().await;
    assert_eq!((r3.packet_id, r3.dup, &*r3.topic), (p3.packet_id, true, "d/3"));
    assert!(expect_connected(&client).await.session_present);

    // The server resends its PUBREL; the id was remembered across the reconnect.
    conn.send(Packet::PubRel(Ack::new(9))).await;
    assert_eq!(conn.expect().await, Packet::PubComp(Ack::new(9)));
    conn.send(Packet::PubAck(Ack::new(p1.packet_id))).await;
    conn.send(Packet::PubComp(Ack::new(p2.packet_id))).await;
    conn.send(Packet::PubRec(Ack::new(p3.packet_id))).await;
    assert_eq!(conn.expect().await, Packet::PubRel(Ack::new(p3.packet_id)));
    conn.send(Packet::PubComp(Ack::new(p3.packet_id))).await;
    for h in [h1, h2, h3] {
        assert_eq!(within(h.acked()).await.unwrap(), ReasonCode::Success);
    }
    expect_no_event(&client).await;
}

#[tokio::test]
async fn v311_reconnect_keeps_the_clean_session_choice() {
    for clean in [true, false] {
        let server = FakeServer::new().await;
        let mut o = server.options(V311);
        o.clean_start = clean;
        o.reconnect = fast_reconnect(20);
        let FakeSession { client, server, conn, .. } = server.connect_client(o, Properties::default()).await;
        drop(conn);
        assert!(matches!(next_event(&client).await, Event::Disconnected(None)));
        let (_conn, connect) = server.accept_ok(!clean, Properties::default()).await;
        assert_eq!(connect.clean_start, clean, "3.1.1 clean session {clean}");
        assert_eq!(expect_connected(&client).await.session_present, !clean);
    }
}

#[tokio::test]
async fn server_disconnect_is_surfaced_and_ends_a_client_without_reconnect() {
    let server = FakeServer::new().await;
    let o = server.options(V5);
    let FakeSession { client, server: _server, mut conn, .. } =
        server.connect_client(o, Properties::default()).await;
    let h = within(client.publish(Message::new("t", "never acked", QoS::AtLeastOnce))).await.unwrap();
    conn.expect_publish().await;
    let properties = Properties::from(braid_proto::PropertyValues {
        reason_string: Some("maintenance".into()),
        ..Default::default()
    });
    conn.send(Packet::Disconnect(braid_proto::Disconnect {
        reason: ReasonCode::AdministrativeAction,
        properties,
    }))
    .await;
    assert!(matches!(next_event(&client).await, Event::Disconnected(Some(ReasonCode::AdministrativeAction))));
    assert!(within(client.recv()).await.is_none());
    assert!(matches!(within(h.acked()).await, Err(Error::Closed)));
    assert_eq!(conn.recv().await, None, "the client closed the socket");
}

#[tokio::test]
async fn disconnect_while_waiting_to_reconnect_stops_the_client() {
    let server = FakeServer::new().await;
    let mut o = server.options(V5);
    o.reconnect =
        Some(Reconnect { initial_delay: Duration::from_secs(30), max_delay: Duration::from_secs(30) });
    let FakeSession { client, server: _server, conn, .. } =
        server.connect_client(o, Properties::default()).await;
    drop(conn);
    assert!(matches!(next_event(&client).await, Event::Disconnected(None)));
    within(client.disconnect(ReasonCode::Success)).await.unwrap();
    assert!(within(client.recv()).await.is_none());
}

#[tokio::test]
async fn keep_alive_pings_and_gives_up_without_pingresp() {
    let server = FakeServer::new().await;
    let mut o = server.options(V311);
    o.keep_alive = 1;
    let FakeSession { client, server: _server, mut conn, connect, .. } =
        server.connect_client(o, Properties::default()).await;
    assert_eq!(connect.keep_alive, 1);
    for _ in 0..2 {
        assert_eq!(conn.recv_within(Duration::from_millis(1600)).await, Ok(Some(Packet::PingReq)));
        conn.send(Packet::PingResp).await;
    }
    expect_no_event(&client).await;
    // One more PINGREQ, unanswered: the client declares the connection lost.
    assert_eq!(conn.recv_within(Duration::from_millis(1600)).await, Ok(Some(Packet::PingReq)));
    let ev = tokio::time::timeout(Duration::from_secs(3), client.recv()).await.expect("gave up");
    assert!(matches!(ev, Some(Event::Disconnected(None))), "{ev:?}");
}
