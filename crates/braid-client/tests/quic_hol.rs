//! A fast version of the head-of-line blocking experiment (seed 000, `bench/hol/run`): the
//! producer reaches the broker over a path policed to 29 datagrams/s and publishes a small
//! Topic1 message every 100 ms on a high-priority stream while a big Topic2 message is in
//! flight on a low-priority one. Topic1 must keep flowing to the consumer, and nobody is
//! disconnected. And the same with the policer on the other side: the broker delivering
//! Topic1 and a big Topic2 to a multi-stream QUIC subscriber behind it (the broker's pacing).

mod common;

use std::time::{Duration, Instant};

use braid_client::{QuicOptions, Transport};
use common::proxy::{udp_proxy, Shape};
use common::*;

const RUN: Duration = Duration::from_secs(8);
/// Far more than 8 s of the policed path (about 40 KB/s): in flight the whole run.
const BIG: usize = 2_000_000;

/// Publishes a QoS 1 Topic1 message carrying its send time (µs after `started`) every 100 ms
/// until [`RUN`] is over; returns how many.
async fn publish_topic1(started: Instant, mut publish: impl AsyncFnMut(Message)) -> u32 {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut sent = 0u32;
    while started.elapsed() < RUN {
        tick.tick().await;
        let stamp = started.elapsed().as_micros().to_string();
        publish(Message::new("Topic1", stamp, QoS::AtLeastOnce)).await;
        sent += 1;
    }
    sent
}

/// Takes events from `recv` until half a second after [`RUN`]; returns the latencies of the
/// Topic1 messages among them (from the send time each carries).
async fn receive_topic1(started: Instant, mut recv: impl AsyncFnMut() -> Option<Event>) -> Vec<Duration> {
    let mut latencies = Vec::new();
    while started.elapsed() < RUN + Duration::from_millis(500) {
        let Ok(Some(Event::Message(p))) = tokio::time::timeout(Duration::from_millis(600), recv()).await
        else {
            continue;
        };
        let sent_at: u64 = std::str::from_utf8(&p.payload).unwrap().parse().unwrap();
        latencies.push(started.elapsed().saturating_sub(Duration::from_micros(sent_at)));
    }
    latencies
}

// Without pacing this fails: acknowledgements come back at once on this path, so quinn sends
// the packet after each ACK while the policer has no token, and the lost Topic1 data is
// retransmitted in exactly such a packet every time (a few Topic1 messages in 8 s). With
// adaptive pacing (the default) the producer sends within the policer's budget.
#[tokio::test]
async fn topic1_keeps_flowing_over_quic_multi_stream_while_a_big_message_is_in_flight() {
    let b = start_default().await;
    let consumer = b.client(V5, "consumer").await;
    subscribe(&consumer, "Topic1", QoS::AtLeastOnce).await;
    let proxy = udp_proxy(b.quic_addr.unwrap(), Shape::Policed { packets_per_sec: 29 }, Shape::Open).await;
    let mut o = ClientOptions::new(proxy.ip().to_string(), proxy.port());
    o.client_id = "producer".into();
    o.keep_alive = 60;
    o.transport = Transport::Quic(QuicOptions { insecure: true, ..Default::default() });
    let (producer, _) = connect(o).await;
    let topic1 = producer.open_stream(200).await.unwrap();
    let topic2 = producer.open_stream(8).await.unwrap();
    let big = topic2.publish(Message::new("Topic2", vec![0u8; BIG], QoS::AtLeastOnce)).await.unwrap();
    let started = Instant::now();
    let (sent, mut latencies) = tokio::join!(
        publish_topic1(started, async |m| topic1.publish(m).await.map(drop).unwrap()),
        receive_topic1(started, async || consumer.recv().await),
    );
    latencies.sort();
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    let rate = latencies.len() as f64 / RUN.as_secs_f64();
    assert!(latencies.len() as u32 >= sent - 2, "{} of {sent} Topic1 messages arrived", latencies.len());
    assert!(rate >= 9.5, "Topic1 at {rate:.1} msg/s");
    assert!(p99 < Duration::from_secs(1), "Topic1 p99 latency {p99:?}");
    // The big message is still on its way, and the producer was never disconnected.
    assert!(tokio::time::timeout(Duration::from_millis(10), big).await.is_err(), "Topic2 still in flight");
    expect_no_event(&producer).await;
    // Paced: after the first interval of overload, the sender stays within the policer's budget
    // (without pacing, two thirds of the packets are lost).
    let stats = producer.quic_stats().expect("a QUIC connection");
    assert!(stats.path.lost_packets * 3 < stats.path.sent_packets, "{:?}", stats.path);
}

/// Topic1 every 100 ms and one big Topic2, published over a good path, delivered to a QUIC
/// subscriber (Topic1 on a priority-200 stream, Topic2 on a priority-8 one) whose downlink is
/// policed to 29 datagrams/s, with the broker's `quic.pacing`: Topic1's latencies, Topic1
/// messages sent, whether Topic2 was still in flight at the end, and how long connecting and
/// subscribing took (`None`: a SUBACK did not arrive within 20 s; nothing was published).
async fn consumer_behind_a_policer(pacing: &str) -> (Vec<Duration>, u32, bool, Option<Duration>) {
    let mut config = Config::embedded();
    config.quic.pacing = pacing.into();
    let b = start(config).await;
    let proxy = udp_proxy(b.quic_addr.unwrap(), Shape::Open, Shape::Policed { packets_per_sec: 29 }).await;
    let mut o = ClientOptions::new(proxy.ip().to_string(), proxy.port());
    o.client_id = "consumer".into();
    o.keep_alive = 60;
    o.transport = Transport::Quic(QuicOptions { insecure: true, ..Default::default() });
    let setup = Instant::now();
    let (consumer, _) = connect(o).await;
    let topic1 = consumer.open_stream(200).await.unwrap();
    let topic2 = consumer.open_stream(8).await.unwrap();
    let options = SubscriptionOptions { qos: QoS::AtLeastOnce, ..Default::default() };
    for (stream, filter) in [(&topic1, "Topic1"), (&topic2, "Topic2")] {
        let subscribing = stream.subscribe(vec![(filter.into(), options)], Properties::default());
        match tokio::time::timeout(Duration::from_secs(20), subscribing).await {
            Ok(granted) => assert!(!granted.unwrap()[0].is_error()),
            Err(_) => return (Vec::new(), 0, false, None),
        }
    }
    let setup = setup.elapsed();
    let producer = b.client(V5, "producer").await;
    producer.publish(Message::new("Topic2", vec![0u8; BIG], QoS::AtLeastOnce)).await.unwrap().await.unwrap();
    let started = Instant::now();
    let (sent, mut latencies) = tokio::join!(
        publish_topic1(started, async |m| drop(producer.publish(m).await.unwrap())),
        receive_topic1(started, async || topic1.recv().await),
    );
    let in_flight = tokio::time::timeout(Duration::from_millis(10), topic2.recv()).await.is_err();
    expect_no_event(&consumer).await;
    latencies.sort();
    (latencies, sent, in_flight, Some(setup))
}

fn summary(latencies: &[Duration], sent: u32, setup: Option<Duration>) -> String {
    let Some(setup) = setup else { return "no SUBACK within 20 s".into() };
    let p = |q: usize| latencies.get((latencies.len() * q / 100).min(latencies.len().saturating_sub(1)));
    format!(
        "connected and subscribed in {setup:?}; {} of {sent} Topic1 messages, {:.2} msg/s, latency p50 {:?} p99 {:?}",
        latencies.len(),
        latencies.len() as f64 / RUN.as_secs_f64(),
        p(50),
        p(99)
    )
}

#[tokio::test]
async fn the_broker_paces_its_sending_to_a_quic_subscriber_behind_a_policer() {
    let (latencies, sent, in_flight, setup) = consumer_behind_a_policer("adaptive").await;
    let summary = summary(&latencies, sent, setup);
    println!("broker pacing adaptive: {summary}");
    assert!(setup.is_some_and(|s| s < Duration::from_secs(3)), "{summary}");
    assert!(latencies.len() as u32 >= sent - 2, "{summary}");
    assert!(latencies.len() as f64 / RUN.as_secs_f64() >= 9.5, "{summary}");
    assert!(latencies[latencies.len() * 99 / 100] < Duration::from_secs(1), "{summary}");
    assert!(in_flight, "Topic2 still in flight");
}

/// The comparison for bench/HOL.md (`cargo test -p braid-client --test quic_hol -- --ignored
/// --nocapture`): without the broker's pacing, Topic1 to the policed subscriber stalls.
#[tokio::test]
#[ignore = "shows the problem the broker's pacing solves; prints its figures"]
async fn without_broker_pacing_topic1_stalls_behind_the_policer() {
    let (latencies, sent, _, setup) = consumer_behind_a_policer("off").await;
    let summary = summary(&latencies, sent, setup);
    println!("broker pacing off: {summary}");
    let p99 = latencies.get(latencies.len() * 99 / 100).copied().unwrap_or(RUN);
    assert!(
        setup.is_none() || (latencies.len() as f64) < 0.9 * f64::from(sent) || p99 > Duration::from_secs(1),
        "{summary}"
    );
}
