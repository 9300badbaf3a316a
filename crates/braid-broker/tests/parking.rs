//! Idle plain-TCP connections park (their task and buffers are freed) and come back on bytes
//! from the client, a delivery, a close, a takeover or shutdown, with nothing lost.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// A broker whose idle connections park after one second.
async fn start_parking() -> TestBroker {
    let mut config = Config::embedded();
    config.listeners.park_after_secs = 1;
    start(config).await
}

fn parked(b: &TestBroker) -> usize {
    b.broker.parked()
}

/// Waits (bounded) until `n` connections are parked.
async fn until_parked(b: &TestBroker, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(6);
    while parked(b) != n {
        assert!(Instant::now() < deadline, "expected {n} parked connections, have {}", parked(b));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_connections_publish_and_receive() {
    let b = start_parking().await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, connect_packet("park-sub", true)).await;
    sub.subscribe("park/t", QoS::AtLeastOnce).await;
    let (mut publisher, _) = TestClient::connect_ok(b.addr, V5, connect_packet("park-pub", true)).await;
    for round in 0..3u8 {
        until_parked(&b, 2).await;
        // Bytes wake the publisher; the delivery wakes the subscriber.
        publisher.publish_and_ack("park/t", QoS::AtLeastOnce, &[round], 1).await;
        let p = sub.expect_publish().await;
        assert_eq!((&*p.topic, &p.payload[..]), ("park/t", &[round][..]));
        sub.send(Packet::PubAck(Ack::new(p.packet_id))).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parking_can_be_turned_off() {
    let mut config = Config::embedded();
    config.listeners.park_after_secs = 0;
    let b = start(config).await;
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("never-parks", true)).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(parked(&b), 0);
    c.ping().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_aliases_survive_parking() {
    let b = start_parking().await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, connect_packet("alias-sub", true)).await;
    sub.subscribe("alias/topic", QoS::AtMostOnce).await;
    let (mut publisher, _) = TestClient::connect_ok(b.addr, V5, connect_packet("alias-pub", true)).await;
    let mut first = publish("alias/topic", QoS::AtMostOnce, "one");
    first.properties.topic_alias = Some(1);
    publisher.send(Packet::Publish(first)).await;
    assert_eq!(&sub.expect_publish().await.payload[..], b"one");
    until_parked(&b, 2).await;
    let mut by_alias = publish("", QoS::AtMostOnce, "two");
    by_alias.properties.topic_alias = Some(1);
    publisher.send(Packet::Publish(by_alias)).await;
    let p = sub.expect_publish().await;
    assert_eq!((&*p.topic, &p.payload[..]), ("alias/topic", &b"two"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_client_that_goes_silent_gets_keep_alive_timeout_and_its_will_goes_out() {
    let b = start_parking().await;
    let (mut watcher, _) = TestClient::connect_ok(b.addr, V5, connect_packet("will-watch", true)).await;
    watcher.subscribe("wills/#", QoS::AtMostOnce).await;
    let mut c = connect_packet("sleepy", true);
    c.keep_alive = 2;
    c.will = will("wills/sleepy", b"gone");
    let (mut sleepy, _) = TestClient::connect_ok(b.addr, V5, c).await;
    until_parked(&b, 2).await;
    // Keep alive 2 s: closed 3 s after its last byte, though parked.
    sleepy.expect_disconnect(ReasonCode::KeepAliveTimeout).await;
    assert_eq!(&watcher.expect_publish().await.payload[..], b"gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_client_that_drops_its_socket_is_noticed() {
    let b = start_parking().await;
    let (mut watcher, _) = TestClient::connect_ok(b.addr, V5, connect_packet("drop-watch", true)).await;
    watcher.subscribe("wills/#", QoS::AtMostOnce).await;
    let mut c = connect_packet("dropper", true);
    c.will = will("wills/dropper", b"dropped");
    let (dropper, _) = TestClient::connect_ok(b.addr, V5, c).await;
    until_parked(&b, 2).await;
    dropper.drop_socket();
    assert_eq!(&watcher.expect_publish().await.payload[..], b"dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_session_can_be_taken_over() {
    let b = start_parking().await;
    let (mut old, _) = TestClient::connect_ok(b.addr, V5, connect_packet("twice", true)).await;
    until_parked(&b, 1).await;
    let (mut new, _) = TestClient::connect_ok(b.addr, V5, connect_packet("twice", false)).await;
    old.expect_disconnect(ReasonCode::SessionTakenOver).await;
    new.ping().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_reaches_parked_connections() {
    let mut b = start_parking().await;
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("parked-at-shutdown", true)).await;
    until_parked(&b, 1).await;
    b.shutdown().await;
    c.expect_disconnect(ReasonCode::ServerShuttingDown).await;
}
