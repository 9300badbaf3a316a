//! Graceful shutdown: cancelling `broker.shutdown` tells v5 clients why (DISCONNECT 0x8B),
//! closes every socket and stops accepting.

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_disconnects_v5_with_0x8b_and_closes_v311() {
    let mut b = start_default().await;
    let (mut v5, _) = TestClient::connect_ok(b.addr, V5, connect_packet("sd-v5", true)).await;
    let (mut v311, _) = TestClient::connect_ok(b.addr, V311, connect_packet("sd-v311", true)).await;
    v5.subscribe("sd/#", QoS::AtLeastOnce).await;
    v311.ping().await;

    b.shutdown().await;

    v5.expect_disconnect(ReasonCode::ServerShuttingDown).await;
    assert_eq!(v311.expect_closed().await, None, "3.1.1 has no DISCONNECT");
    // `Server::run` has returned, so the listener is gone.
    assert!(
        tokio::net::TcpStream::connect(b.addr).await.is_err(),
        "the listener still accepts after shutdown"
    );
}

/// A socket the broker accepted but that has not sent CONNECT yet is a connection too: at
/// shutdown it is closed, not left open until `mqtt.connect_timeout_secs` runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_sockets_still_waiting_for_connect() {
    let mut config = Config::embedded();
    config.mqtt.connect_timeout_secs = 30;
    let mut b = start(config).await;
    let mut silent = TestClient::open(b.addr, V5).await;
    // Accepts are served in order: once a later client has its CONNACK, `silent` was accepted.
    let (_later, _) = TestClient::connect_ok(b.addr, V5, connect_packet("sd-later", true)).await;

    b.shutdown().await;
    assert_eq!(silent.expect_closed().await, None);
}

/// A client whose CONNECT the broker reads after shutdown must not get a DISCONNECT before (or
/// instead of) a CONNACK [MQTT-3.14.0-1]: a refusing CONNACK, or a CONNACK and then DISCONNECT
/// 0x8B, or just a close are all fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_arriving_during_shutdown_gets_no_disconnect_before_connack() {
    let mut b = start_default().await;
    let mut late = TestClient::open(b.addr, V5).await;
    let (_later, _) = TestClient::connect_ok(b.addr, V5, connect_packet("sd-later2", true)).await;

    b.shutdown().await;
    let mut c = connect_packet("sd-late", true);
    c.protocol = V5;
    let connect = encode_packet(&Packet::Connect(Box::new(c)), V5);
    if !late.try_send_raw(&connect).await {
        return; // Already closed: fine.
    }
    match late.recv().await {
        None => {}
        Some(Packet::ConnAck(ack)) if ack.reason == ReasonCode::Success => {
            late.expect_disconnect(ReasonCode::ServerShuttingDown).await;
        }
        Some(Packet::ConnAck(_)) => assert_eq!(late.expect_closed().await, None),
        Some(other) => panic!("first packet after CONNECT was {other:?}, not CONNACK"),
    }
}
