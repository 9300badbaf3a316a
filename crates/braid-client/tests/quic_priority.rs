//! The broker honours stream priorities on its sending side: over a constrained path, a big
//! message for a high-priority stream overtakes one for a low-priority stream that started
//! first; with equal priorities the one that started first finishes first.

mod common;

use std::time::{Duration, Instant};

use braid_client::{QuicOptions, Transport};
use common::proxy::{udp_proxy, Shape};
use common::*;

/// The path towards the client: 2 MB/s, and a router queue of 32 datagrams.
const TO_CLIENT: Shape = Shape::Paced { bytes_per_sec: 2_000_000, queue: 32 };
const BIG: usize = 1_000_000;

/// Subscribes `low` and `high` on two data streams with the given priorities, publishes a big
/// message for `low`, then one for `high`; returns which finished arriving first.
async fn first_to_arrive(low_priority: i32, high_priority: i32) -> &'static str {
    let b = start_default().await;
    let proxy = udp_proxy(b.quic_addr.unwrap(), Shape::Open, TO_CLIENT).await;
    let mut o = ClientOptions::new(proxy.ip().to_string(), proxy.port());
    o.transport = Transport::Quic(QuicOptions { insecure: true, ..Default::default() });
    let (quic, _) = connect(o).await;
    let low = quic.open_stream(low_priority).await.unwrap();
    let high = quic.open_stream(high_priority).await.unwrap();
    subscribe(&low, "low", QoS::AtLeastOnce).await;
    subscribe(&high, "high", QoS::AtLeastOnce).await;
    let tcp = b.client(V5, "pub").await;
    let payload = Bytes::from(vec![1u8; BIG]);
    let started = Instant::now();
    tcp.publish(Message::new("low", payload.clone(), QoS::AtLeastOnce)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    tcp.publish(Message::new("high", payload, QoS::AtLeastOnce)).await.unwrap();
    let wait = |c: Client| async move {
        tokio::time::timeout(Duration::from_secs(20), next_event(&c)).await.ok();
        started.elapsed()
    };
    let (low_at, high_at) = tokio::join!(wait(low), wait(high));
    assert!(low_at.max(high_at) > Duration::from_millis(800), "the path is constrained");
    if high_at < low_at {
        "high"
    } else {
        "low"
    }
}

#[tokio::test]
async fn the_higher_priority_stream_is_sent_first() {
    assert_eq!(first_to_arrive(1, 100).await, "high", "priority lets the later message overtake");
    // The control: with equal priorities the message that started first is done first, so the
    // order above is the broker's priority at work.
    assert_eq!(first_to_arrive(1, 1).await, "low");
}
