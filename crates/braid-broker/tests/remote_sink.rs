//! The route-target seam: a subscriber that is not a session of this broker (what a cluster
//! node or a bridge will be) is subscribed with `Broker::subscribe_remote` and handed its
//! deliveries through `RemoteSink`. Here a recording test double stands behind it, driven on
//! the virtual clock.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use braid_broker::harness::{ClientKey, Harness};
use braid_broker::message::Delivery;
use braid_broker::metrics::Metrics;
use braid_broker::router::RemoteSink;
use braid_broker::session::Enqueued;
use braid_broker::Broker;
use common::*;

/// Records what it is handed; while `full`, refuses (and says it cannot accept).
#[derive(Debug, Default)]
struct Recorder {
    got: Mutex<Vec<(String, QoS, bool)>>,
    full: AtomicBool,
}

impl RemoteSink for Recorder {
    fn deliver(&self, d: Delivery, _now: Instant) -> Enqueued {
        if self.full.load(Ordering::Relaxed) {
            return Enqueued::DroppedFull;
        }
        self.got.lock().unwrap().push((d.msg.topic.to_string(), d.qos, d.retain));
        Enqueued::Queued
    }

    fn can_accept(&self) -> bool {
        !self.full.load(Ordering::Relaxed)
    }
}

impl Recorder {
    fn take(&self) -> Vec<(String, QoS, bool)> {
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
    let remote = b.remote_sink(recorder.clone());
    assert_eq!(b.subscribe_remote(&remote, "sensors/+", options(QoS::AtMostOnce)), Ok(true));
    assert_eq!(b.subscribe_remote(&remote, "sensors/+", options(QoS::AtLeastOnce)), Ok(false), "replaced");
    let local = h.connect(connect_packet("local", true)).0;
    h.send(local, Packet::Subscribe(subscribe("sensors/#", QoS::AtLeastOnce)));
    h.received(local);
    let p = h.connect(connect_packet("pub", true)).0;

    publish_from(&mut h, p, "sensors/1", QoS::ExactlyOnce, 1);
    publish_from(&mut h, p, "other/1", QoS::AtLeastOnce, 2);
    assert_eq!(
        recorder.take(),
        [("sensors/1".to_string(), QoS::AtLeastOnce, false)],
        "at the subscription's QoS"
    );
    let local_got = h.received(local).iter().filter(|p| matches!(p, Packet::Publish(_))).count();
    assert_eq!(local_got, 1, "the local subscriber gets its copy too");

    assert!(b.unsubscribe_remote(&remote, "sensors/+"));
    assert!(!b.unsubscribe_remote(&remote, "sensors/+"));
    publish_from(&mut h, p, "sensors/2", QoS::AtLeastOnce, 3);
    assert!(recorder.take().is_empty());
    assert_eq!(
        b.subscribe_remote(&remote, "a/#/b", options(QoS::AtMostOnce)),
        Err(ReasonCode::TopicFilterInvalid)
    );
}

#[test]
fn a_remote_member_of_a_shared_group_takes_turns_and_is_passed_over_while_full() {
    let b = Broker::new(Config::embedded());
    let mut h = Harness::new(&b);
    let recorder = std::sync::Arc::new(Recorder::default());
    let remote = b.remote_sink(recorder.clone());
    b.subscribe_remote(&remote, "$share/g/jobs", options(QoS::AtLeastOnce)).unwrap();
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
    assert_eq!((recorder.take().len(), to_local(&mut h)), (2, 2), "round robin across local and remote");

    recorder.full.store(true, Ordering::Relaxed);
    let dropped = Metrics::get(&b.metrics.messages_dropped);
    for id in 5..=8 {
        publish_from(&mut h, p, "jobs", QoS::AtLeastOnce, id);
    }
    assert_eq!(to_local(&mut h), 4, "a member that cannot accept is passed over");
    assert_eq!(Metrics::get(&b.metrics.messages_dropped), dropped, "nothing dropped on the way");

    // A normal subscription of a full sink: what it refuses is counted as dropped.
    b.subscribe_remote(&remote, "jobs", options(QoS::AtLeastOnce)).unwrap();
    publish_from(&mut h, p, "jobs", QoS::AtLeastOnce, 9);
    assert_eq!(Metrics::get(&b.metrics.messages_dropped), dropped + 1);
}
