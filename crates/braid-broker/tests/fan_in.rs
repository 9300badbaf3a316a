//! Many concurrent publishers, one subscriber: every QoS 1 message arrives exactly once and
//! each publisher's messages arrive in the order it sent them.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

const PUBLISHERS: usize = 50;
const PER_PUBLISHER: usize = 200;

async fn run_publisher(addr: std::net::SocketAddr, n: usize) {
    let (mut c, _) = TestClient::connect_ok(addr, V5, connect_packet(&format!("fan-{n}"), true)).await;
    let topic = format!("fan/{n}");
    // Pipelined: the whole batch first, then the acknowledgements.
    for seq in 0..PER_PUBLISHER {
        let payload = format!("{n}:{seq}");
        c.queue(Packet::Publish(Publish {
            packet_id: seq as u16 + 1,
            ..publish(&topic, QoS::AtLeastOnce, payload)
        }));
    }
    c.flush().await;
    for seq in 0..PER_PUBLISHER {
        match c.expect_packet().await {
            Packet::PubAck(a) => assert_eq!(a.packet_id, seq as u16 + 1),
            other => panic!("publisher {n}: expected PUBACK, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_publishers_to_one_subscriber_exactly_once_in_order() {
    let mut config = Config::embedded();
    config.session.max_queued_messages = 100_000;
    let b = start(config).await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V311, connect_packet("fan-sub", true)).await;
    sub.subscribe("fan/#", QoS::AtLeastOnce).await;

    let publishers: Vec<_> = (0..PUBLISHERS).map(|n| tokio::spawn(run_publisher(b.addr, n))).collect();

    let total = PUBLISHERS * PER_PUBLISHER;
    let mut next: HashMap<usize, usize> = HashMap::new();
    let collect = async {
        for _ in 0..total {
            let p = sub.expect_publish().await;
            assert_eq!(p.qos, QoS::AtLeastOnce);
            assert!(!p.dup);
            let text = std::str::from_utf8(&p.payload).unwrap();
            let (n, seq) = text.split_once(':').unwrap();
            let (n, seq): (usize, usize) = (n.parse().unwrap(), seq.parse().unwrap());
            assert_eq!(&*p.topic, format!("fan/{n}"));
            let expected = next.entry(n).or_default();
            assert_eq!(seq, *expected, "publisher {n}: out of order or duplicated");
            *expected += 1;
            // Acknowledge in batches: flush when nothing more is buffered.
            sub.queue(Packet::PubAck(Ack::new(p.packet_id)));
            if !sub.has_buffered_packet() {
                sub.flush().await;
            }
        }
        sub.flush().await;
    };
    tokio::time::timeout(Duration::from_secs(20), collect).await.expect("all messages within 20 s");
    for p in publishers {
        p.await.expect("publisher task");
    }
    assert_eq!(next.len(), PUBLISHERS);
    assert!(next.values().all(|&n| n == PER_PUBLISHER));
    sub.expect_nothing(QUIET).await;
    assert_eq!(b.dropped(), 0);
}
