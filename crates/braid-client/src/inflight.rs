//! Outbound QoS 1/2 publishes awaiting acknowledgement: packet identifiers, the QoS 2
//! handshake, what is still to be (re)sent within the window, and the completions that resolve
//! each [`crate::PublishHandle`].
//!
//! Sans-IO: packets in, packets and completions out; the connection task does the rest.

use std::collections::{HashMap, VecDeque};

use braid_proto::{Ack, Packet, ReasonCode};
use tokio::sync::oneshot;

use crate::Error;

/// Resolves one [`crate::PublishHandle`].
pub(crate) type Done = oneshot::Sender<Result<ReasonCode, Error>>;

/// A publish that has finished, for good or bad; its window slot is free again.
#[derive(Debug)]
pub(crate) struct Completion {
    pub done: Option<Done>,
    pub result: Result<ReasonCode, Error>,
}

impl Completion {
    /// Hands the result to the application, if it still waits for it.
    pub(crate) fn resolve(self) {
        if let Some(done) = self.done {
            let _ = done.send(self.result);
        }
    }
}

/// Where a QoS 1/2 publish is in its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// PUBLISH sent (or to be sent); waiting for PUBACK or PUBREC.
    Published,
    /// QoS 2: PUBREC received, PUBREL sent; waiting for PUBCOMP.
    Released,
}

#[derive(Debug)]
struct Entry {
    /// The PUBLISH, packet id set, kept for resending.
    packet: Box<Packet>,
    stage: Stage,
    /// Transmitted on the current connection.
    sent: bool,
    /// Order of submission, so resends keep the original order.
    seq: u64,
    /// QoS 2: the PUBREC reason, reported when PUBCOMP completes the exchange.
    received: ReasonCode,
    done: Option<Done>,
}

/// What to put on the wire next for an in-flight publish.
pub(crate) enum Transmission<'a> {
    /// A PUBLISH (the DUP flag already set for a resend).
    Publish(&'a Packet),
    /// A PUBREL for a released QoS 2 publish.
    PubRel(u16),
}

/// The outbound window.
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    entries: HashMap<u16, Entry>,
    /// Ids to transmit, in order.
    unsent: VecDeque<u16>,
    /// Entries transmitted on this connection and not yet complete.
    sent: usize,
    next_id: u16,
    next_seq: u64,
}

impl Inflight {
    /// Publishes not yet complete (each holds a window slot).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// A packet identifier used neither here nor by `busy` (SUBSCRIBE / UNSUBSCRIBE awaiting
    /// their acks); `None` if all 65,535 are taken.
    pub(crate) fn allocate_id(&mut self, busy: impl Fn(u16) -> bool) -> Option<u16> {
        for _ in 0..u16::MAX {
            self.next_id = self.next_id.checked_add(1).unwrap_or(1);
            let id = self.next_id;
            if !self.entries.contains_key(&id) && !busy(id) {
                return Some(id);
            }
        }
        None
    }

    /// Adds a QoS 1/2 PUBLISH whose packet id is `id` (from [`Inflight::allocate_id`]); it is
    /// transmitted after everything queued before it, once the window has room.
    pub(crate) fn push(&mut self, id: u16, packet: Box<Packet>, done: Option<Done>) {
        debug_assert!(matches!(&*packet, Packet::Publish(p) if p.packet_id == id));
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(
            id,
            Entry { packet, stage: Stage::Published, sent: false, seq, received: ReasonCode::Success, done },
        );
        self.unsent.push_back(id);
    }

    /// The next packet to transmit while fewer than `window` publishes are outstanding on
    /// this connection; the entry counts as sent from now on.
    pub(crate) fn poll_transmit(&mut self, window: usize) -> Option<Transmission<'_>> {
        while self.sent < window {
            let id = self.unsent.pop_front()?;
            // An entry may have completed (or been acknowledged) after it was queued.
            match self.entries.get(&id) {
                Some(e) if !e.sent => {}
                _ => continue,
            }
            let e = self.entries.get_mut(&id)?;
            e.sent = true;
            self.sent += 1;
            return Some(match e.stage {
                Stage::Published => Transmission::Publish(&e.packet),
                Stage::Released => Transmission::PubRel(id),
            });
        }
        None
    }

    /// Removes an entry that could not be encoded.
    pub(crate) fn fail(&mut self, id: u16, error: Error) -> Option<Completion> {
        self.complete(id, Err(error))
    }

    fn complete(&mut self, id: u16, result: Result<ReasonCode, Error>) -> Option<Completion> {
        let e = self.entries.remove(&id)?;
        if e.sent {
            self.sent -= 1;
        }
        Some(Completion { done: e.done, result })
    }

    /// PUBACK: completes a QoS 1 publish. `None` for an unknown id or one that is not QoS 1.
    pub(crate) fn on_puback(&mut self, ack: &Ack) -> Option<Completion> {
        let e = self.entries.get(&ack.packet_id)?;
        if e.stage != Stage::Published || publish_qos(&e.packet) != 1 {
            return None;
        }
        self.complete(ack.packet_id, ack_result(ack.reason))
    }

    /// PUBREC: the PUBREL to answer with (always, even for an unknown id, with reason 0x92
    /// then) and, if the server refused the message, its completion.
    pub(crate) fn on_pubrec(&mut self, ack: &Ack) -> (Option<Ack>, Option<Completion>) {
        let id = ack.packet_id;
        let known = self.entries.get(&id).is_some_and(|e| publish_qos(&e.packet) == 2);
        if ack.reason.is_error() {
            // The exchange ends here; a PUBREL would be a protocol error.
            let completion = if known { self.complete(id, Err(Error::Rejected(ack.reason))) } else { None };
            return (None, completion);
        }
        if !known {
            return (Some(Ack::with_reason(id, ReasonCode::PacketIdentifierNotFound)), None);
        }
        if let Some(e) = self.entries.get_mut(&id) {
            e.stage = Stage::Released;
            e.received = ack.reason;
            if !e.sent {
                // A PUBREC for a resend we had not yet sent: it counts as sent now.
                e.sent = true;
                self.sent += 1;
            }
        }
        (Some(Ack::new(id)), None)
    }

    /// PUBCOMP: completes a QoS 2 publish that was released, with the PUBREC's reason.
    pub(crate) fn on_pubcomp(&mut self, ack: &Ack) -> Option<Completion> {
        let e = self.entries.get(&ack.packet_id)?;
        if e.stage != Stage::Released {
            return None;
        }
        let received = e.received;
        self.complete(ack.packet_id, Ok(received))
    }

    /// A new connection: everything is to be sent again, in the original order, PUBLISH with
    /// DUP and PUBREL for released QoS 2. If the server lost the session, released QoS 2
    /// publishes are complete (the server had accepted them) and go to `completed`, and the
    /// others are resent as they may never have arrived.
    pub(crate) fn on_reconnect(&mut self, session_present: bool, completed: &mut Vec<Completion>) {
        if !session_present {
            let released: Vec<u16> =
                self.entries.iter().filter(|(_, e)| e.stage == Stage::Released).map(|(id, _)| *id).collect();
            for id in released {
                completed.extend(self.complete(id, Ok(ReasonCode::Success)));
            }
        }
        let mut order: Vec<(u64, u16)> = Vec::with_capacity(self.entries.len());
        for (id, e) in self.entries.iter_mut() {
            e.sent = false;
            if let Packet::Publish(p) = &mut *e.packet {
                p.dup = true;
            }
            order.push((e.seq, *id));
        }
        order.sort_unstable();
        self.unsent = order.into_iter().map(|(_, id)| id).collect();
        self.sent = 0;
    }

    /// Ends every publish with `Closed` (the client is going away).
    pub(crate) fn close(&mut self) -> impl Iterator<Item = Completion> + '_ {
        self.unsent.clear();
        self.sent = 0;
        self.entries.drain().map(|(_, e)| Completion { done: e.done, result: Err(Error::Closed) })
    }
}

fn publish_qos(p: &Packet) -> u8 {
    match p {
        Packet::Publish(p) => p.qos as u8,
        _ => 0,
    }
}

fn ack_result(reason: ReasonCode) -> Result<ReasonCode, Error> {
    if reason.is_error() {
        Err(Error::Rejected(reason))
    } else {
        Ok(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::{Publish, QoS};

    fn publish(id: u16, qos: QoS) -> Box<Packet> {
        Box::new(Packet::Publish(Publish { qos, topic: "t".into(), packet_id: id, ..Default::default() }))
    }

    fn add(f: &mut Inflight, qos: QoS) -> (u16, oneshot::Receiver<Result<ReasonCode, Error>>) {
        let id = f.allocate_id(|_| false).unwrap();
        let (tx, rx) = oneshot::channel();
        f.push(id, publish(id, qos), Some(tx));
        (id, rx)
    }

    /// Drains what may be sent with `window`: (id, is_pubrel, dup).
    fn transmit(f: &mut Inflight, window: usize) -> Vec<(u16, bool, bool)> {
        let mut out = Vec::new();
        while let Some(t) = f.poll_transmit(window) {
            out.push(match t {
                Transmission::Publish(Packet::Publish(p)) => (p.packet_id, false, p.dup),
                Transmission::Publish(other) => panic!("not a publish: {other:?}"),
                Transmission::PubRel(id) => (id, true, false),
            });
        }
        out
    }

    #[test]
    fn window_bounds_what_is_sent_and_acks_free_it() {
        let mut f = Inflight::default();
        let (a, _) = add(&mut f, QoS::AtLeastOnce);
        let (b, _) = add(&mut f, QoS::AtLeastOnce);
        let (c, _) = add(&mut f, QoS::AtLeastOnce);
        assert_eq!(transmit(&mut f, 2), [(a, false, false), (b, false, false)]);
        assert!(transmit(&mut f, 2).is_empty());
        let done = f.on_puback(&Ack::new(b)).unwrap();
        assert!(matches!(done.result, Ok(ReasonCode::Success)));
        assert_eq!(transmit(&mut f, 2), [(c, false, false)]);
        assert!(f.on_puback(&Ack::new(b)).is_none(), "a second PUBACK is ignored");
        assert_eq!(f.len(), 2);
    }

    #[test]
    fn qos2_goes_through_pubrec_and_pubcomp() {
        let mut f = Inflight::default();
        let (id, _) = add(&mut f, QoS::ExactlyOnce);
        transmit(&mut f, 10);
        assert!(f.on_puback(&Ack::new(id)).is_none(), "PUBACK does not complete QoS 2");
        assert!(f.on_pubcomp(&Ack::new(id)).is_none(), "PUBCOMP before PUBREC is ignored");
        let (rel, done) = f.on_pubrec(&Ack::new(id));
        assert_eq!(rel, Some(Ack::new(id)));
        assert!(done.is_none());
        assert!(f.on_pubcomp(&Ack::new(id)).is_some());
        assert_eq!(f.len(), 0);
    }

    #[test]
    fn failure_reasons_reject() {
        let mut f = Inflight::default();
        let (q1, _) = add(&mut f, QoS::AtLeastOnce);
        let (q2, _) = add(&mut f, QoS::ExactlyOnce);
        transmit(&mut f, 10);
        let c = f.on_puback(&Ack::with_reason(q1, ReasonCode::NotAuthorized)).unwrap();
        assert!(matches!(c.result, Err(Error::Rejected(ReasonCode::NotAuthorized))));
        let (rel, c) = f.on_pubrec(&Ack::with_reason(q2, ReasonCode::QuotaExceeded));
        assert!(rel.is_none(), "no PUBREL after a failed PUBREC");
        assert!(matches!(c.unwrap().result, Err(Error::Rejected(ReasonCode::QuotaExceeded))));
        // "No matching subscribers" is a success.
        let (q1, _) = add(&mut f, QoS::AtLeastOnce);
        transmit(&mut f, 10);
        let c = f.on_puback(&Ack::with_reason(q1, ReasonCode::NoMatchingSubscribers)).unwrap();
        assert!(matches!(c.result, Ok(ReasonCode::NoMatchingSubscribers)));
    }

    #[test]
    fn unknown_pubrec_gets_pubrel_with_not_found() {
        let mut f = Inflight::default();
        let (rel, done) = f.on_pubrec(&Ack::new(7));
        assert_eq!(rel, Some(Ack::with_reason(7, ReasonCode::PacketIdentifierNotFound)));
        assert!(done.is_none());
    }

    #[test]
    fn reconnect_resends_in_order_with_dup_and_pubrel() {
        let mut f = Inflight::default();
        let (a, _) = add(&mut f, QoS::AtLeastOnce);
        let (b, _) = add(&mut f, QoS::ExactlyOnce);
        let (c, _) = add(&mut f, QoS::AtLeastOnce);
        transmit(&mut f, 2);
        f.on_pubrec(&Ack::new(b));
        let mut done = Vec::new();
        f.on_reconnect(true, &mut done);
        assert!(done.is_empty());
        assert_eq!(transmit(&mut f, 10), [(a, false, true), (b, true, false), (c, false, true)]);
    }

    #[test]
    fn reconnect_without_session_completes_released_and_resends_the_rest() {
        let mut f = Inflight::default();
        let (a, _) = add(&mut f, QoS::ExactlyOnce);
        let (b, _) = add(&mut f, QoS::ExactlyOnce);
        transmit(&mut f, 10);
        f.on_pubrec(&Ack::new(a));
        let mut done = Vec::new();
        f.on_reconnect(false, &mut done);
        assert_eq!(done.len(), 1);
        assert!(matches!(done[0].result, Ok(ReasonCode::Success)));
        assert_eq!(transmit(&mut f, 10), [(b, false, true)]);
    }

    #[test]
    fn smaller_window_after_reconnect_holds_back_resends() {
        let mut f = Inflight::default();
        let ids: Vec<u16> = (0..4).map(|_| add(&mut f, QoS::AtLeastOnce).0).collect();
        assert_eq!(transmit(&mut f, 10).len(), 4);
        f.on_reconnect(true, &mut Vec::new());
        assert_eq!(transmit(&mut f, 1), [(ids[0], false, true)]);
        f.on_puback(&Ack::new(ids[0]));
        assert_eq!(transmit(&mut f, 1), [(ids[1], false, true)]);
    }

    #[test]
    fn ids_skip_busy_ones_and_wrap() {
        let mut f = Inflight { next_id: u16::MAX - 1, ..Default::default() };
        assert_eq!(f.allocate_id(|_| false), Some(u16::MAX));
        assert_eq!(f.allocate_id(|id| id == 1), Some(2), "0 is never used, 1 is busy");
        let (id, _) = add(&mut f, QoS::AtLeastOnce);
        assert_eq!(id, 3);
        f.next_id = 2;
        assert_eq!(f.allocate_id(|_| false), Some(4), "in-flight ids are skipped");
    }

    #[test]
    fn close_fails_everything() {
        let mut f = Inflight::default();
        add(&mut f, QoS::AtLeastOnce);
        add(&mut f, QoS::ExactlyOnce);
        let all: Vec<Completion> = f.close().collect();
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(|c| matches!(c.result, Err(Error::Closed))));
        assert_eq!(f.len(), 0);
    }
}
