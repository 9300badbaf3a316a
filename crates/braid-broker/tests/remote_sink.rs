//! The route-target seam: a subscriber that is not a session of this broker (a cluster node,
//! a bridge) is subscribed with `Remotes::subscribe_remote` and handed each matching message
//! once through `RemoteSink`; a message another node forwards is routed here within the scope
//! it was sent for; the filters local sessions subscribe to are reported as they change. Here
//! a recording test double stands behind the sink, driven on the virtual clock.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use braid_broker::broker::Arrival;
use braid_broker::harness::{ClientKey, Harness};
use braid_broker::message::Message;
use braid_broker::router::{Confirm, Delivered, FilterChange, Forward, RemoteSink, Scope};
use braid_broker::session::Enqueued;
use braid_broker::Broker;
use common::*;

/// Records what it is handed; while `full`, refuses (and says it cannot accept).
#[derive(Debug, Default)]
struct Recorder {
    got: Mutex<Vec<(String, QoS, Scope)>>,
    full: AtomicBool,
}

impl RemoteSink for Recorder {
    fn deliver(&self, fwd: Forward, _now: Instant) -> Delivered {
        if self.full.load(Ordering::Relaxed) {
            return Delivered { enqueued: Enqueued::DroppedFull, ..Delivered::queued(0) };
        }
        self.got.lock().unwrap().push((fwd.msg.topic.to_string(), fwd.msg.qos, fwd.scope));
        Delivered::queued(0)
    }

    fn can_accept(&self) -> bool {
        !self.full.load(Ordering::Relaxed)
    }
}

impl Recorder {
    fn take(&self) -> Vec<(String, QoS, Scope)> {
        std::mem::take(&mut *self.got.lock().unwrap())
    }
}

fn options(qos: QoS) -> SubscriptionOptions {
    SubscriptionOptions { qos, ..Default::default() }
}

fn publish_from(h: &mut Harness<'_>, p: ClientKey, topic: &str, qos: QoS, id: u16) {
    h.send(p, Packet::Publish(Publish { packet_id: id, ..publish(topic, qos, "x") }));
}

#[test]
fn a_remote_subscriber_gets_what_matches_beside_local_ones_until_it_unsubscribes() {
    let b = Broker::new(Config::embedded());
    let mut h = Harness::new(&b);
    let recorder = std::sync::Arc::new(Recorder::default());
    let remote = b.remotes().remote_sink(recorder.clone());
    assert_eq!(b.remotes().subscribe_remote(&remote, "sensors/+", options(QoS::AtMostOnce)), Ok(true));
    assert_eq!(
        b.remotes().subscribe_remote(&remote, "sensors/+", options(QoS::AtLeastOnce)),
        Ok(false),
        "replaced"
    );
    assert_eq!(b.remotes().subscribe_remote(&remote, "sensors/#", options(QoS::AtLeastOnce)), Ok(true));
    let local = h.connect(connect_packet("local", true)).0;
    h.send(local, Packet::Subscribe(subscribe("sensors/#", QoS::AtLeastOnce)));
    h.received(local);
    let p = h.connect(connect_packet("pub", true)).0;

    publish_from(&mut h, p, "sensors/1", QoS::ExactlyOnce, 1);
    publish_from(&mut h, p, "other/1", QoS::AtLeastOnce, 2);
    let plain = Scope { plain: true, groups: vec![] };
    assert_eq!(
        recorder.take(),
        [("sensors/1".to_string(), QoS::ExactlyOnce, plain)],
        "once for its two matching filters, at the published QoS (the receiver applies its own)"
    );
    let local_got = h.received(local).iter().filter(|p| matches!(p, Packet::Publish(_))).count();
    assert_eq!(local_got, 1, "the local subscriber gets its copy too");

    assert!(b.remotes().unsubscribe_remote(&remote, "sensors/+"));
    assert!(!b.remotes().unsubscribe_remote(&remote, "sensors/+"));
    assert!(b.remotes().unsubscribe_remote(&remote, "sensors/#"));
    publish_from(&mut h, p, "sensors/2", QoS::AtLeastOnce, 3);
    assert!(recorder.take().is_empty());
    assert_eq!(
        b.remotes().subscribe_remote(&remote, "a/#/b", options(QoS::AtMostOnce)),
        Err(ReasonCode::TopicFilterInvalid)
    );
}

#[test]
fn a_remote_member_of_a_shared_group_takes_turns_and_is_passed_over_while_full() {
    let b = Broker::new(Config::embedded());
    let mut h = Harness::new(&b);
    let recorder = std::sync::Arc::new(Recorder::default());
    let remote = b.remotes().remote_sink(recorder.clone());
    b.remotes().subscribe_remote(&remote, "$share/g/jobs", options(QoS::AtLeastOnce)).unwrap();
    let local = h.connect(connect_packet("worker", true)).0;
    h.send(local, Packet::Subscribe(subscribe("$share/g/jobs", QoS::AtLeastOnce)));
    h.received(local);
    let p = h.connect(connect_packet("pub", true)).0;
    for id in 1..=4 {
        publish_from(&mut h, p, "jobs", QoS::AtLeastOnce, id);
    }
    let to_local = |h: &mut Harness<'_>| {
        let publishes: Vec<u16> = h
            .received(local)
            .into_iter()
            .filter_map(|p| match p {
                Packet::Publish(p) => Some(p.packet_id),
                _ => None,
            })
            .collect();
        for &id in &publishes {
            h.send(local, Packet::PubAck(Ack::new(id)));
        }
        publishes.len()
    };
    let got = recorder.take();
    assert_eq!((got.len(), to_local(&mut h)), (2, 2), "round robin across local and remote");
    assert_eq!(got[0].2, Scope { plain: false, groups: vec!["g".into()] }, "for its group only");

    recorder.full.store(true, Ordering::Relaxed);
    let dropped = b.metrics().messages_dropped();
    for id in 5..=8 {
        publish_from(&mut h, p, "jobs", QoS::AtLeastOnce, id);
    }
    assert_eq!(to_local(&mut h), 4, "a member that cannot accept is passed over");
    assert_eq!(b.metrics().messages_dropped(), dropped, "nothing dropped on the way");

    // A normal subscription of a full sink: what it refuses is counted as dropped.
    b.remotes().subscribe_remote(&remote, "jobs", options(QoS::AtLeastOnce)).unwrap();
    publish_from(&mut h, p, "jobs", QoS::AtLeastOnce, 9);
    assert_eq!(b.metrics().messages_dropped(), dropped + 1);
}

#[test]
fn a_forwarded_message_reaches_local_sessions_within_its_scope_only() {
    let b = Broker::new(Config::embedded());
    let mut h = Harness::new(&b);
    // A remote member of the group: a forwarded message must never go back out to it.
    let recorder = std::sync::Arc::new(Recorder::default());
    let remote = b.remotes().remote_sink(recorder.clone());
    b.remotes().subscribe_remote(&remote, "$share/g/jobs", options(QoS::AtLeastOnce)).unwrap();
    let plain = h.connect(connect_packet("plain", true)).0;
    h.send(plain, Packet::Subscribe(subscribe("jobs", QoS::AtLeastOnce)));
    let workers: Vec<ClientKey> =
        ["w1", "w2"].iter().map(|id| h.connect(connect_packet(id, true)).0).collect();
    for &w in &workers {
        h.send(w, Packet::Subscribe(subscribe("$share/g/jobs", QoS::AtLeastOnce)));
    }
    for k in workers.iter().chain([&plain]) {
        h.received(*k);
    }
    let count = |h: &mut Harness<'_>, k: ClientKey| {
        h.received(k).iter().filter(|p| matches!(p, Packet::Publish(_))).count()
    };
    let msg = || Message::internal("jobs".into(), "x".into(), false);

    let group_only = Scope { plain: false, groups: vec!["g".into()] };
    for _ in 0..4 {
        b.remotes().publish_forwarded(msg(), &group_only, Arrival::Sent, h.now());
    }
    assert_eq!(count(&mut h, plain), 0, "not for the normal subscription");
    let to_workers: Vec<usize> = workers.iter().map(|&w| count(&mut h, w)).collect();
    assert_eq!(to_workers, [2, 2], "one local member each time, taking turns");
    assert!(recorder.take().is_empty(), "never back to another node");

    b.remotes().publish_forwarded(msg(), &Scope { plain: true, groups: vec![] }, Arrival::Sent, h.now());
    assert_eq!(count(&mut h, plain), 1);
    assert_eq!(workers.iter().map(|&w| count(&mut h, w)).sum::<usize>(), 0, "not for the group");
}

#[test]
fn the_filters_local_sessions_subscribe_to_are_reported_as_they_come_and_go() {
    let b = Broker::new(Config::embedded());
    let mut h = Harness::new(&b);
    let a = h.connect(connect_packet("a", true)).0;
    h.send(a, Packet::Subscribe(subscribe("x/#", QoS::AtMostOnce)));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    b.remotes().watch_filters(tx);
    let mut numbers = Vec::new();
    let mut changes = || {
        let got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        numbers.extend(got.iter().map(|(n, _)| *n));
        got.into_iter().map(|(_, c)| c).collect::<Vec<_>>()
    };
    assert_eq!(changes(), [FilterChange::Added("x/#".into())], "what is there when watching starts");

    let c = h.connect(connect_packet("c", true)).0;
    h.send(c, Packet::Subscribe(subscribe("x/#", QoS::AtLeastOnce)));
    h.send(c, Packet::Subscribe(subscribe("$share/g/y", QoS::AtMostOnce)));
    assert_eq!(changes(), [FilterChange::Added("$share/g/y".into())], "a second subscriber adds nothing");
    let remote = b.remotes().remote_sink(std::sync::Arc::new(Recorder::default()));
    b.remotes().subscribe_remote(&remote, "z", options(QoS::AtMostOnce)).unwrap();
    assert_eq!(changes(), [], "remote subscribers are not local filters");

    h.drop_connection(a);
    assert_eq!(changes(), [], "c still subscribes to x/#");
    h.drop_connection(c);
    let mut gone = changes();
    gone.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(gone, [FilterChange::Removed("$share/g/y".into()), FilterChange::Removed("x/#".into())]);
    assert_eq!(numbers, [1, 2, 3, 4], "numbered in order");
    assert_eq!(b.remotes().filter_changes(), 4);
}

/// Confirms each message only when told, with the reason it is told.
#[derive(Debug, Default)]
struct Confirming {
    pending: Mutex<Vec<tokio::sync::oneshot::Sender<ReasonCode>>>,
}

impl RemoteSink for Confirming {
    fn deliver(&self, _fwd: Forward, _now: Instant) -> Delivered {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.pending.lock().unwrap().push(tx);
        let word = async move { rx.await.unwrap_or(ReasonCode::UnspecifiedError) };
        Delivered { confirm: Some(Confirm::new(word)), ..Delivered::queued(0) }
    }
}

impl Confirming {
    /// Confirms the oldest message not confirmed yet with `reason`.
    fn confirm(&self, reason: ReasonCode) {
        let tx = self.pending.lock().unwrap().remove(0);
        let _ = tx.send(reason);
    }
}

#[tokio::test]
async fn a_publishers_acknowledgement_waits_for_a_remote_subscribers_confirmation_in_order() {
    let b = start_default().await;
    let sink = std::sync::Arc::new(Confirming::default());
    let remote = b.broker.remotes().remote_sink(sink.clone());
    assert_eq!(b.broker.remotes().subscribe_remote(&remote, "c/#", options(QoS::AtLeastOnce)), Ok(true));
    let (mut p, _) = TestClient::connect_ok(b.addr, V5, connect_packet("confirm-pub", true)).await;
    let mut first = publish("c/1", QoS::AtLeastOnce, "one");
    first.packet_id = 1;
    let mut second = publish("c/2", QoS::AtLeastOnce, "two");
    second.packet_id = 2;
    let mut elsewhere = publish("other", QoS::AtLeastOnce, "three");
    elsewhere.packet_id = 3;
    for m in [first, second, elsewhere] {
        p.send(Packet::Publish(m)).await;
    }
    // Nothing is acknowledged while the first waits, not even what no remote takes: in order.
    p.expect_nothing(QUIET).await;
    sink.confirm(ReasonCode::UnspecifiedError);
    match p.expect_packet().await {
        Packet::PubAck(a) => assert_eq!((a.packet_id, a.reason), (1, ReasonCode::UnspecifiedError)),
        other => panic!("expected PUBACK 1 with the failure, got {other:?}"),
    }
    p.expect_nothing(QUIET).await;
    sink.confirm(ReasonCode::Success);
    for id in [2, 3] {
        match p.expect_packet().await {
            Packet::PubAck(a) => assert_eq!((a.packet_id, a.reason), (id, ReasonCode::Success)),
            other => panic!("expected PUBACK {id}, got {other:?}"),
        }
    }
}
