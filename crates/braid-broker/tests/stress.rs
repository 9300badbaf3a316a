//! Stress: 2000 hostile connections (slow-loris, silent sockets, garbage after CONNECT,
//! connect/close churn) interleaved with a legitimate QoS 1 stream. The stream must lose
//! nothing; its p99 latency is printed next to a quiet run's (the bar is 2x). No timed
//! assertion: the figure depends on the machine.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOSTILE: usize = 2000;
const MESSAGES: u32 = 1000;
/// `limits.max_connection_rate` for the run.
const RATE: u32 = 200;

/// The legitimate publisher and subscriber, connected.
async fn legit_clients(addr: std::net::SocketAddr, name: &str) -> (TestClient, TestClient) {
    let (mut sub, _) = TestClient::connect_ok(addr, V5, connect_packet(&format!("{name}-sub"), true)).await;
    sub.subscribe(&format!("legit/{name}"), QoS::AtLeastOnce).await;
    let (publisher, _) = TestClient::connect_ok(addr, V5, connect_packet(&format!("{name}-pub"), true)).await;
    (publisher, sub)
}

/// Runs the QoS 1 stream; returns the sorted end-to-end latencies (asserting none was lost).
async fn stream((mut publisher, mut sub): (TestClient, TestClient), name: &str) -> Vec<Duration> {
    let topic = format!("legit/{name}");
    let base = Instant::now();
    let receiver = tokio::spawn(async move {
        let mut latencies = Vec::with_capacity(MESSAGES as usize);
        for expected in 0..MESSAGES {
            let p = match sub.recv_within(Duration::from_secs(30)).await {
                Recv::Packet(Packet::Publish(p)) => p,
                other => panic!("message {expected}: {other:?}"),
            };
            let (seq, sent) = p.payload.split_at(4);
            assert_eq!(u32::from_be_bytes(seq.try_into().unwrap()), expected, "lost or reordered");
            let sent = Duration::from_nanos(u64::from_be_bytes(sent.try_into().unwrap()));
            latencies.push(base.elapsed() - sent);
            sub.send(Packet::PubAck(Ack::new(p.packet_id))).await;
        }
        latencies
    });
    for seq in 0..MESSAGES {
        let mut payload = seq.to_be_bytes().to_vec();
        payload.extend_from_slice(&(base.elapsed().as_nanos() as u64).to_be_bytes());
        let id = (seq % 60_000 + 1) as u16;
        publisher.publish_and_ack(&topic, QoS::AtLeastOnce, &payload, id).await;
        // A steady stream, not a saturating one: ~1000 messages/s.
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let mut latencies = receiver.await.unwrap();
    latencies.sort();
    latencies
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// One hostile connection, over and over until `stop`: kind `i % 4`.
async fn attacker(addr: std::net::SocketAddr, i: usize, stop: Arc<AtomicBool>, opened: Arc<AtomicU64>) {
    let connect = {
        let mut c = connect_packet(&format!("hostile-{i}"), true);
        c.protocol = V5;
        encode_packet(&Packet::Connect(Box::new(c)), V5)
    };
    let mut buf = [0u8; 256];
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        match i % 4 {
            // Slow-loris: one byte of CONNECT every 200 ms until the broker gives up.
            0 => {
                for b in connect.iter() {
                    if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            // Silent: connects, never speaks, waits to be closed.
            1 => {
                let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
            }
            // Garbage after a valid CONNECT.
            2 => {
                let _ = s.write_all(&connect).await;
                let _ = s.write_all(&[0xF0, 0x03, 0xDE, 0xAD, 0xBE]).await;
                let _ = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            // Churn: CONNECT, then drop the socket without DISCONNECT.
            _ => {
                let _ = s.write_all(&connect).await;
                let _ = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await;
                drop(s);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legitimate_qos1_stream_survives_2000_hostile_connections() {
    let mut config = Config::embedded();
    config.mqtt.connect_timeout_secs = 2;
    // The defence against connection churn: newcomers beyond this wait in the backlog.
    config.limits.max_connection_rate = RATE;
    let b = start(config).await;

    let quiet = stream(legit_clients(b.addr, "quiet").await, "quiet").await;

    let legit = legit_clients(b.addr, "hostile").await;
    // The attackers run on their own runtime (one thread), as they would on other machines;
    // they still share this machine's cores with the broker.
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let attack = {
        let (stop, opened, addr) = (stop.clone(), opened.clone(), b.addr);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let mut attackers = Vec::with_capacity(HOSTILE);
                for i in 0..HOSTILE {
                    attackers.push(tokio::spawn(attacker(addr, i, stop.clone(), opened.clone())));
                }
                for a in attackers {
                    let _ = a.await;
                }
            })
        })
    };
    let ramp = Instant::now();
    while (opened.load(Ordering::Relaxed) as usize) < HOSTILE && ramp.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hostile = stream(legit, "hostile").await;
    stop.store(true, Ordering::Relaxed);
    let total = opened.load(Ordering::Relaxed);

    let (q50, q99) = (percentile(&quiet, 0.5), percentile(&quiet, 0.99));
    let (h50, h99) = (percentile(&hostile, 0.5), percentile(&hostile, 0.99));
    println!(
        "QoS 1 stream, {MESSAGES} messages: quiet p50 {q50:?} p99 {q99:?}; with {HOSTILE} hostile connections \
         ({total} opened) p50 {h50:?} p99 {h99:?}; p99 ratio {:.2} (bar: within 2x)",
        h99.as_secs_f64() / q99.as_secs_f64()
    );
    b.broker.shutdown.cancel();
    tokio::task::spawn_blocking(move || attack.join().unwrap()).await.unwrap();
}
