//! What a session's subscriptions cost in heap bytes, counted by a counting allocator (dhat)
//! around the broker core driven through the harness, the way `bench/c1m` subscribes: every
//! client to a topic of its own (`c1m/{i}`) and to one broadcast topic (`c1m/all`), then one
//! QoS 0 message to all. One test in its own binary: the allocator counts the whole process.
//! `BRAID_MEM_PROFILE=1` also writes `dhat-heap.json` (bytes by allocation stack; open it in
//! DHAT's viewer) for the state live at the end.

mod common;

use braid_broker::harness::{ClientKey, Harness};
use braid_broker::Broker;
use common::*;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const CLIENTS: usize = 1000;

fn live_bytes() -> usize {
    dhat::HeapStats::get().curr_bytes
}

/// Heap bytes per client that `step` adds.
fn per_client(step: impl FnOnce()) -> usize {
    let before = live_bytes();
    step();
    live_bytes().saturating_sub(before) / CLIENTS
}

#[test]
fn subscriptions_and_a_wake_cost_what_they_should() {
    let _profiler = match std::env::var_os("BRAID_MEM_PROFILE") {
        Some(_) => dhat::Profiler::new_heap(),
        None => dhat::Profiler::builder().testing().build(),
    };
    let broker = Broker::new(Config::embedded());
    let mut h = Harness::new(&broker);
    let mut clients: Vec<ClientKey> = Vec::new();
    let connect = per_client(|| {
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
        per_client(|| {
            for (i, &k) in clients.iter().enumerate() {
                h.send(k, Packet::Subscribe(subscribe(&filter(i), QoS::AtMostOnce)));
                assert!(matches!(h.received(k)[..], [Packet::SubAck(_)]));
            }
        })
    };
    let own = subscribe_each(&|i| format!("c1m/{i}"));
    let shared = subscribe_each(&|_| "c1m/all".to_string());
    let (p, _) = h.connect(connect_packet("c1m-publisher", true));
    let wake = per_client(|| {
        h.send(p, Packet::Publish(publish("c1m/all", QoS::AtMostOnce, &b"hello"[..])));
        for &k in &clients {
            assert!(matches!(h.received(k)[..], [Packet::Publish(_)]));
        }
    });
    eprintln!(
        "heap bytes per client: connected (session + harness connection) {connect}, own topic \
         {own}, broadcast topic {shared}, left after one QoS 0 delivery {wake}"
    );
}
