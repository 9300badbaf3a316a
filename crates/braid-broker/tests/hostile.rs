//! Hostile input: slow-loris, half-open sockets, floods of CONNECTs, huge remaining lengths,
//! deeply nested topics and random or mutated bytes on live connections. Each is bounded in
//! time and memory, and a canary publisher/subscriber pair keeps working throughout.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use braid_broker::limits::resident_memory;
use braid_broker::metrics::Metrics;
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn connect_bytes(id: &str, keep_alive: u16) -> BytesMut {
    let mut c = connect_packet(id, true);
    c.keep_alive = keep_alive;
    c.protocol = V5;
    encode_packet(&Packet::Connect(Box::new(c)), V5)
}

fn connected(b: &TestBroker) -> u64 {
    Metrics::get(&b.broker.metrics().clients_connected)
}

async fn wait_until(what: &str, within: Duration, f: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn short_connect_timeout() -> Config {
    let mut config = Config::embedded();
    config.mqtt.connect_timeout_secs = 1;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_is_closed_by_the_connect_timeout() {
    let b = start(short_connect_timeout()).await;
    let mut canary = Canary::new(b.addr, "loris").await;
    let bytes = connect_bytes("loris", 0);
    let mut lorises = Vec::new();
    for _ in 0..50 {
        let bytes = bytes.clone();
        lorises.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(b.addr).await.unwrap();
            let started = Instant::now();
            // One byte every 100 ms: the CONNECT would take seconds to complete.
            for byte in bytes.iter() {
                if s.write_all(&[*byte]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            started.elapsed()
        }));
    }
    canary.check().await;
    for l in lorises {
        let lasted = l.await.unwrap();
        assert!(lasted < Duration::from_millis(2500), "a slow-loris socket lasted {lasted:?}");
    }
    canary.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_and_silent_sockets_are_closed() {
    let b = start(short_connect_timeout()).await;
    // Connected, nothing sent: closed by the connect timeout.
    let mut silent = TestClient::open(b.addr, V5).await;
    let started = Instant::now();
    assert!(matches!(silent.recv_within(Duration::from_secs(3)).await, Recv::Closed));
    assert!(started.elapsed() < Duration::from_secs(2));

    // Connected with keep alive 1, then silent without closing (a peer that vanished):
    // closed after 1.5 x keep alive.
    let mut c = connect_packet("vanished", true);
    c.keep_alive = 1;
    let (mut vanished, _) = TestClient::connect_ok(b.addr, V5, c).await;
    let started = Instant::now();
    assert_eq!(vanished.expect_closed().await, Some(ReasonCode::KeepAliveTimeout));
    assert!(started.elapsed() < Duration::from_millis(2500));

    // Half-closed: the client shuts its sending side after CONNECT; the broker sees the end of
    // the stream, closes, and publishes the will.
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, connect_packet("will-sub", true)).await;
    sub.subscribe("wills/half", QoS::AtMostOnce).await;
    let mut c = connect_packet("half", true);
    c.will = will("wills/half", b"gone");
    let mut s = TcpStream::connect(b.addr).await.unwrap();
    s.write_all(&encode_packet(&Packet::Connect(Box::new(c)), V5)).await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(&sub.expect_publish().await.payload[..], b"gone");
    wait_until("only the subscriber left", WAIT, || connected(&b) == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_ends_its_stream_inside_connect_is_closed_at_once() {
    let b = start_default().await;
    let mut canary = Canary::new(b.addr, "cut").await;
    let bytes = connect_bytes("cut", 0);
    // Cut inside the fixed header, and inside the body.
    for cut in [1, bytes.len() / 2] {
        let mut s = TcpStream::connect(b.addr).await.unwrap();
        s.write_all(&bytes[..cut]).await.unwrap();
        s.shutdown().await.unwrap();
        let mut rest = Vec::new();
        // The connect timeout is 10 s: closing must not wait for it. (Closed with the bytes
        // unread, the socket may end with a reset instead of an end of stream.)
        let read = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "cut after {cut} bytes: {read:?}, {rest:?}");
    }
    canary.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_connects_leaves_the_broker_serving() {
    let b = start_default().await;
    let mut canary = Canary::new(b.addr, "flood").await;
    let mut tasks = Vec::new();
    for i in 0..400 {
        tasks.push(tokio::spawn(async move {
            // Half distinct ids, half fighting over one id (a takeover storm).
            let id = if i % 2 == 0 { format!("flood-{i}") } else { "flood-same".to_string() };
            if let Ok(mut s) = TcpStream::connect(b.addr).await {
                let _ = s.write_all(&connect_bytes(&id, 0)).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    canary.check().await;
    for t in tasks {
        t.await.unwrap();
    }
    canary.check().await;
    wait_until("flood connections gone", Duration::from_secs(10), || connected(&b) == 2).await;
}

/// The nice value in the `stat` file of the thread whose `/proc` directory is `task`.
fn nice(task: &std::path::Path) -> Option<i32> {
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    // Fields after the command name's closing parenthesis start at field 3 (state); the nice
    // value is field 19.
    stat.rsplit_once(')')?.1.split_whitespace().nth(16)?.parse().ok()
}

/// The nice value of this process's thread named `name`, if there is one.
fn thread_nice(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc/self/task").ok()?.flatten().find_map(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
        (comm.trim_end() == name).then(|| nice(&task.path())).flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_before_connect_are_served_at_the_lowest_priority() {
    let b = start_default().await;
    let mut canary = Canary::new(b.addr, "nice").await;
    assert_eq!(thread_nice("braid-handshake"), Some(19), "the thread that waits for CONNECTs");
    // This test runs on a worker of the runtime that serves established clients.
    let worker = nice(std::path::Path::new("/proc/thread-self")).expect("read this thread's nice value");
    assert!(worker < 19, "the workers keep their priority (nice {worker})");
    canary.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_remaining_lengths_do_not_allocate_what_they_announce() {
    let mut config = short_connect_timeout();
    config.mqtt.max_packet_size = 268_435_455;
    let b = start(config).await;
    let mut canary = Canary::new(b.addr, "huge").await;
    let before = resident_memory().unwrap();
    let mut clients = Vec::new();
    for i in 0..20 {
        let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet(&format!("huge{i}"), true)).await;
        // A PUBLISH announcing 256 MiB, of which 64 KiB arrive.
        c.send_raw(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F]).await;
        c.send_raw(&[b'x'; 64 * 1024]).await;
        clients.push(c);
    }
    // Before CONNECT too: a CONNECT announcing 256 MiB is closed by the connect timeout.
    let mut pre = TestClient::open(b.addr, V5).await;
    pre.send_raw(&[0x10, 0xFF, 0xFF, 0xFF, 0x7F, 0, 4, b'M', b'Q', b'T', b'T']).await;
    canary.check().await;
    let grown = resident_memory().unwrap().saturating_sub(before);
    assert!(grown < 64 << 20, "20 connections announcing 256 MiB each grew the RSS by {grown} bytes");
    assert!(matches!(pre.recv_within(Duration::from_secs(3)).await, Recv::Closed));
    // A remaining length with a fifth continuation byte is malformed.
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("varint", true)).await;
    c.send_raw(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]).await;
    assert_eq!(c.expect_closed().await, Some(ReasonCode::MalformedPacket));
    canary.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_topics_are_refused_by_the_level_limit() {
    let b = start_default().await;
    let mut canary = Canary::new(b.addr, "nest").await;
    // 65,535 empty levels: the longest topic a UTF-8 string can hold.
    let deep = "/".repeat(65_534);
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("deep-pub", true)).await;
    let p = Publish { retain: true, ..publish(&deep, QoS::AtMostOnce, "x") };
    c.send(Packet::Publish(p)).await;
    assert_eq!(c.expect_closed().await, Some(ReasonCode::TopicNameInvalid));
    let (mut c, _) = TestClient::connect_ok(b.addr, V311, connect_packet("deep-sub", true)).await;
    c.send(Packet::Subscribe(subscribe(&format!("{deep}#"), QoS::AtMostOnce))).await;
    assert!(
        matches!(c.expect_packet().await, Packet::SubAck(a) if a.reasons == [ReasonCode::UnspecifiedError])
    );
    let (mut all, _) = TestClient::connect_ok(b.addr, V5, connect_packet("all", true)).await;
    all.subscribe("#", QoS::AtMostOnce).await;
    canary.check().await;
}

/// Random bytes, or a valid packet stream with bytes flipped, inserted or cut.
fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    let mut valid = BytesMut::new();
    for p in [
        Packet::Subscribe(subscribe("a/+/c", QoS::ExactlyOnce)),
        Packet::Publish(Publish { retain: true, ..publish("a/b/c", QoS::ExactlyOnce, "payload") }),
        Packet::PubRel(Ack::new(1)),
        Packet::Publish(publish("a/b", QoS::AtLeastOnce, "x")),
        Packet::PingReq,
    ] {
        encode(&p, V5, &mut valid).unwrap();
    }
    let valid = valid.to_vec();
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..600),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..8).prop_map(
            move |edits| {
                let mut v = valid.clone();
                for (at, byte, kind) in edits {
                    let i = at.index(v.len());
                    match kind {
                        0 => v[i] = byte,
                        1 => v.insert(i, byte),
                        _ => v.truncate(i.max(1)),
                    }
                }
                v
            }
        ),
    ]
}

#[test]
fn random_and_mutated_bytes_on_live_connections_never_panic() {
    static PANICKED: AtomicBool = AtomicBool::new(false);
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICKED.store(true, Ordering::SeqCst);
        default_hook(info);
    }));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut config = Config::embedded();
    config.mqtt.max_packet_size = 4096;
    let b = rt.block_on(start(config));
    let mut canary = rt.block_on(Canary::new(b.addr, "fuzz"));
    let mut runner =
        TestRunner::new(PropConfig { cases: 200, failure_persistence: None, ..PropConfig::default() });
    let case = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&(hostile_bytes(), any::<bool>()), |(bytes, v5)| {
            let id = format!("fuzz-{}", case.fetch_add(1, Ordering::Relaxed));
            rt.block_on(async {
                let version = if v5 { V5 } else { V311 };
                let (mut c, _) = TestClient::connect_ok(b.addr, version, connect_packet(&id, true)).await;
                let _ = c.try_send_raw(&bytes).await;
                // Let the broker read it before the socket goes.
                let _ = c.recv_within(Duration::from_millis(5)).await;
            });
            Ok(())
        })
        .unwrap();
    rt.block_on(async {
        canary.check().await;
        wait_until("fuzz connections gone", Duration::from_secs(10), || connected(&b) == 2).await;
    });
    assert!(!PANICKED.load(Ordering::SeqCst), "the broker panicked on hostile input (see above)");
}
