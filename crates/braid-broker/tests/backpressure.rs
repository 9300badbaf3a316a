//! Flow control: a full subscriber queue holds publishers back (their PUBACK waits and nothing
//! more is read from them) instead of dropping; drop policies count exactly what they drop; a
//! subscriber that never drains is disconnected with 0x97 so the others go on.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use braid_broker::config::OverflowPolicy;
use braid_broker::transport::Transport;
use common::*;

/// A v5 subscriber to `filter` at QoS 1 that lets the broker have `receive_maximum` unacked.
async fn subscriber(addr: std::net::SocketAddr, id: &str, filter: &str, receive_maximum: u16) -> TestClient {
    let mut c = connect_packet(id, true);
    c.properties.receive_maximum = Some(receive_maximum);
    let (mut sub, _) = TestClient::connect_ok(addr, V5, c).await;
    sub.subscribe(filter, QoS::AtLeastOnce).await;
    sub
}

/// Sends `n` QoS 1 publishes (ids 1..=n) pipelined, then waits for every PUBACK.
async fn publish_batch(addr: std::net::SocketAddr, id: String, topic: String, n: u16) {
    let (mut c, _) = TestClient::connect_ok(addr, V5, connect_packet(&id, true)).await;
    for i in 1..=n {
        c.queue(Packet::Publish(Publish {
            packet_id: i,
            ..publish(&topic, QoS::AtLeastOnce, format!("{id}:{i}"))
        }));
    }
    c.flush().await;
    for i in 1..=n {
        match c.expect_packet().await {
            Packet::PubAck(a) => assert_eq!(a.packet_id, i),
            other => panic!("{id}: expected PUBACK, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_in_overload_holds_publishers_and_loses_nothing_acknowledged() {
    let mut config = Config::embedded();
    config.session.max_queued_messages = 20;
    let b = start(config).await;
    let mut sub = subscriber(b.addr, "bp-sub", "bp/#", 10).await;
    let publishers: Vec<_> = (0..20)
        .map(|n| tokio::spawn(publish_batch(b.addr, format!("bp-pub-{n}"), format!("bp/{n}"), 50)))
        .collect();

    // A slow consumer: about a millisecond per message.
    let mut seen = HashSet::new();
    while seen.len() < 1000 {
        let p = sub.expect_publish().await;
        assert!(seen.insert(p.payload.clone()), "duplicate {:?}", p.payload);
        tokio::time::sleep(Duration::from_micros(500)).await;
        sub.send(Packet::PubAck(Ack::new(p.packet_id))).await;
    }
    for p in publishers {
        p.await.expect("every publish acknowledged");
    }
    sub.expect_nothing(QUIET).await;
    assert_eq!(b.dropped(), 0, "backpressure drops nothing");
    assert!(
        b.broker.metrics().publishes_held.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "publishers were held"
    );
}

/// A subscriber that takes one message and never acknowledges it, so everything else queues.
async fn stalled_subscriber(addr: std::net::SocketAddr, id: &str, filter: &str) -> TestClient {
    subscriber(addr, id, filter, 1).await
}

/// Where a drop policy is set: for every session, or for the clients of the TCP listener
/// (`[session.listeners.tcp]`, over a `[session]` that says backpressure).
#[derive(Clone, Copy)]
enum Scope {
    Session,
    TcpListener,
}

async fn received_after_drop_policy(policy: OverflowPolicy, scope: Scope) -> (Vec<String>, u64) {
    let mut config = Config::embedded();
    config.session.max_queued_messages = 5;
    match scope {
        Scope::Session => config.session.queue_overflow = policy,
        Scope::TcpListener => config.session.listeners.tcp.queue_overflow = Some(policy),
    }
    let b = start(config).await;
    let mut sub = stalled_subscriber(b.addr, "dp-sub", "dp").await;
    // Not held: with a drop policy every PUBACK comes at once.
    publish_batch(b.addr, "dp-pub".into(), "dp".into(), 20).await;
    // The queue holds five; whether the first message had already moved on into the in-flight
    // window when the sixth arrived depends on timing, so five or six arrive.
    let mut got = Vec::new();
    while let Recv::Packet(Packet::Publish(p)) = sub.recv_within(QUIET).await {
        got.push(p.payload.iter().map(|&b| b as char).collect::<String>());
        sub.send(Packet::PubAck(Ack::new(p.packet_id))).await;
    }
    assert!((5..=6).contains(&got.len()), "received {got:?}");
    (got, b.dropped())
}

fn numbered(range: impl IntoIterator<Item = usize>) -> Vec<String> {
    range.into_iter().map(|i| format!("dp-pub:{i}")).collect()
}

/// Checks what [`received_after_drop_policy`] got under `drop_newest`.
fn assert_dropped_newest((got, dropped): (Vec<String>, u64)) {
    assert_eq!(got, numbered(1..=got.len()), "the oldest were kept");
    assert_eq!(dropped, 20 - got.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_newest_counts_exactly_what_went_missing() {
    assert_dropped_newest(received_after_drop_policy(OverflowPolicy::DropNewest, Scope::Session).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_policy_overrides_the_session_policy_for_its_clients() {
    assert_dropped_newest(received_after_drop_policy(OverflowPolicy::DropNewest, Scope::TcpListener).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_follows_the_policy_of_the_listener_its_client_last_came_through() {
    let mut config = Config::embedded();
    config.session.listeners.ws.queue_overflow = Some(OverflowPolicy::DropOldest);
    config.session.listeners.ws.qos0_pacing_ms = Some(0);
    let b = start(config).await;
    let policies = |transport| {
        let (accepted, ..) = b
            .broker
            .connect(
                &connect_with_expiry("lp", false, 60),
                b.broker.listener_limits(transport),
                braid_broker::session::Origin::default(),
                Instant::now(),
            )
            .unwrap();
        let limits = accepted.session.lock().queue.limits().clone();
        (limits.overflow, limits.qos0_pacing)
    };
    assert_eq!(policies(Transport::Ws), (OverflowPolicy::DropOldest, Duration::ZERO));
    assert_eq!(policies(Transport::Tcp), (OverflowPolicy::Backpressure, Duration::from_millis(1000)));
    assert_eq!(
        policies(Transport::Ws),
        (OverflowPolicy::DropOldest, Duration::ZERO),
        "the same session again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_oldest_counts_exactly_what_went_missing() {
    let (got, dropped) = received_after_drop_policy(OverflowPolicy::DropOldest, Scope::Session).await;
    let mut want = numbered(16..=20);
    if got.len() == 6 {
        want.insert(0, "dp-pub:1".into());
    }
    assert_eq!(got, want, "the newest five were kept (plus the first, if already in flight)");
    assert_eq!(dropped, 20 - got.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_is_disconnected_with_0x97_and_the_others_go_on() {
    let mut config = Config::embedded();
    config.session.max_queued_messages = 5;
    config.session.slow_consumer_timeout_secs = 1;
    let b = start(config).await;
    let mut stalled = stalled_subscriber(b.addr, "sc-stalled", "sc").await;
    let mut healthy = subscriber(b.addr, "sc-healthy", "sc", 100).await;
    let started = Instant::now();
    let publisher = tokio::spawn(publish_batch(b.addr, "sc-pub".into(), "sc".into(), 30));

    let mut got = 0;
    while got < 30 {
        let p = healthy.expect_publish().await;
        healthy.send(Packet::PubAck(Ack::new(p.packet_id))).await;
        got += 1;
    }
    publisher.await.expect("every publish acknowledged");
    let _first = stalled.expect_publish().await;
    stalled.expect_disconnect(ReasonCode::QuotaExceeded).await;
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(900), "evicted after the timeout, not before ({waited:?})");
}

/// QoS 0 messages of 64 KiB: a few dozen fill the socket buffers in front of a subscriber
/// that does not read, so the rest meet its session queue.
const BIG: usize = 64 * 1024;

/// Publishes `n` numbered messages of [`BIG`] bytes to `topic` at `qos`, then waits until the
/// broker has read them all: a PINGRESP after QoS 0, every PUBACK after QoS 1.
async fn flood(addr: std::net::SocketAddr, topic: &'static str, n: u16, qos: QoS) {
    let (mut c, _) = TestClient::connect_ok(addr, V5, connect_packet(&format!("{topic}-pub"), true)).await;
    let packet_id = |i: u16| if qos == QoS::AtMostOnce { 0 } else { i + 1 };
    for i in 0..n {
        let mut payload = format!("{i:08}").into_bytes();
        payload.resize(BIG, b'.');
        c.send(Packet::Publish(Publish { packet_id: packet_id(i), ..publish(topic, qos, payload) })).await;
    }
    if qos == QoS::AtMostOnce {
        c.ping().await;
    }
    for i in (0..n).filter(|_| qos != QoS::AtMostOnce) {
        match c.expect_packet().await {
            Packet::PubAck(a) => assert_eq!(a.packet_id, packet_id(i)),
            other => panic!("expected PUBACK, got {other:?}"),
        }
    }
}

/// The embedded config with session queues of 20 messages and `qos0_pacing_ms`.
fn queue_of_20(qos0_pacing_ms: u64) -> Config {
    let mut config = Config::embedded();
    config.session.max_queued_messages = 20;
    config.session.qos0_pacing_ms = qos0_pacing_ms;
    config
}

/// A QoS 0 subscriber to `topic`.
async fn qos0_subscriber(addr: std::net::SocketAddr, id: &str, topic: &str) -> TestClient {
    let (mut sub, _) = TestClient::connect_ok(addr, V5, connect_packet(id, true)).await;
    sub.subscribe(topic, QoS::AtMostOnce).await;
    sub
}

/// The numbers of the messages `sub` receives until it has been quiet for a while.
async fn numbers_received(sub: &mut TestClient) -> Vec<usize> {
    let mut got = Vec::new();
    while let Recv::Packet(Packet::Publish(p)) = sub.recv_within(Duration::from_secs(1)).await {
        got.push(std::str::from_utf8(&p.payload[..8]).unwrap().parse().unwrap());
    }
    got
}

/// 200 QoS 0 messages to a subscriber that stops reading for 300 ms, on a broker with
/// `config`: what it receives and what the broker dropped.
async fn qos0_flood_through_a_stall(config: Config) -> (Vec<usize>, u64) {
    let b = start(config).await;
    let mut sub = qos0_subscriber(b.addr, "q0-sub", "q0").await;
    let publisher = tokio::spawn(flood(b.addr, "q0", 200, QoS::AtMostOnce));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = numbers_received(&mut sub).await;
    publisher.await.expect("the publisher got through");
    (got, b.dropped())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos0_publisher_is_paced_through_a_subscriber_stall_and_nothing_is_dropped() {
    let (got, dropped) = qos0_flood_through_a_stall(queue_of_20(1000)).await;
    assert_eq!(got, (0..200).collect::<Vec<_>>(), "every message, in order");
    assert_eq!(dropped, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_pacing_time_holds_the_publisher_for_that_long() {
    // Pacing off in [session], on for the TCP listener's subscribers: a held publisher waits
    // by the subscriber's own pacing time, not the global one.
    let mut config = queue_of_20(0);
    config.session.listeners.tcp.qos0_pacing_ms = Some(1000);
    let (got, dropped) = qos0_flood_through_a_stall(config).await;
    assert_eq!(got, (0..200).collect::<Vec<_>>(), "every message, in order");
    assert_eq!(dropped, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pacing_a_subscriber_stall_drops_qos0_and_counts_it() {
    let (got, dropped) = qos0_flood_through_a_stall(queue_of_20(0)).await;
    assert!(got.len() < 200, "the queue of 20 overflowed");
    assert_eq!(dropped, 200 - got.len() as u64, "every missing message is counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_subscriber_paces_qos0_publishers_only_for_the_pacing_time() {
    let b = start(queue_of_20(200)).await;
    let _stuck = qos0_subscriber(b.addr, "q0s-stuck", "q0s").await;
    let mut healthy = qos0_subscriber(b.addr, "q0s-healthy", "q0s").await;
    let started = Instant::now();
    let publisher = tokio::spawn(flood(b.addr, "q0s", 200, QoS::AtMostOnce));
    let got = numbers_received(&mut healthy).await;
    publisher.await.expect("the publisher got through: the stuck subscriber let it go");
    assert_eq!(got, (0..200).collect::<Vec<_>>(), "the healthy subscriber got every message");
    assert!(b.dropped() > 0, "the stuck subscriber's queue overflowed");
    let held = b.broker.metrics().publishes_held.load(std::sync::atomic::Ordering::Relaxed);
    assert!(held > 0, "the publisher was paced at first");
    assert!(started.elapsed() >= Duration::from_millis(200), "paced for the pacing time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_qos0_subscription_paces_a_qos1_publisher_only_for_the_pacing_time() {
    let b = start(queue_of_20(200)).await;
    // QoS 1 messages reach this subscriber as QoS 0: it paces, and is never waited for until
    // the slow-consumer timeout (60 s, far beyond the test's patience for each PUBACK).
    let _stuck = qos0_subscriber(b.addr, "q1p-stuck", "q1p").await;
    flood(b.addr, "q1p", 200, QoS::AtLeastOnce).await;
    assert!(b.dropped() > 0, "the stuck subscriber's queue overflowed");
}
