//! Limits: maximum connections, connection rate, per-client publish rate (slowed, never
//! dropped), topic length and levels, subscriptions per client.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// A client `id` connecting now is closed without a CONNACK, and it is the first refusal.
async fn assert_one_more_is_refused(b: &TestBroker, id: &str) {
    let mut extra = TestClient::open(b.addr, V5).await;
    extra.try_send_raw(&encode_packet(&Packet::Connect(Box::new(connect_packet(id, true))), V5)).await;
    assert_eq!(extra.expect_closed().await, None, "closed without CONNACK");
    assert_eq!(braid_broker::metrics::Metrics::get(&b.broker.metrics().connections_refused), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_closes_the_extra_ones() {
    let mut config = Config::embedded();
    config.limits.max_connections = 3;
    let b = start(config).await;
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(TestClient::connect_ok(b.addr, V5, connect_packet(&format!("m{i}"), true)).await.0);
    }
    assert_one_more_is_refused(&b, "m3").await;
    clients.pop().unwrap().disconnect().await;
    // The slot frees once the closed connection's task has ended.
    let deadline = Instant::now() + WAIT;
    loop {
        let mut c = TestClient::open(b.addr, V5).await;
        c.try_send_raw(&encode_packet(&Packet::Connect(Box::new(connect_packet("m4", true))), V5)).await;
        if let Recv::Packet(Packet::ConnAck(a)) = c.recv_within(WAIT).await {
            assert_eq!(a.reason, ReasonCode::Success);
            break;
        }
        assert!(Instant::now() < deadline, "no slot after a client left");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_still_waiting_for_connect_count_toward_max_connections() {
    let mut config = Config::embedded();
    config.limits.max_connections = 3;
    let b = start(config).await;
    // Connected, CONNECT not sent: they hold their slots all the same (accepts are in order,
    // so they are counted before the next one is admitted).
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(TestClient::open(b.addr, V5).await);
    }
    assert_one_more_is_refused(&b, "w3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_rate_paces_accepts() {
    let mut config = Config::embedded();
    config.limits.max_connection_rate = 20;
    let b = start(config).await;
    let started = Instant::now();
    let mut clients = Vec::new();
    for i in 0..40 {
        clients.push(TestClient::connect_ok(b.addr, V5, connect_packet(&format!("r{i}"), true)).await.0);
    }
    let took = started.elapsed();
    // A burst of one second's worth (20), then one every 50 ms: at least ~1 s for 40.
    assert!(took >= Duration::from_millis(900), "40 connections at 20/s took only {took:?}");
}

/// Publishes `n` QoS 0 messages of `size` bytes as fast as the socket takes them; returns how
/// long until the subscriber had them all (asserting none was lost).
async fn timed_stream(config: Config, n: usize, size: usize) -> Duration {
    let b = start(config).await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, connect_packet("rate-sub", true)).await;
    sub.subscribe("rate/t", QoS::AtMostOnce).await;
    let (mut publisher, _) = TestClient::connect_ok(b.addr, V5, connect_packet("rate-pub", true)).await;
    let started = Instant::now();
    for _ in 0..n {
        publisher.queue(Packet::Publish(publish("rate/t", QoS::AtMostOnce, vec![b'x'; size])));
    }
    publisher.flush().await;
    for i in 0..n {
        match sub.recv_within(Duration::from_secs(10)).await {
            Recv::Packet(Packet::Publish(_)) => {}
            other => panic!("message {i} of {n}: {other:?}"),
        }
    }
    assert_eq!(b.dropped(), 0);
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_rate_slows_the_client_without_dropping() {
    let mut config = Config::embedded();
    config.limits.publish_rate = 50;
    let took = timed_stream(config, 100, 10).await;
    assert!(took >= Duration::from_millis(900), "100 messages at 50/s took only {took:?}");

    let mut config = Config::embedded();
    config.limits.publish_bytes_rate = 10_000;
    // 20 x (6 + 1000) bytes at 10 kB/s: 10 kB at once, the rest over ~1 s.
    let took = timed_stream(config, 20, 1000).await;
    assert!(took >= Duration::from_millis(900), "20 kB at 10 kB/s took only {took:?}");

    let quick = timed_stream(Config::embedded(), 100, 10).await;
    println!("unlimited: 100 messages in {quick:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_rate_stays_alive_past_its_keep_alive() {
    let mut config = Config::embedded();
    config.limits.publish_rate = 1;
    let b = start(config).await;
    let mut c = connect_packet("slowed", true);
    c.keep_alive = 1;
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, c).await;
    // Three messages at 1/s: the client is not read from for ~2 s, longer than 1.5 x keep alive,
    // and that silence is the broker's doing, not the client's.
    for id in 1..=3 {
        c.queue(Packet::Publish(Publish { packet_id: id, ..publish("slow", QoS::AtLeastOnce, "x") }));
    }
    c.flush().await;
    for id in 1..=3 {
        match c.recv_within(Duration::from_secs(4)).await {
            Recv::Packet(Packet::PubAck(a)) => assert_eq!(a.packet_id, id),
            other => panic!("PUBACK {id}: {other:?}"),
        }
    }
    c.ping().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_length_and_levels() {
    let mut config = Config::embedded();
    config.limits.max_topic_length = 64;
    config.limits.max_topic_levels = 8;
    let b = start(config).await;
    let mut canary = Canary::new(b.addr, "t").await;
    let deep = ["a"; 9].join("/");
    let long = "x".repeat(65);
    for topic in [&deep, &long] {
        let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("deep", true)).await;
        c.send(Packet::Publish(publish(topic, QoS::AtMostOnce, "x"))).await;
        assert_eq!(c.expect_closed().await, Some(ReasonCode::TopicNameInvalid), "{topic}");
        let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("deep-sub", true)).await;
        c.send(Packet::Subscribe(subscribe(topic, QoS::AtMostOnce))).await;
        assert!(
            matches!(c.expect_packet().await, Packet::SubAck(a) if a.reasons == [ReasonCode::TopicFilterInvalid])
        );
        canary.check().await;
    }
    let ok = ["a"; 8].join("/");
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("ok", true)).await;
    c.subscribe(&ok, QoS::AtMostOnce).await;
    c.publish_and_ack(&ok, QoS::AtLeastOnce, b"x", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_subscriptions_per_client() {
    let mut config = Config::embedded();
    config.limits.max_subscriptions = 2;
    let b = start(config).await;
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("subs", true)).await;
    c.subscribe("a", QoS::AtMostOnce).await;
    c.subscribe("b", QoS::AtMostOnce).await;
    c.send(Packet::Subscribe(subscribe("c", QoS::AtMostOnce))).await;
    assert!(matches!(c.expect_packet().await, Packet::SubAck(a) if a.reasons == [ReasonCode::QuotaExceeded]));
    c.subscribe("a", QoS::AtLeastOnce).await; // replacing one is fine
    let (mut v3, _) = TestClient::connect_ok(b.addr, V311, connect_packet("subs3", true)).await;
    v3.subscribe("a", QoS::AtMostOnce).await;
    v3.subscribe("b", QoS::AtMostOnce).await;
    v3.send(Packet::Subscribe(subscribe("c", QoS::AtMostOnce))).await;
    assert!(
        matches!(v3.expect_packet().await, Packet::SubAck(a) if a.reasons == [ReasonCode::UnspecifiedError])
    );
}
