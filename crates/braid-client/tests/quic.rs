//! MQTT over QUIC through the client library: the control stream, data streams with their own
//! replies and deliveries, 0-RTT on reconnect, and persistent sessions across reconnects.

mod common;

use std::time::Duration;

use braid_client::{QuicOptions, Transport};
use common::*;

fn quic_options(b: &TestBroker, client_id: &str) -> ClientOptions {
    let addr = b.quic_addr.expect("QUIC listener");
    let mut o = ClientOptions::new(addr.ip().to_string(), addr.port());
    o.client_id = client_id.into();
    o.transport = Transport::Quic(QuicOptions { insecure: true, ..Default::default() });
    o
}

#[tokio::test]
async fn control_stream_carries_connect_publish_and_subscribe() {
    let b = start_default().await;
    let (quic, connected) = connect(quic_options(&b, "q1")).await;
    assert!(!connected.session_present);
    subscribe(&quic, "t/#", QoS::AtLeastOnce).await;
    let tcp = b.client(V5, "tcp1").await;
    assert_eq!(publish_acked(&tcp, "t/1", "from tcp", QoS::AtLeastOnce).await, ReasonCode::Success);
    let m = next_message(&quic).await;
    assert_eq!((&*m.topic, &m.payload[..]), ("t/1", &b"from tcp"[..]));
    subscribe(&tcp, "back", QoS::ExactlyOnce).await;
    assert_eq!(publish_acked(&quic, "back", "from quic", QoS::ExactlyOnce).await, ReasonCode::Success);
    assert_eq!(&next_message(&tcp).await.payload[..], b"from quic");
    quic.disconnect(ReasonCode::Success).await.unwrap();
}

#[tokio::test]
async fn data_streams_get_their_own_replies_and_deliveries() {
    let b = start_default().await;
    let (quic, _) = connect(quic_options(&b, "q2")).await;
    let s1 = quic.open_stream(10).await.unwrap();
    let s2 = quic.open_stream(20).await.unwrap();
    assert_ne!(s1.stream_id(), s2.stream_id());
    // SUBACKs come back on the stream of each SUBSCRIBE, or these calls would never return.
    subscribe(&s1, "one", QoS::AtLeastOnce).await;
    subscribe(&s2, "two", QoS::AtLeastOnce).await;
    subscribe(&quic, "zero", QoS::AtLeastOnce).await;
    let tcp = b.client(V5, "pub").await;
    for topic in ["one", "two", "zero"] {
        publish_acked(&tcp, topic, "x", QoS::AtLeastOnce).await;
    }
    assert_eq!(&*next_message(&s1).await.topic, "one");
    assert_eq!(&*next_message(&s2).await.topic, "two");
    assert_eq!(&*next_message(&quic).await.topic, "zero");
    expect_no_event(&s1).await;
    expect_no_event(&s2).await;
    // A publish on a data stream is acknowledged on it (its handle resolves).
    subscribe(&tcp, "up", QoS::AtLeastOnce).await;
    assert_eq!(publish_acked(&s2, "up", "via stream", QoS::ExactlyOnce).await, ReasonCode::Success);
    assert_eq!(&next_message(&tcp).await.payload[..], b"via stream");
    // Closing a data stream leaves the connection up; its subscription falls back to the
    // control stream.
    s1.disconnect(ReasonCode::Success).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    publish_acked(&tcp, "one", "after close", QoS::AtLeastOnce).await;
    assert_eq!(&next_message(&quic).await.payload[..], b"after close");
}

#[tokio::test]
async fn persistent_session_falls_back_to_the_control_stream_after_reconnect() {
    let b = start_default().await;
    let mut o = quic_options(&b, "persist");
    o.session_expiry = Some(600);
    o.receive_maximum = 1;
    let (quic, _) = connect(o.clone()).await;
    let s = quic.open_stream(5).await.unwrap();
    subscribe(&s, "p/#", QoS::AtLeastOnce).await;
    let tcp = b.client(V5, "pub").await;
    publish_acked(&tcp, "p/1", "in flight", QoS::AtLeastOnce).await;
    // Received but not taken (so not acknowledged): in flight when the connection goes.
    within(async {
        while b.messages_sent() < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    drop(s);
    quic.disconnect(ReasonCode::Success).await.unwrap();
    publish_acked(&tcp, "p/2", "queued", QoS::AtLeastOnce).await;
    o.clean_start = false;
    let (again, connected) = connect(o).await;
    assert!(connected.session_present);
    // Both the unacknowledged delivery (resent with DUP) and the queued one arrive on the
    // control stream: the data stream they were subscribed on is gone.
    let first = next_message(&again).await;
    assert_eq!((&first.payload[..], first.dup), (&b"in flight"[..], true));
    assert_eq!(&next_message(&again).await.payload[..], b"queued");
    // Subscribing again on a new data stream moves the subscription there.
    let s = again.open_stream(5).await.unwrap();
    subscribe(&s, "p/#", QoS::AtLeastOnce).await;
    publish_acked(&tcp, "p/3", "moved", QoS::AtLeastOnce).await;
    assert_eq!(&next_message(&s).await.payload[..], b"moved");
    expect_no_event(&again).await;
}

#[tokio::test]
async fn open_stream_needs_quic() {
    let b = start_default().await;
    let tcp = b.client(V5, "tcp").await;
    assert!(matches!(tcp.open_stream(1).await, Err(Error::Protocol(_))));
}

#[tokio::test]
async fn quic_connections_count_towards_the_connection_limit() {
    let mut config = Config::embedded();
    config.limits.max_connections = 1;
    let b = start(config).await;
    let (first, _) = connect(quic_options(&b, "only-one")).await;
    let second = quic_options(&b, "one-too-many");
    let refused = tokio::time::timeout(WAIT, Client::connect(second)).await.expect("refusal timed out");
    assert!(refused.is_err(), "a second connection was accepted over the limit");
    first.disconnect(ReasonCode::Success).await.unwrap();
}

#[tokio::test]
async fn quic_clients_are_authenticated() {
    let mut config = Config::embedded();
    config.auth.allow_anonymous = false;
    let b = start(config).await;
    // Anonymous access is off: a QUIC client without credentials is refused like a TCP one.
    let anonymous = tokio::time::timeout(WAIT, Client::connect(quic_options(&b, "anon"))).await.unwrap();
    assert!(
        matches!(anonymous, Err(braid_client::Error::Refused(ReasonCode::NotAuthorized))),
        "{anonymous:?}"
    );
}

#[tokio::test]
async fn quic_data_streams_follow_the_clients_acl() {
    let rules = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(rules.path(), "allow user:alice both public/#\n").unwrap();
    let mut config = Config::embedded();
    config.acl.file = Some(rules.path().to_path_buf());
    let b = start(config).await;
    let mut o = quic_options(&b, "alice-quic");
    o.username = Some("alice".into());
    let (quic, _) = connect(o).await;
    let stream = quic.open_stream(10).await.unwrap();
    let options = SubscriptionOptions { qos: QoS::AtLeastOnce, ..Default::default() };
    let filters = vec![("public/#".into(), options), ("secret/#".into(), options)];
    let reasons = within(stream.subscribe(filters, Properties::default())).await.unwrap();
    assert_eq!(reasons, vec![ReasonCode::GrantedQoS1, ReasonCode::NotAuthorized]);
}
