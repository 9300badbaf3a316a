//! v5 Session Expiry Interval: an offline session lives that long and no longer.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_ends_after_its_expiry_interval() {
    let b = start_default().await;
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_with_expiry("exp1", true, 1)).await;
    c.subscribe("exp/old", QoS::AtLeastOnce).await;
    c.disconnect().await;
    assert_eq!(b.broker.counts().1, 1, "the offline session keeps its subscription");

    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (mut c, ack) = TestClient::connect_ok(b.addr, V5, connect_with_expiry("exp1", false, 1)).await;
    assert!(!ack.session_present, "the session expired");
    assert_eq!(b.broker.counts().1, 0, "its subscription is gone");

    // Nothing arrives for the old filter: the marker, published after, comes first.
    c.subscribe("exp/marker", QoS::AtLeastOnce).await;
    let (mut p, _) = TestClient::connect_ok(b.addr, V5, connect_packet("exp-pub", true)).await;
    p.publish_and_ack("exp/old", QoS::AtLeastOnce, b"old", 1).await;
    p.publish_and_ack("exp/marker", QoS::AtLeastOnce, b"marker", 2).await;
    assert_eq!(&*c.expect_publish().await.topic, "exp/marker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_within_its_expiry_interval_is_resumed() {
    let b = start_default().await;
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_with_expiry("exp60", true, 60)).await;
    c.subscribe("exp/kept", QoS::AtLeastOnce).await;
    c.drop_socket();
    let (mut p, _) = TestClient::connect_ok(b.addr, V5, connect_packet("exp-pub2", true)).await;
    p.publish_and_ack("exp/kept", QoS::AtLeastOnce, b"queued", 1).await;

    let (mut c, ack) = TestClient::connect_ok(b.addr, V5, connect_with_expiry("exp60", false, 60)).await;
    assert!(ack.session_present);
    assert_eq!(&c.expect_publish().await.payload[..], b"queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_zero_ends_the_session_at_disconnect() {
    let b = start_default().await;
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("exp0", true)).await;
    c.subscribe("exp/zero", QoS::AtLeastOnce).await;
    c.disconnect().await;
    let (_c, ack) = TestClient::connect_ok(b.addr, V5, connect_packet("exp0", false)).await;
    assert!(!ack.session_present);
}
