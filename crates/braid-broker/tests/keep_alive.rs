//! Keep alive over a real socket: a client still sending a large packet is alive. Idle clients,
//! pings and Server Keep Alive are tested on the virtual clock (virtual_clock.rs).

mod common;

use std::time::{Duration, Instant};

use common::*;

fn with_keep_alive(client_id: &str, secs: u16) -> Connect {
    Connect { keep_alive: secs, ..connect_packet(client_id, true) }
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
