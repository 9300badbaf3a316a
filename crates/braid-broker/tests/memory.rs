//! What clients cost in heap bytes, counted by a counting allocator (dhat) around the broker,
//! with clients that do what `bench/c1m`'s do: every client subscribes to a topic of its own
//! (`c1m/{i}`) and to one broadcast topic (`c1m/all`), then one QoS 0 message reaches all.
//! One test in its own binary: the allocator counts the whole process. Its figures are
//! printed (`--nocapture`); `BRAID_MEM_PROFILE=1` also writes `dhat-heap.json` (bytes by
//! allocation stack, for DHAT's viewer).

mod common;

use std::io::{Read, Write};
use std::mem::size_of;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use braid_broker::control::ConnControl;
use braid_broker::harness::{ClientKey, Harness};
use braid_broker::session::Session;
use braid_broker::Broker;
use common::*;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn live_bytes() -> usize {
    dhat::HeapStats::get().curr_bytes
}

/// The heap's least size over half a second: what the runtime's tasks still finishing hold
/// is not counted.
fn settled_bytes() -> usize {
    let mut least = usize::MAX;
    for _ in 0..10 {
        least = least.min(live_bytes());
        std::thread::sleep(Duration::from_millis(50));
    }
    least
}

/// Heap bytes per client (of `clients`) that `step` adds.
fn per_client(clients: usize, step: impl FnOnce()) -> usize {
    let before = live_bytes();
    step();
    live_bytes().saturating_sub(before) / clients
}

#[test]
fn what_clients_cost() {
    let _profiler = match std::env::var_os("BRAID_MEM_PROFILE") {
        Some(_) => dhat::Profiler::new_heap(),
        None => dhat::Profiler::builder().testing().build(),
    };
    subscriptions();
    parked_connections();
    remote_routes();
}

/// A cluster node's routes to the other nodes' sessions: what one remote subscriber's
/// subscription to a filter of its own costs (in `bench/c1m`'s six-node run every node holds
/// five other nodes' clients' filters).
fn remote_routes() {
    const FILTERS: usize = 2000;
    let broker = Broker::new(Config::embedded());
    let sinks: Vec<_> = (0..5).map(|_| broker.remotes().remote_sink(std::sync::Arc::new(Nowhere))).collect();
    let per_route = per_client(FILTERS * sinks.len(), || {
        for (n, sink) in sinks.iter().enumerate() {
            for i in 0..FILTERS {
                let filter = format!("c1m/{}", n * FILTERS + i);
                assert_eq!(
                    broker.remotes().subscribe_remote(sink, &filter, SubscriptionOptions::default()),
                    Ok(true)
                );
            }
        }
    });
    eprintln!("router, heap bytes per remote subscriber's route to a filter of its own: {per_route}");
    assert!(per_route <= 160, "a remote route: {per_route} bytes");
}

/// A remote subscriber that takes nothing.
#[derive(Debug)]
struct Nowhere;

impl braid_broker::router::RemoteSink for Nowhere {
    fn deliver(&self, _: braid_broker::router::Forward, _: Instant) -> braid_broker::router::Delivered {
        braid_broker::router::Delivered::queued(0)
    }
}

/// The broker core through the harness (no sockets): what each subscription adds to a
/// session, and what one delivery leaves in it.
fn subscriptions() {
    const CLIENTS: usize = 1000;
    let broker = Broker::new(Config::embedded());
    let mut h = Harness::new(&broker);
    let mut clients: Vec<ClientKey> = Vec::with_capacity(CLIENTS);
    let connect = per_client(CLIENTS, || {
        for i in 0..CLIENTS {
            let (k, ack) = h.connect(connect_packet(&format!("c1m-{i}"), true));
            assert_eq!(ack.reason, ReasonCode::Success);
            // A first round trip, so that the harness's own buffers for the client are
            // counted here, not with the subscriptions.
            h.send(k, Packet::PingReq);
            assert!(matches!(h.received(k)[..], [Packet::PingResp]));
            clients.push(k);
        }
    });
    let mut subscribe_each = |filter: &dyn Fn(usize) -> String| {
        per_client(CLIENTS, || {
            for (i, &k) in clients.iter().enumerate() {
                h.send(k, Packet::Subscribe(subscribe(&filter(i), QoS::AtMostOnce)));
                assert!(matches!(h.received(k)[..], [Packet::SubAck(_)]));
            }
        })
    };
    let own = subscribe_each(&|i| format!("c1m/{i}"));
    let shared = subscribe_each(&|_| "c1m/all".to_string());
    let (p, _) = h.connect(connect_packet("c1m-publisher", true));
    let delivered = per_client(CLIENTS, || {
        h.send(p, Packet::Publish(publish("c1m/all", QoS::AtMostOnce, &b"hello"[..])));
        for &k in &clients {
            assert!(matches!(h.received(k)[..], [Packet::Publish(_)]));
        }
    });
    eprintln!(
        "harness, heap bytes per client: connected (session and the harness's connection) \
         {connect}, own topic {own}, broadcast topic {shared}, left by one QoS 0 delivery \
         {delivered} (its connection does not park here)"
    );
    assert!(own <= 256, "a subscription to a topic of its own: {own} bytes");
    assert!(shared <= 128, "a subscription to a topic with many subscribers: {shared} bytes");
}

/// Plain TCP connections that park: what a parked connection costs, and what one delivery
/// (which wakes it) leaves once it has parked again.
fn parked_connections() {
    const CLIENTS: usize = 500;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut config = Config::embedded();
    config.listeners.park_after_secs = 1;
    let b = rt.block_on(start(config));
    // Blocking sockets: the clients themselves take no heap.
    let mut socks: Vec<TcpStream> = Vec::with_capacity(CLIENTS + 1);
    let mut buf = vec![0u8; 4096];
    let until_parked = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while b.broker.parked() != n {
            assert!(Instant::now() < deadline, "{} of {n} connections parked", b.broker.parked());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Settled: what the runtime's start still holds is not subtracted.
    let base = settled_bytes();
    for i in 0..=CLIENTS {
        let mut s = TcpStream::connect(b.addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        exchange(&mut s, &Packet::Connect(Box::new(connect_packet(&format!("c1m-{i}"), true))), &mut buf);
        socks.push(s);
    }
    until_parked(CLIENTS + 1);
    let parked = settled_bytes().saturating_sub(base) / (CLIENTS + 1);
    for (i, s) in socks[..CLIENTS].iter_mut().enumerate() {
        let mut sub = subscribe(&format!("c1m/{i}"), QoS::AtMostOnce);
        sub.filters.push(("c1m/all".into(), SubscriptionOptions::default()));
        exchange(s, &Packet::Subscribe(sub), &mut buf);
    }
    until_parked(CLIENTS + 1);
    let before = settled_bytes();
    let publisher = &mut socks[CLIENTS];
    send(publisher, &Packet::Publish(publish("c1m/all", QoS::AtMostOnce, &b"hello"[..])));
    for s in &mut socks[..CLIENTS] {
        assert!(s.read(&mut buf).unwrap() > 0, "the broadcast arrives");
    }
    until_parked(CLIENTS + 1);
    let woken = settled_bytes().saturating_sub(before) / CLIENTS;
    eprintln!(
        "sockets, heap bytes per client: parked connection {parked}, left by one QoS 0 delivery \
         once parked again {woken}"
    );
    assert!(woken <= 64, "a woken connection that parks again keeps {woken} bytes");
    // 573 or 651 bytes here (some 40 KB of the runtime's come and go): its session, control
    // block, parked record and client id (about 490), and its share of the registry's, the
    // liveness table's and the parking lot's tables.
    assert!(parked <= 700, "a parked connection keeps {parked} bytes");
    // jemalloc (the broker's allocator) rounds up to a size class: its session and control
    // block (each in an Arc, two counts before it) stay within 320 and 112 bytes, classes
    // that nothing a connection allocates only while it is active shares (a shared class
    // leaves their slabs fragmented once it parks).
    let arc = 2 * size_of::<usize>();
    assert!(arc + size_of::<Session>() <= 320, "a session takes {} bytes", size_of::<Session>());
    assert!(
        arc + size_of::<ConnControl>() <= 112,
        "a control block takes {} bytes",
        size_of::<ConnControl>()
    );
    drop(socks);
    drop(b);
}

fn send(s: &mut TcpStream, p: &Packet) {
    let mut out = BytesMut::new();
    encode(p, V5, &mut out).unwrap();
    s.write_all(&out).unwrap();
}

/// Sends `p` and reads the answer (one read: a CONNACK or a SUBACK comes whole).
fn exchange(s: &mut TcpStream, p: &Packet, buf: &mut [u8]) {
    send(s, p);
    assert!(s.read(buf).unwrap() > 0);
}
