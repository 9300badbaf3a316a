//! Keep alive: idle clients are closed after 1.5 x the interval, a client still sending a large
//! packet is not, and v5 clients are told the keep alive in force (Server Keep Alive).

mod common;

use std::time::{Duration, Instant};

use common::*;

fn with_keep_alive(client_id: &str, secs: u16) -> Connect {
    Connect { keep_alive: secs, ..connect_packet(client_id, true) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_v5_client_gets_disconnect_0x8d_after_one_and_a_half_intervals() {
    let b = start_default().await;
    let (mut c, ack) = TestClient::connect_ok(b.addr, V5, with_keep_alive("idle5", 1)).await;
    assert_eq!(ack.properties.server_keep_alive, None, "1 s is within the maximum");
    let t0 = Instant::now();
    c.expect_disconnect(ReasonCode::KeepAliveTimeout).await;
    let took = t0.elapsed();
    assert!(
        (Duration::from_millis(1000)..=Duration::from_millis(3000)).contains(&took),
        "closed after {took:?}, expected about 1.5 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_v311_client_is_closed_after_one_and_a_half_intervals() {
    let b = start_default().await;
    let (mut c, _) = TestClient::connect_ok(b.addr, V311, with_keep_alive("idle311", 1)).await;
    let t0 = Instant::now();
    assert_eq!(c.expect_closed().await, None, "3.1.1 has no DISCONNECT");
    let took = t0.elapsed();
    assert!(
        (Duration::from_millis(1000)..=Duration::from_millis(3000)).contains(&took),
        "closed after {took:?}, expected about 1.5 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_keep_a_client_alive() {
    let b = start_default().await;
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, with_keep_alive("pinger", 1)).await;
    // Four pings half a second apart: 2 s in total, beyond the 1.5 s grace.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        c.ping().await;
    }
}

/// Braid counts bytes of a packet still arriving as liveness: a 300 KB PUBLISH trickled over
/// about 4 s (keep alive 1 s) must not cost the client its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowly_arriving_large_publish_keeps_the_client_alive() {
    let b = start_default().await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, connect_packet("big-sub", true)).await;
    sub.subscribe("big/data", QoS::AtLeastOnce).await;
    let (mut publisher, _) = TestClient::connect_ok(b.addr, V5, with_keep_alive("big-pub", 1)).await;

    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let p = Publish { packet_id: 42, ..publish("big/data", QoS::AtLeastOnce, payload.clone()) };
    let bytes = encode_packet(&Packet::Publish(p), V5);
    const CHUNKS: usize = 40;
    let chunk = bytes.len().div_ceil(CHUNKS);
    let t0 = Instant::now();
    for (i, piece) in bytes.chunks(chunk).enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        publisher.send_raw(piece).await;
    }
    assert!(
        t0.elapsed() > Duration::from_secs(3),
        "the packet took longer than twice the keep alive to arrive"
    );
    match publisher.expect_packet().await {
        Packet::PubAck(a) => assert_eq!(a.packet_id, 42),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    let got = sub.expect_publish().await;
    assert_eq!(got.payload.len(), payload.len());
    assert!(got.payload[..] == payload[..], "payload arrived intact");
    publisher.ping().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_keep_alive_is_sent_when_the_client_asks_for_none_or_too_much() {
    let mut config = Config::embedded();
    config.mqtt.max_keep_alive = 5;
    let b = start(config).await;

    let (_c, ack) = TestClient::connect_ok(b.addr, V5, with_keep_alive("ka0", 0)).await;
    assert_eq!(ack.properties.server_keep_alive, Some(5), "asked for 0");

    let (_c, ack) = TestClient::connect_ok(b.addr, V5, with_keep_alive("ka60", 60)).await;
    assert_eq!(ack.properties.server_keep_alive, Some(5), "asked for 60");

    let (_c, ack) = TestClient::connect_ok(b.addr, V5, with_keep_alive("ka3", 3)).await;
    assert_eq!(ack.properties.server_keep_alive, None, "3 is allowed as asked");
}

/// The granted Server Keep Alive is the one enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_keep_alive_is_enforced() {
    let mut config = Config::embedded();
    config.mqtt.max_keep_alive = 1;
    let b = start(config).await;
    let (mut c, ack) = TestClient::connect_ok(b.addr, V5, with_keep_alive("ka-enf", 0)).await;
    assert_eq!(ack.properties.server_keep_alive, Some(1));
    c.expect_disconnect(ReasonCode::KeepAliveTimeout).await;
}
