//! The broker core on a virtual clock (`braid_broker::harness`): the behaviours whose subject
//! is time or order — takeover, wills and their delay, session and message expiry, keep alive,
//! Receive Maximum, shared-subscription failover — driven packet by packet, with no socket and
//! no wall-clock sleep. An hour of will delay is one `advance`.

mod common;

use std::time::Duration;

use braid_broker::harness::{ClientKey, Harness};
use braid_broker::Broker;
use common::*;

const SEC: Duration = Duration::from_secs(1);

fn broker() -> std::sync::Arc<Broker> {
    Broker::new(Config::embedded())
}

fn connected(h: &mut Harness<'_>, c: Connect) -> ClientKey {
    let (k, ack) = h.connect(c);
    assert_eq!(ack.reason, ReasonCode::Success, "CONNACK");
    k
}

/// A v5 client (clean start) subscribed to `filter` at QoS 1.
fn subscriber(h: &mut Harness<'_>, client_id: &str, filter: &str) -> ClientKey {
    let k = connected(h, connect_packet(client_id, true));
    h.send(k, Packet::Subscribe(subscribe(filter, QoS::AtLeastOnce)));
    assert!(matches!(h.received(k)[..], [Packet::SubAck(_)]), "SUBACK");
    k
}

fn with_will(c: Connect, topic: &str, delay: Option<u32>) -> Connect {
    let properties =
        Properties::from(braid_proto::PropertyValues { will_delay_interval: delay, ..Default::default() });
    let payload = Bytes::from(format!("{} is gone", c.client_id));
    Connect {
        will: Some(LastWill {
            topic: topic.into(),
            payload,
            qos: QoS::AtLeastOnce,
            retain: false,
            properties,
        }),
        ..c
    }
}

/// The topics of the PUBLISH packets `k` received, acknowledging each QoS 1 one.
fn topics(h: &mut Harness<'_>, k: ClientKey) -> Vec<String> {
    let mut out = Vec::new();
    for p in h.received(k) {
        if let Packet::Publish(p) = p {
            if p.qos == QoS::AtLeastOnce {
                h.send(k, Packet::PubAck(Ack::new(p.packet_id)));
            }
            out.push(p.topic.to_string());
        }
    }
    out
}

fn publishes(packets: Vec<Packet>) -> Vec<Publish> {
    packets
        .into_iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn disconnect(reason: ReasonCode) -> Packet {
    Packet::Disconnect(Disconnect { reason, properties: Properties::default() })
}

fn disconnected_with(h: &mut Harness<'_>, k: ClientKey) -> Option<ReasonCode> {
    h.received(k).into_iter().find_map(|p| match p {
        Packet::Disconnect(d) => Some(d.reason),
        _ => None,
    })
}

// ---- takeover ----

fn takeover(clean_b: bool) {
    let b = broker();
    let mut h = Harness::new(&b);
    let w = subscriber(&mut h, "watcher", "will/#");
    let a = connected(&mut h, with_will(connect_with_expiry("dup-id", true, 300), "will/takeover", None));
    h.send(a, Packet::Subscribe(subscribe("takeover/a", QoS::AtLeastOnce)));

    let (bb, ack) = h.connect(connect_with_expiry("dup-id", clean_b, 300));
    assert_eq!(ack.session_present, !clean_b);
    assert_eq!(disconnected_with(&mut h, a), Some(ReasonCode::SessionTakenOver));
    assert_eq!(h.closed(a), Some(ReasonCode::SessionTakenOver));
    let will = publishes(h.received(w));
    assert_eq!(will.len(), 1, "one will");
    assert_eq!((&*will[0].topic, &will[0].payload[..]), ("will/takeover", &b"dup-id is gone"[..]));

    // B keeps working: its own subscription, and A's when the session continued.
    h.send(bb, Packet::Subscribe(Subscribe { packet_id: 2, ..subscribe("takeover/b", QoS::AtLeastOnce) }));
    let p = connected(&mut h, connect_packet("tk-pub", true));
    h.send(p, Packet::Publish(publish("takeover/a", QoS::AtLeastOnce, "to a")));
    h.send(p, Packet::Publish(Publish { packet_id: 2, ..publish("takeover/b", QoS::AtLeastOnce, "to b") }));
    let expected: &[&str] = if clean_b { &["takeover/b"] } else { &["takeover/a", "takeover/b"] };
    assert_eq!(topics(&mut h, bb), expected);
    assert!(topics(&mut h, w).is_empty(), "nothing more for the watcher");
}

#[test]
fn takeover_with_clean_start_closes_old_with_0x8e_and_publishes_its_will() {
    takeover(true);
}

#[test]
fn takeover_resuming_the_session_closes_old_with_0x8e_and_publishes_its_will() {
    takeover(false);
}

#[test]
fn takeover_resuming_the_session_cancels_a_delayed_will() {
    let b = broker();
    let mut h = Harness::new(&b);
    let w = subscriber(&mut h, "watcher", "will/#");
    let a = connected(&mut h, with_will(connect_with_expiry("delayed", true, 300), "will/t", Some(60)));
    let (_bb, ack) = h.connect(connect_with_expiry("delayed", false, 300));
    assert!(ack.session_present);
    assert_eq!(h.closed(a), Some(ReasonCode::SessionTakenOver));
    h.advance(120 * SEC);
    assert!(topics(&mut h, w).is_empty(), "the delayed will was cancelled by the takeover");
}

#[test]
fn disconnect_then_reconnect_is_never_a_takeover() {
    let b = broker();
    let mut h = Harness::new(&b);
    let w = subscriber(&mut h, "watcher", "will/#");
    for expiry in [0, 300] {
        let a = connected(&mut h, with_will(connect_with_expiry("again", true, expiry), "will/again", None));
        h.send(a, disconnect(ReasonCode::Success));
        assert_eq!(h.closed(a), Some(ReasonCode::Success));
        let (bb, ack) = h.connect(connect_with_expiry("again", false, 0));
        assert_eq!(ack.session_present, expiry != 0, "expiry {expiry}: session kept as it said");
        assert!(h.received(a).is_empty(), "no DISCONNECT 0x8E for a connection that said DISCONNECT");
        h.send(bb, disconnect(ReasonCode::Success));
    }
    assert!(topics(&mut h, w).is_empty(), "no will after a DISCONNECT");
}

// ---- wills ----

#[test]
fn a_lost_connection_sends_its_will_at_once_and_disconnect_with_will_too() {
    let b = broker();
    let mut h = Harness::new(&b);
    let w = subscriber(&mut h, "watcher", "will/#");
    let a = connected(&mut h, with_will(connect_packet("lost", true), "will/lost", None));
    h.drop_connection(a);
    assert_eq!(topics(&mut h, w), ["will/lost"]);
    let c = connected(&mut h, with_will(connect_packet("asks", true), "will/asks", None));
    h.send(c, disconnect(ReasonCode::DisconnectWithWill));
    assert_eq!(topics(&mut h, w), ["will/asks"]);
    let d = connected(&mut h, with_will(connect_packet("polite", true), "will/polite", None));
    h.send(d, disconnect(ReasonCode::Success));
    assert!(topics(&mut h, w).is_empty(), "DISCONNECT 0x00 discards the will");
}

#[test]
fn a_delayed_will_goes_out_after_its_delay() {
    let b = broker();
    let mut h = Harness::new(&b);
    let w = subscriber(&mut h, "watcher", "will/#");
    let a = connected(&mut h, with_will(connect_with_expiry("slow", true, 3600), "will/slow", Some(30)));
    h.drop_connection(a);
    h.advance(29 * SEC);
    assert!(topics(&mut h, w).is_empty(), "not before the delay");
    h.advance(SEC);
    assert_eq!(topics(&mut h, w), ["will/slow"]);
    h.advance(3600 * SEC);
    assert!(topics(&mut h, w).is_empty(), "sent once");
}

#[test]
fn reconnecting_within_the_will_delay_cancels_the_will() {
    let b = broker();
    let mut h = Harness::new(&b);
    let w = subscriber(&mut h, "watcher", "will/#");
    let a = connected(&mut h, with_will(connect_with_expiry("back", true, 3600), "will/back", Some(30)));
    h.drop_connection(a);
    h.advance(10 * SEC);
    let (_a2, ack) = h.connect(connect_with_expiry("back", false, 3600));
    assert!(ack.session_present);
    h.advance(60 * SEC);
    assert!(topics(&mut h, w).is_empty(), "the client came back within the delay");
}

#[test]
fn a_will_delay_longer_than_the_session_goes_out_when_the_session_ends() {
    let b = broker();
    let mut h = Harness::new(&b);
    let w = subscriber(&mut h, "watcher", "will/#");
    let a = connected(&mut h, with_will(connect_with_expiry("short", true, 5), "will/short", Some(600)));
    h.drop_connection(a);
    h.advance(4 * SEC);
    assert!(topics(&mut h, w).is_empty());
    h.advance(SEC);
    assert_eq!(topics(&mut h, w), ["will/short"], "sent at the session's end (MQTT-3.1.3-9)");
    let (_again, ack) = h.connect(connect_with_expiry("short", false, 5));
    assert!(!ack.session_present, "the session ended");
}

// ---- session and message expiry ----

#[test]
fn session_ends_after_its_expiry_interval() {
    let b = broker();
    let mut h = Harness::new(&b);
    let c = connected(&mut h, connect_with_expiry("exp1", true, 1));
    h.send(c, Packet::Subscribe(subscribe("exp/old", QoS::AtLeastOnce)));
    h.send(c, disconnect(ReasonCode::Success));
    assert_eq!(b.counts().1, 1, "the offline session keeps its subscription");
    h.advance(Duration::from_millis(999));
    assert_eq!(b.counts().1, 1, "not before its expiry");
    h.advance(Duration::from_millis(1));
    assert_eq!(b.counts().0, 0, "the session is gone");
    assert_eq!(b.counts().1, 0, "and its subscription");
    let (_c, ack) = h.connect(connect_with_expiry("exp1", false, 1));
    assert!(!ack.session_present, "the session expired");
}

#[test]
fn session_within_its_expiry_interval_is_resumed_with_what_was_queued() {
    let b = broker();
    let mut h = Harness::new(&b);
    let c = connected(&mut h, connect_with_expiry("exp60", true, 60));
    h.send(c, Packet::Subscribe(subscribe("exp/kept", QoS::AtLeastOnce)));
    h.drop_connection(c);
    let p = connected(&mut h, connect_packet("exp-pub", true));
    h.send(p, Packet::Publish(publish("exp/kept", QoS::AtLeastOnce, "queued")));
    h.advance(59 * SEC);
    let (c, ack) = h.connect(connect_with_expiry("exp60", false, 60));
    assert!(ack.session_present);
    assert_eq!(topics(&mut h, c), ["exp/kept"]);
}

#[test]
fn session_expiry_zero_ends_the_session_at_disconnect() {
    let b = broker();
    let mut h = Harness::new(&b);
    let c = connected(&mut h, connect_packet("exp0", true));
    h.send(c, Packet::Subscribe(subscribe("exp/zero", QoS::AtLeastOnce)));
    h.send(c, disconnect(ReasonCode::Success));
    let (_c, ack) = h.connect(connect_packet("exp0", false));
    assert!(!ack.session_present);
}

#[test]
fn a_queued_message_past_its_expiry_is_not_delivered_and_the_rest_carry_what_is_left() {
    let b = broker();
    let mut h = Harness::new(&b);
    let c = connected(&mut h, connect_with_expiry("offline", true, 3600));
    h.send(c, Packet::Subscribe(subscribe("exp/+", QoS::AtLeastOnce)));
    h.drop_connection(c);
    let p = connected(&mut h, connect_packet("exp-pub", true));
    let expiring = |topic: &str, secs: u32, id: u16| {
        let mut m = Publish { packet_id: id, ..publish(topic, QoS::AtLeastOnce, "x") };
        m.properties.message_expiry_interval = Some(secs);
        Packet::Publish(m)
    };
    h.send(p, expiring("exp/short", 10, 1));
    h.send(p, expiring("exp/long", 100, 2));
    h.advance(30 * SEC);
    let (c, _) = h.connect(connect_with_expiry("offline", false, 3600));
    let got = publishes(h.received(c));
    assert_eq!(got.len(), 1, "the 10 s message expired while the client was away");
    assert_eq!(&*got[0].topic, "exp/long");
    assert_eq!(got[0].properties.message_expiry_interval, Some(70), "the time left is forwarded");
}

#[test]
fn a_retained_message_expires_for_later_subscribers_and_a_new_one_carries_what_is_left() {
    let b = broker();
    let mut h = Harness::new(&b);
    let p = connected(&mut h, connect_packet("ret-pub", true));
    let mut m = Publish { packet_id: 1, retain: true, ..publish("ret/brief", QoS::AtLeastOnce, "x") };
    m.properties.message_expiry_interval = Some(10);
    h.send(p, Packet::Publish(m));
    h.advance(4 * SEC);
    let retained = |h: &mut Harness<'_>, client_id: &str| {
        let c = connected(h, connect_packet(client_id, true));
        h.send(c, Packet::Subscribe(subscribe("ret/#", QoS::AtLeastOnce)));
        publishes(h.received(c))
    };
    let got = retained(&mut h, "ret-early");
    assert_eq!(got.len(), 1, "within its expiry the retained message is sent");
    assert!(got[0].retain);
    assert_eq!(got[0].properties.message_expiry_interval, Some(6), "the time left is forwarded");
    h.advance(7 * SEC);
    assert!(retained(&mut h, "ret-late").is_empty(), "past its expiry the retained message is gone");
}

// ---- keep alive ----

fn with_keep_alive(client_id: &str, secs: u16, version: ProtocolVersion) -> Connect {
    Connect { keep_alive: secs, protocol: version, ..connect_packet(client_id, true) }
}

#[test]
fn idle_v5_client_gets_disconnect_0x8d_after_one_and_a_half_intervals_and_its_will_goes_out() {
    let b = broker();
    let mut h = Harness::new(&b);
    let w = subscriber(&mut h, "watcher", "will/#");
    let c = connected(&mut h, with_will(with_keep_alive("idle5", 10, V5), "will/idle5", None));
    h.advance(14 * SEC);
    assert_eq!(h.closed(c), None, "within 1.5 x keep alive");
    h.advance(SEC + SWEEP);
    assert_eq!(disconnected_with(&mut h, c), Some(ReasonCode::KeepAliveTimeout));
    assert_eq!(topics(&mut h, w), ["will/idle5"], "a keep-alive timeout sends the will");
}

/// The sweep that enforces keep alive runs this often.
const SWEEP: Duration = braid_broker::broker::SWEEP_INTERVAL;

#[test]
fn idle_v311_client_is_closed_after_one_and_a_half_intervals_without_disconnect() {
    let b = broker();
    let mut h = Harness::new(&b);
    let c = connected(&mut h, with_keep_alive("idle311", 2, V311));
    h.advance(2 * SEC);
    assert_eq!(h.closed(c), None);
    h.advance(SEC + SWEEP);
    assert_eq!(h.closed(c), Some(ReasonCode::KeepAliveTimeout));
    assert!(h.received(c).is_empty(), "3.1.1 has no DISCONNECT from the server");
}

#[test]
fn pings_keep_a_client_alive() {
    let b = broker();
    let mut h = Harness::new(&b);
    let c = connected(&mut h, with_keep_alive("pinger", 1, V5));
    for _ in 0..20 {
        h.advance(Duration::from_millis(1000));
        h.send(c, Packet::PingReq);
        assert!(matches!(h.received(c)[..], [Packet::PingResp]));
    }
    assert_eq!(h.closed(c), None, "20 s of pings with keep alive 1 s");
}

#[test]
fn a_connection_that_comes_after_one_that_ended_has_a_keep_alive_clock_of_its_own() {
    // The second connection takes the liveness slot the first one left.
    let b = broker();
    let mut h = Harness::new(&b);
    let first = connected(&mut h, with_keep_alive("short", 1, V5));
    h.advance(SEC);
    h.drop_connection(first);
    let second = connected(&mut h, with_keep_alive("long", 10, V5));
    h.advance(2 * SEC + SWEEP);
    assert_eq!(h.closed(second), None, "1.5 x its own keep alive, not the first one's, nor from then");
    h.advance(13 * SEC);
    assert_eq!(h.closed(second), Some(ReasonCode::KeepAliveTimeout));
}

#[test]
fn server_keep_alive_is_sent_when_the_client_asks_for_none_or_too_much_and_is_enforced() {
    let mut config = Config::embedded();
    config.mqtt.max_keep_alive = 5;
    let b = Broker::new(config);
    let mut h = Harness::new(&b);
    let (_, ack) = h.connect(with_keep_alive("ka60", 60, V5));
    assert_eq!(ack.properties.server_keep_alive, Some(5), "asked for 60");
    let (_, ack) = h.connect(with_keep_alive("ka3", 3, V5));
    assert_eq!(ack.properties.server_keep_alive, None, "3 is allowed as asked");
    let (c, ack) = h.connect(with_keep_alive("ka0", 0, V5));
    assert_eq!(ack.properties.server_keep_alive, Some(5), "asked for 0");
    h.advance(8 * SEC + SWEEP);
    assert_eq!(h.closed(c), Some(ReasonCode::KeepAliveTimeout), "the granted 5 s is the one enforced");
}

// ---- Receive Maximum ----

fn receive_maximum_2() -> std::sync::Arc<Broker> {
    let mut config = Config::embedded();
    config.mqtt.receive_maximum = 2;
    Broker::new(config)
}

fn qos2(id: u16) -> Packet {
    Packet::Publish(Publish { packet_id: id, ..publish("rm/t", QoS::ExactlyOnce, "x") })
}

fn pubrec(id: u16) -> Packet {
    Packet::PubRec(Ack::new(id))
}

#[test]
fn third_unreleased_qos2_publish_exceeds_receive_maximum_2() {
    let b = receive_maximum_2();
    let mut h = Harness::new(&b);
    let (c, ack) = h.connect(connect_packet("rm", true));
    assert_eq!(ack.properties.receive_maximum, Some(2));
    h.send(c, qos2(1));
    h.send(c, qos2(2));
    assert_eq!(h.received(c), [pubrec(1), pubrec(2)]);
    h.send(c, qos2(3));
    assert_eq!(disconnected_with(&mut h, c), Some(ReasonCode::ReceiveMaximumExceeded));
}

#[test]
fn released_qos2_publish_frees_its_slot_and_qos1_never_counts() {
    let b = receive_maximum_2();
    let mut h = Harness::new(&b);
    let c = connected(&mut h, connect_packet("rm-ok", true));
    h.send(c, qos2(1));
    h.send(c, qos2(2));
    // A resent PUBLISH of an id already held takes no new slot.
    h.send(c, Packet::Publish(Publish { dup: true, packet_id: 2, ..publish("rm/t", QoS::ExactlyOnce, "x") }));
    assert_eq!(h.received(c), [pubrec(1), pubrec(2), pubrec(2)]);
    h.send(c, Packet::PubRel(Ack::new(1)));
    assert_eq!(h.received(c), [Packet::PubComp(Ack::new(1))]);
    h.send(c, qos2(3));
    assert_eq!(h.received(c), [pubrec(3)]);
    for id in 10..20 {
        h.send(c, Packet::Publish(Publish { packet_id: id, ..publish("rm/t", QoS::AtLeastOnce, "x") }));
    }
    assert_eq!(h.received(c).len(), 10, "ten PUBACKs");
    assert_eq!(h.closed(c), None);
}

/// Resending is sending: a client that resumes with Receive Maximum 1 gets one unacknowledged
/// PUBLISH at a time, the rest as it acknowledges [MQTT-3.3.4-9].
#[test]
fn resume_resends_within_the_new_receive_maximum() {
    let b = broker();
    let mut h = Harness::new(&b);
    let limited = |clean, receive_maximum| {
        let mut c = connect_with_expiry("rm-resume", clean, 300);
        c.properties.receive_maximum = Some(receive_maximum);
        c
    };
    let sub = connected(&mut h, limited(true, 10));
    h.send(sub, Packet::Subscribe(subscribe("rmr/t", QoS::AtLeastOnce)));
    let p = connected(&mut h, connect_packet("rmr-pub", true));
    for id in 1..=5 {
        h.send(p, Packet::Publish(Publish { packet_id: id, ..publish("rmr/t", QoS::AtLeastOnce, "m") }));
    }
    let first: Vec<u16> = publishes(h.received(sub)).iter().map(|p| p.packet_id).collect();
    assert_eq!(first.len(), 5);
    h.drop_connection(sub);

    let (sub, ack) = h.connect(limited(false, 1));
    assert!(ack.session_present);
    for id in first {
        let again = publishes(h.received(sub));
        assert_eq!(again.len(), 1, "one at a time");
        assert_eq!((again[0].packet_id, again[0].dup), (id, true));
        h.send(sub, Packet::PubAck(Ack::new(id)));
    }
    assert!(h.received(sub).is_empty());
}

// ---- shared subscriptions ----

#[test]
fn a_shared_group_member_that_goes_offline_gets_nothing_more_while_another_member_can_take_it() {
    let b = broker();
    let mut h = Harness::new(&b);
    let member = |h: &mut Harness<'_>, id: &str, clean| {
        let k = connected(h, connect_with_expiry(id, clean, 3600));
        h.send(k, Packet::Subscribe(subscribe("$share/g/jobs/#", QoS::AtLeastOnce)));
        h.received(k);
        k
    };
    let a = member(&mut h, "worker-a", true);
    let m2 = member(&mut h, "worker-b", true);
    let p = connected(&mut h, connect_packet("producer", true));
    let send = |h: &mut Harness<'_>, n: u16| {
        for id in 1..=n {
            h.send(
                p,
                Packet::Publish(Publish { packet_id: id, ..publish("jobs/x", QoS::AtLeastOnce, "job") }),
            );
        }
    };
    send(&mut h, 4);
    assert_eq!((topics(&mut h, a).len(), topics(&mut h, m2).len()), (2, 2), "round robin while both are up");
    h.drop_connection(a);
    send(&mut h, 6);
    assert_eq!(topics(&mut h, m2).len(), 6, "every job goes to the member that is online");
    let (a, ack) = h.connect(connect_with_expiry("worker-a", false, 3600));
    assert!(ack.session_present);
    assert!(topics(&mut h, a).is_empty(), "nothing was parked in the offline member's queue");
}
