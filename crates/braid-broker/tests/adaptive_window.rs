//! The adaptive delivery window: a subscriber that takes its messages slower than they come is
//! sent about what it can take within a round trip, not its whole Receive Maximum; the rest
//! waits in its session queue, where it holds the publisher back, and nothing is lost.

mod common;

use std::collections::VecDeque;
use std::time::Duration;

use common::*;

const MESSAGES: u16 = 1000;
const TOPIC: &str = "aw/t";

/// Publishes `MESSAGES` QoS 1 messages (payload: their number) in batches of 100, each batch
/// acknowledged before the next (the broker's Receive Maximum is 1024).
async fn publish_all(mut publisher: TestClient) {
    for batch in 0..MESSAGES / 100 {
        for n in batch * 100 + 1..=batch * 100 + 100 {
            let p = Publish { packet_id: n, ..publish(TOPIC, QoS::AtLeastOnce, n.to_be_bytes().to_vec()) };
            publisher.queue(Packet::Publish(p));
        }
        publisher.flush().await;
        for _ in 0..100 {
            match publisher.expect_packet().await {
                Packet::PubAck(a) => assert_eq!(a.reason, ReasonCode::Success),
                other => panic!("expected PUBACK, got {other:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_is_sent_what_it_can_take_not_its_whole_receive_maximum() {
    let b = start(Config::embedded()).await; // in-flight cap 1024
                                             // No Receive Maximum in CONNECT: 65,535.
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, connect_packet("slow-sub", true)).await;
    sub.subscribe(TOPIC, QoS::AtLeastOnce).await;
    let (publisher, _) = TestClient::connect_ok(b.addr, V5, connect_packet("fast-pub", true)).await;
    let publishing = tokio::spawn(publish_all(publisher));

    // Every 5 ms the subscriber takes in whatever the broker has sent and processes five
    // messages (1000 messages/s): what it holds unprocessed is what the broker sent ahead.
    let mut unacked = VecDeque::new();
    let mut seen = vec![false; usize::from(MESSAGES) + 1];
    let (mut received, mut most, mut most_later) = (0, 0, 0);
    while received < MESSAGES || !unacked.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
        while let Recv::Packet(p) = sub.recv_within(Duration::ZERO).await {
            let Packet::Publish(p) = p else { panic!("expected PUBLISH, got {p:?}") };
            let n = u16::from_be_bytes(p.payload[..2].try_into().unwrap());
            assert!(!std::mem::replace(&mut seen[usize::from(n)], true), "message {n} twice");
            received += 1;
            unacked.push_back(p.packet_id);
        }
        most = most.max(unacked.len());
        if received > MESSAGES / 2 {
            most_later = most_later.max(unacked.len());
        }
        for id in unacked.drain(..unacked.len().min(5)) {
            sub.queue(Packet::PubAck(Ack::new(id)));
        }
        sub.flush().await;
    }
    publishing.await.unwrap();
    assert_eq!(received, MESSAGES, "every acknowledged message delivered once");
    // A fixed window would have sent up to 1024 ahead; the adaptive one starts at 64 and
    // shrinks once the acknowledgements show a queue in front of the subscriber.
    assert!(most <= 100, "up to {most} deliveries were sent ahead of the subscriber");
    assert!(most_later <= 40, "later, up to {most_later} deliveries were sent ahead");
}
