//! A full queue of an offline persistent session drops by `session.queue_overflow` and counts
//! every drop in `messages_dropped`.

mod common;

use braid_broker::config::OverflowPolicy;
use common::*;

/// Queues 10 QoS 1 messages for an offline session limited to 3 and returns the payloads it
/// receives on resume, with the broker's drop count.
async fn queue_ten(policy: OverflowPolicy, version: ProtocolVersion) -> (Vec<String>, u64) {
    let mut config = Config::embedded();
    config.session.max_queued_messages = 3;
    config.session.queue_overflow = policy;
    let b = start(config).await;
    let connect = || {
        if version.is_v5() {
            connect_with_expiry("offline", false, 300)
        } else {
            connect_packet("offline", false)
        }
    };
    let (mut sub, _) = TestClient::connect_ok(b.addr, version, connect()).await;
    sub.subscribe("q/#", QoS::AtLeastOnce).await;
    sub.disconnect().await;

    let (mut publisher, _) = TestClient::connect_ok(b.addr, V5, connect_packet("q-pub", true)).await;
    for i in 0..10u16 {
        publisher.publish_and_ack("q/t", QoS::AtLeastOnce, format!("m{i}").as_bytes(), i + 1).await;
    }
    let dropped = b.dropped();

    let (mut sub, ack) = TestClient::connect_ok(b.addr, version, connect()).await;
    assert!(ack.session_present);
    let mut got = Vec::new();
    for _ in 0..3 {
        let p = sub.expect_publish().await;
        sub.send(Packet::PubAck(Ack::new(p.packet_id))).await;
        got.push(String::from_utf8(p.payload.to_vec()).unwrap());
    }
    sub.expect_nothing(QUIET).await;
    assert_eq!(b.dropped(), dropped, "nothing dropped on resume");
    (got, dropped)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_oldest_keeps_the_newest_three() {
    let (got, dropped) = queue_ten(OverflowPolicy::DropOldest, V311).await;
    assert_eq!(got, ["m7", "m8", "m9"]);
    assert_eq!(dropped, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_newest_keeps_the_oldest_three() {
    let (got, dropped) = queue_ten(OverflowPolicy::DropNewest, V311).await;
    assert_eq!(got, ["m0", "m1", "m2"]);
    assert_eq!(dropped, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_oldest_keeps_the_newest_three_v5() {
    let (got, dropped) = queue_ten(OverflowPolicy::DropOldest, V5).await;
    assert_eq!(got, ["m7", "m8", "m9"]);
    assert_eq!(dropped, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_newest_keeps_the_oldest_three_v5() {
    let (got, dropped) = queue_ten(OverflowPolicy::DropNewest, V5).await;
    assert_eq!(got, ["m0", "m1", "m2"]);
    assert_eq!(dropped, 7);
}
