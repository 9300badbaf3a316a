//! The memory alarm, end to end: the broker runs in this process, so the test raises its
//! resident memory above `limits.memory_high_watermark` by allocating, sees publishers stop
//! being read (and `$SYS/broker/memory/alarm` say 1), frees the memory and sees them resume.
//! Alone in its test binary so no other test moves the RSS.

mod common;

use std::time::{Duration, Instant};

use braid_broker::limits::resident_memory;
use common::*;

const BALLAST: usize = 256 << 20;

async fn wait_for(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "{what} within 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_pause_above_the_high_watermark_and_resume_below() {
    let mut config = Config::embedded();
    config.limits.memory_high_watermark = resident_memory().unwrap() + (BALLAST as u64) / 2;
    config.sys.interval_secs = 1;
    let b = start(config).await;
    let (mut watcher, _) = TestClient::connect_ok(b.addr, V5, connect_packet("watcher", true)).await;
    watcher.subscribe("$SYS/broker/memory/alarm", QoS::AtMostOnce).await;
    let (mut publisher, _) = TestClient::connect_ok(b.addr, V5, connect_packet("pub", true)).await;
    publisher.publish_and_ack("m", QoS::AtLeastOnce, b"before", 1).await;

    let ballast = vec![1u8; BALLAST];
    wait_for("alarm raised", || b.broker.memory().is_raised()).await;
    loop {
        let p = watcher.expect_publish().await;
        if &p.payload[..] == b"1" {
            break;
        }
    }
    // The PUBLISH that meets the alarm is handled; the next one is not read.
    publisher.publish_and_ack("m", QoS::AtLeastOnce, b"meets the alarm", 2).await;
    publisher
        .send(Packet::Publish(Publish { packet_id: 3, ..publish("m", QoS::AtLeastOnce, "waits") }))
        .await;
    publisher.expect_nothing(Duration::from_millis(700)).await;
    // Subscribers are still served meanwhile.
    let p = watcher.expect_publish().await;
    assert_eq!(&p.payload[..], b"1");

    assert_eq!(ballast.iter().map(|&b| b as usize).step_by(4096).sum::<usize>(), BALLAST / 4096);
    drop(ballast);
    wait_for("alarm cleared", || !b.broker.memory().is_raised()).await;
    match publisher.expect_packet().await {
        Packet::PubAck(a) => assert_eq!(a.packet_id, 3),
        other => panic!("expected PUBACK 3, got {other:?}"),
    }
}
