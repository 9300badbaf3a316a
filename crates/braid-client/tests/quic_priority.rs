//! The broker honours stream priorities on its sending side: over a constrained path, a big
//! message for a high-priority stream overtakes one for a low-priority stream that started
//! first; with equal priorities the one that started first finishes first.

mod common;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_client::{QuicOptions, Transport};
use common::*;
use tokio::net::UdpSocket;

/// Bytes per second the proxy lets through towards the client.
const RATE: u64 = 2_000_000;
/// Datagrams queued towards the client before the proxy drops (a router's drop-tail queue).
const QUEUE: usize = 32;
const BIG: usize = 1_000_000;

/// A UDP proxy: client -> broker passes at once, broker -> client is paced to [`RATE`].
async fn constrained_proxy(broker: SocketAddr) -> SocketAddr {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    back.connect(broker).await.unwrap();
    let addr = front.local_addr().unwrap();
    let client = Arc::new(tokio::sync::Mutex::new(None::<SocketAddr>));
    let (f, b, c) = (front.clone(), back.clone(), client.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = f.recv_from(&mut buf).await {
            *c.lock().await = Some(from);
            let _ = b.send(&buf[..n]).await;
        }
    });
    tokio::spawn(async move {
        let mut queue: VecDeque<Vec<u8>> = VecDeque::new();
        let mut buf = vec![0u8; 65536];
        let mut credit = 0f64;
        let mut last = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        loop {
            tokio::select! {
                r = back.recv(&mut buf) => match r {
                    Ok(n) if queue.len() < QUEUE => queue.push_back(buf[..n].to_vec()),
                    Ok(_) => {}
                    Err(_) => return,
                },
                _ = tick.tick() => {
                    let now = Instant::now();
                    credit = (credit + now.duration_since(last).as_secs_f64() * RATE as f64).min(20_000.0);
                    last = now;
                    let to = *client.lock().await;
                    while let (Some(p), Some(to)) = (queue.front(), to) {
                        if credit < p.len() as f64 {
                            break;
                        }
                        credit -= p.len() as f64;
                        let _ = front.send_to(p, to).await;
                        queue.pop_front();
                    }
                }
            }
        }
    });
    addr
}

/// Subscribes `low` and `high` on two data streams with the given priorities, publishes a big
/// message for `low`, then one for `high`; returns which finished arriving first.
async fn first_to_arrive(low_priority: i32, high_priority: i32) -> &'static str {
    let b = start_default().await;
    let proxy = constrained_proxy(b.quic_addr.unwrap()).await;
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
