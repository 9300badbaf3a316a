//! The sans-IO state of one session: subscriptions, queue, in-flight window, inbound QoS 2
//! ids, and (while a client is attached) the connection's outbound state. Packets and time go
//! in, encoded bytes come out; nothing here touches a socket or a clock.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use braid_proto::{
    encode, encode_publish, Ack, ByteString, BytesMut, LastWill, Packet, Properties, ProtocolVersion,
    PublishView, QoS, ReasonCode,
};

use super::alias::{AliasUse, OutboundAliases};
use super::inflight::{Entry, Inflight, Stage};
use super::persist::{Persist, Restore};
use super::qos2::Qos2Ids;
use super::queue::{Enqueued, Queue, QueueLimits};
use super::subscriptions::Subscriptions;
use crate::config::OverflowPolicy;
use crate::control::ConnControl;
use crate::message::{Delivery, Message, StreamTag};
use crate::store::{self, SessionRecord, Stored, Ticket};
use crate::transport_kind::Transport;

/// The outbound side of the connection currently attached to the session.
#[derive(Debug)]
pub struct Link {
    /// Which attachment this is; a stale connection compares it before touching the session.
    pub generation: u64,
    /// Protocol version of the connection.
    pub version: ProtocolVersion,
    /// The client's Maximum Packet Size.
    pub max_packet_size: u32,
    /// Unacknowledged QoS 1/2 deliveries allowed (client Receive Maximum, capped by config).
    pub window: u16,
    /// A wake is owed: the session waits in a [`super::Wakes`], so deliveries made meanwhile
    /// need no wake of their own.
    pub(super) wake_owed: bool,
    /// Server-assigned topic aliases.
    pub aliases: OutboundAliases,
    /// Closes the connection (takeover, protocol error, shutdown).
    pub ctl: Arc<ConnControl>,
    /// Who the client is and where it came from.
    pub origin: Origin,
}

/// Where an attached client came from and what it was granted, for operators.
#[derive(Debug, Clone)]
pub struct Origin {
    /// The listener it connected through; None for an in-process client.
    pub transport: Option<Transport>,
    /// Its address.
    pub peer: SocketAddr,
    /// The user it authenticated as, if any.
    pub username: Option<Box<str>>,
    /// Keep alive in seconds, as granted (0: none).
    pub keep_alive: u16,
    /// When it connected, in seconds since the Unix epoch.
    pub connected_at: u64,
}

impl Default for Origin {
    fn default() -> Self {
        Origin {
            transport: None,
            peer: SocketAddr::from(([0, 0, 0, 0], 0)),
            username: None,
            keep_alive: 0,
            connected_at: 0,
        }
    }
}

impl Link {
    /// The outbound state of a new connection; the generation is set by
    /// [`SessionState::attach`].
    pub fn new(
        version: ProtocolVersion,
        window: u16,
        max_packet_size: u32,
        topic_alias_maximum: u16,
        ctl: Arc<ConnControl>,
    ) -> Link {
        let aliases = OutboundAliases::new(topic_alias_maximum);
        Link {
            generation: 0,
            version,
            max_packet_size,
            window,
            wake_owed: false,
            aliases,
            ctl,
            origin: Origin::default(),
        }
    }
}

/// Publishers held back by a session that may go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// None yet.
    None,
    /// This many, longest waiting first.
    First(u32),
    /// Every one (the queue is empty, or its client went away).
    All,
}

/// Delivery `seq` of a persistent session is finished.
fn done(persist: &mut Option<Box<Persist>>, seq: u64) {
    if let Some(p) = persist.as_deref_mut() {
        p.done(seq);
    }
}

/// What one call of [`SessionState::poll_transmit`] produced.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// PUBLISH packets encoded, by QoS.
    pub published: [u64; 3],
    /// Deliveries dropped because their message expired.
    pub expired: u64,
    /// Deliveries dropped because they were too large for the client.
    pub too_large: u64,
    /// More is ready but the byte budget was reached: call again after writing.
    pub more: bool,
}

/// Where [`SessionState::poll_transmit_to`] encodes deliveries: one buffer for a TCP
/// connection, one per stream for QUIC multi-stream, so that a full stream does not hold back
/// deliveries for the others.
pub trait Outbox {
    /// True if the buffer for deliveries tagged `stream` has room now.
    fn has_room(&self, stream: StreamTag) -> bool;
    /// The buffer for deliveries tagged `stream`.
    fn buffer(&mut self, stream: StreamTag) -> &mut BytesMut;
    /// True when no buffer has room: nothing more can be encoded now.
    fn is_full(&self) -> bool;
}

/// One buffer for every delivery, full at `budget` bytes.
struct SingleBuffer<'a> {
    buf: &'a mut BytesMut,
    budget: usize,
}

impl Outbox for SingleBuffer<'_> {
    fn has_room(&self, _: StreamTag) -> bool {
        !self.is_full()
    }

    fn buffer(&mut self, _: StreamTag) -> &mut BytesMut {
        self.buf
    }

    fn is_full(&self) -> bool {
        self.buf.len() >= self.budget
    }
}

/// A session's shared subscriptions whose groups have other members, as (group, filter):
/// what came through them may go to another member when the session's client goes away.
#[derive(Debug, Default)]
pub struct OtherMembers(pub Vec<(Box<str>, Box<str>)>);

impl OtherMembers {
    /// True if no shared subscription has another member.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The (group, filter) of the shared subscription `d` came through, if another member
    /// can take it over.
    pub fn of(&self, d: &Delivery) -> Option<(&str, &str)> {
        let group = d.group.as_deref()?;
        self.0
            .iter()
            .find(|(g, f)| **g == *group && braid_proto::topic::matches(f, &d.msg.topic))
            .map(|(g, f)| (&**g, &**f))
    }

    /// True if another member can take `d` over.
    pub fn covers(&self, d: &Delivery) -> bool {
        self.of(d).is_some()
    }
}

/// All state of one session.
#[derive(Debug)]
pub struct SessionState {
    /// Subscriptions by full filter (including any `$share/group/` prefix).
    pub subscriptions: Subscriptions,
    /// Deliveries waiting for the window or for the client.
    pub queue: Queue,
    /// Outbound QoS 1/2 awaiting acknowledgement.
    pub inflight: Inflight,
    /// Inbound QoS 2 packet ids received and not yet released (exactly-once).
    pub incoming_qos2: Qos2Ids,
    /// The attached connection, if the client is online.
    pub link: Option<Link>,
    /// Session Expiry Interval in seconds (`u32::MAX` never expires).
    pub expiry_secs: u32,
    /// Will message of the attached (or last) connection, with its delay.
    pub will: Option<Box<LastWill>>,
    /// Attachments so far; the current link carries the latest.
    pub generation: u64,
    /// Deliveries this session has dropped (queue full, expired, too large).
    pub dropped: u64,
    /// Publishers waiting for this queue to drain (backpressure), as counted when they began
    /// to wait.
    held: u32,
    /// Since when the attached client has been behind with QoS 0 publishers paced for it
    /// (None once its queue empties).
    behind_since: Option<Instant>,
    /// The store link of a persistent session (None: nothing of it is written anywhere).
    pub persist: Option<Box<Persist>>,
}

impl SessionState {
    /// A fresh session with the given queue limits.
    pub fn new(limits: Arc<QueueLimits>) -> SessionState {
        SessionState {
            subscriptions: Subscriptions::default(),
            queue: Queue::new(limits),
            inflight: Inflight::default(),
            incoming_qos2: Qos2Ids::default(),
            link: None,
            expiry_secs: 0,
            will: None,
            generation: 0,
            dropped: 0,
            held: 0,
            behind_since: None,
            persist: None,
        }
    }

    /// True while connection `generation` is the attached one.
    pub fn is_attached(&self, generation: u64) -> bool {
        self.link.as_ref().is_some_and(|l| l.generation == generation)
    }

    /// Deliveries waiting to be sent: queued in memory, and, while the client is offline,
    /// waiting in the store.
    pub fn waiting(&self) -> usize {
        let stored = self.persist.as_ref().and_then(|p| p.offline.as_ref()).map_or(0, |q| q.len());
        self.queue.len() + stored
    }

    /// Publishers this session holds back now (see [`crate::broker::Published::held`]).
    pub fn holding(&self) -> u32 {
        self.held
    }

    /// True while a client is attached.
    pub fn is_online(&self) -> bool {
        self.link.is_some()
    }

    /// Attaches a new connection; unacknowledged deliveries will be resent with DUP.
    /// Returns the new generation.
    pub fn attach(&mut self, mut link: Link) -> u64 {
        self.generation += 1;
        link.generation = self.generation;
        self.link = Some(link);
        self.behind_since = None;
        self.inflight.mark_all_unsent();
        self.generation
    }

    /// Detaches connection `generation` if it is still the attached one; QoS 0 deliveries
    /// waiting for it are dropped unless the session queues QoS 0. True if it was attached.
    /// A persistent session's deliveries go to disk and leave memory.
    pub fn detach(&mut self, generation: u64) -> bool {
        if self.is_attached(generation) {
            self.link = None;
            match self.persist.as_deref_mut() {
                Some(p) => {
                    let limits = self.queue.limits().clone();
                    p.spill(self.inflight.drain().map(|e| e.delivery).chain(self.queue.drain()), limits);
                }
                None => self.queue.drop_qos0(),
            }
            true
        } else {
            false
        }
    }

    /// Gives back the memory deliveries left in the queue, for a connection that goes idle
    /// (parks): a session whose queue is empty again costs what a fresh one does.
    pub fn release_idle_memory(&mut self) {
        self.queue.shrink_to_fit();
    }

    /// Takes out the deliveries that came through the shared subscriptions `others` can take
    /// over and that the client may not have: queued ones, and QoS 1 ones sent without a
    /// PUBACK yet. A QoS 2 one sent stays: its client may have it, and is owed it exactly
    /// once. A persistent session's store forgets those taken.
    pub fn take_shared(&mut self, others: &OtherMembers) -> Vec<Delivery> {
        if others.is_empty() {
            return Vec::new();
        }
        let unacked = |e: &Entry| e.stage == Stage::Published && e.delivery.qos == QoS::AtLeastOnce;
        let mut taken = self.inflight.take_where(|e| unacked(e) && others.covers(&e.delivery));
        taken.extend(self.queue.take_where(|d| others.covers(d)));
        for d in &taken {
            done(&mut self.persist, d.seq);
        }
        taken
    }

    /// Offers a delivery to the session (and to the store, for a persistent session) at `now`.
    pub fn enqueue(&mut self, d: Delivery, now: Instant) -> Enqueued {
        let (online, qos) = (self.is_online(), d.qos);
        let r = match self.persist.as_deref_mut() {
            Some(p) if d.qos != QoS::AtMostOnce || self.queue.limits().queue_qos0 => {
                p.enqueue(d, &mut self.queue, online)
            }
            _ => self.queue.push(d, online),
        };
        if matches!(r, Enqueued::DroppedFull | Enqueued::QueuedDroppedOldest(_)) {
            self.dropped += 1;
        }
        if r != Enqueued::Queued {
            return r;
        }
        if qos == QoS::AtMostOnce {
            // Paced beyond the delivery window, and once the queue is full: the next QoS 0
            // delivery would be dropped.
            if let Some(until) = self.blocks_publishers_now().then(|| self.paced_until(now)).flatten() {
                return Enqueued::Paced(until);
            }
        } else if self.queue.limits().overflow == OverflowPolicy::Backpressure && self.over_backlog() {
            return Enqueued::QueuedOverLimit;
        }
        r
    }

    /// Until when a QoS 0 delivery to this client, which is behind, may pace its publisher: the
    /// pacing time counted from the first delivery it was behind for (until its queue empties);
    /// None once that has passed at `now`, or with pacing off.
    fn paced_until(&mut self, now: Instant) -> Option<Instant> {
        let pacing = self.queue.limits().qos0_pacing;
        if pacing.is_zero() {
            return None;
        }
        let until = *self.behind_since.get_or_insert(now) + pacing;
        (now < until).then_some(until)
    }

    /// True while the attached client's queue holds more than its delivery window and waits
    /// for the client: the client is not keeping up, and more queued would only wait longer.
    /// The queue waits for the client when the window is full, or when nothing is in flight to
    /// say otherwise (QoS 0 uses no window). While the window has room and acknowledgements
    /// are coming, the queue waits only for this connection's turn to write, and holding
    /// publishers would only cut the writes smaller (fan-out on a busy broker).
    fn over_backlog(&self) -> bool {
        self.is_online()
            && self.queue.len() > self.backlog_limit()
            && (self.window_full() || self.inflight.sent() == 0)
    }

    /// Queued deliveries above which publishers are held back: one adaptive window, or, for a
    /// queue that does not adapt, its own limit.
    fn backlog_limit(&self) -> usize {
        match self.queue.limits().adaptive {
            true => self.inflight.adaptive().size(),
            false => self.queue.limits().max_messages,
        }
    }

    /// Ticket of the session's latest change in the store (0 if it is not persisted).
    pub fn ticket(&self) -> Ticket {
        self.persist.as_ref().map_or(0, |p| p.ticket)
    }

    /// Writes the session's metadata to the store (persistent sessions only); `unix_now` is
    /// the time in seconds since the Unix epoch, kept as when an offline session went offline.
    pub fn save(&mut self, unix_now: u64) {
        let offline_since = (!self.is_online()).then_some(unix_now);
        let Some(p) = self.persist.as_deref_mut() else { return };
        p.save(SessionRecord {
            id: 0,
            client_id: ByteString::new(),
            expiry_secs: self.expiry_secs,
            will: self.will.as_deref().cloned(),
            subscriptions: self.subscriptions.iter().map(|(f, s)| (f.clone(), *s)).collect(),
            offline_since,
        });
    }

    /// The session ended: its store data goes.
    pub fn forget(&mut self) {
        if let Some(mut p) = self.persist.take() {
            p.end();
        }
    }

    /// Asks the store for the deliveries waiting on disk (a client reconnected); hand the
    /// answer to [`SessionState::restore`].
    pub fn load(&mut self) -> Option<Restore> {
        self.persist.as_deref_mut()?.load()
    }

    /// Puts deliveries read back from the store in front of the connection `generation`:
    /// those sent before are resent (DUP, same packet id, or PUBREL), the rest queued first.
    pub fn restore(&mut self, generation: u64, stored: Vec<Stored>) {
        if !self.is_attached(generation) {
            return;
        }
        let Some(p) = self.persist.as_deref_mut() else { return };
        p.offline = None;
        let mut queued = Vec::new();
        for s in stored {
            let stage = match s.stage {
                store::Stage::Queued => {
                    queued.push(s.delivery);
                    continue;
                }
                store::Stage::Sent => Stage::Published,
                store::Stage::Released => Stage::Released,
            };
            self.inflight.push_unsent(s.delivery, store::packet_id_for(s.seq), stage);
        }
        self.queue.push_front_all(queued);
    }

    /// Inbound QoS 2 PUBLISH with `id`: true if it is new (not received and unreleased).
    pub fn receive_qos2(&mut self, id: u16) -> bool {
        let new = self.incoming_qos2.insert(id);
        if let (true, Some(p)) = (new, self.persist.as_deref_mut()) {
            p.incoming_qos2(id, true);
        }
        new
    }

    /// PUBREL for inbound `id`: true if it was known.
    pub fn release_qos2(&mut self, id: u16) -> bool {
        let known = self.incoming_qos2.remove(id);
        if let (true, Some(p)) = (known, self.persist.as_deref_mut()) {
            p.incoming_qos2(id, false);
        }
        known
    }

    /// True while a connected client's queue holds publishers back (backpressure): it is
    /// full, or holds more than the client's delivery window.
    pub fn blocks_publishers_now(&self) -> bool {
        self.is_online() && (self.queue.is_full() || self.over_backlog())
    }

    /// [`SessionState::blocks_publishers_now`], counting a publisher that now waits.
    pub fn blocks_publishers(&mut self) -> bool {
        let blocks = self.blocks_publishers_now();
        self.held = self.held.saturating_add(u32::from(blocks));
        blocks
    }

    /// Which waiting publishers may go on now (see [`Release`]), asked after each transmit to
    /// the attached client (a client going away releases them all). Once the queue has drained
    /// to three quarters of its limits and of the delivery window, as many as there is room
    /// for below the window go, longest waiting first; all of them once it is empty. The gap
    /// keeps them from being woken for every single message.
    pub fn take_drained(&mut self) -> Release {
        if self.held == 0 {
            return Release::None;
        }
        let backlog = self.backlog_limit();
        let len = self.queue.len();
        if len == 0 {
            self.held = 0;
            return Release::All;
        }
        if !self.queue.is_drained() || len >= backlog * 3 / 4 {
            return Release::None;
        }
        let n = self.held.min((backlog - len) as u32);
        self.held -= n;
        Release::First(n)
    }

    /// True if the session can take a delivery now (used to pick a shared-subscription member).
    pub fn can_accept(&self) -> bool {
        self.is_online() && !self.blocks_publishers_now()
    }

    /// The message of the in-flight delivery `id` and the QoS it went at, that a PUBACK
    /// (`released` false) or a PUBCOMP (true) for `id` would complete.
    pub fn in_flight_message(&self, id: u16, released: bool) -> Option<(Arc<Message>, QoS)> {
        let stage = if released { Stage::Released } else { Stage::Published };
        self.inflight.delivery_of(id, stage).map(|d| (d.msg.clone(), d.qos))
    }

    /// PUBACK from the client, at `now`. False if the id is unknown.
    pub fn on_puback(&mut self, id: u16, now: Instant) -> bool {
        self.complete(id, Stage::Published, Some(now))
    }

    /// Ends delivery `id` at `stage`; an acknowledgement that arrived at `now` tells the
    /// adaptive window how long it took.
    fn complete(&mut self, id: u16, stage: Stage, now: Option<Instant>) -> bool {
        let full = self.adaptive_window_full();
        let Some((seq, sent_at)) = self.inflight.complete(id, stage) else { return false };
        done(&mut self.persist, seq);
        if let Some(now) = now {
            self.inflight.acknowledged(sent_at, now, full);
        }
        true
    }

    /// Unacknowledged QoS 1/2 deliveries the attached connection may have now: its Receive
    /// Maximum (capped by config) and, within that, its adaptive window (if its queue adapts).
    fn send_window(&self) -> usize {
        let adaptive = self.queue.limits().adaptive;
        self.link.as_ref().map_or(0, |l| match adaptive {
            true => usize::from(l.window).min(self.inflight.adaptive().size()),
            false => usize::from(l.window),
        })
    }

    /// True while the attached connection's window is in use up to its size.
    fn window_full(&self) -> bool {
        self.inflight.sent() >= self.send_window()
    }

    /// True while the adaptive window itself is in use up to its size: not while the Receive
    /// Maximum (or `mqtt.max_inflight`) keeps it below that, which shows nothing about whether
    /// the client could take more. Only a filled window grows.
    fn adaptive_window_full(&self) -> bool {
        self.inflight.sent() >= self.inflight.adaptive().size()
    }

    /// PUBREC from the client, at `now`: the PUBREL to answer with, or None if the client
    /// refused the message (a failure reason ends the exchange).
    pub fn on_pubrec(&mut self, ack: &Ack, now: Instant) -> Option<Ack> {
        if ack.reason.is_error() {
            self.complete(ack.packet_id, Stage::Published, Some(now));
            return None;
        }
        if let (Some(seq), Some(p)) =
            (self.inflight.seq_of(ack.packet_id, Stage::Published), self.persist.as_deref_mut())
        {
            p.stage(seq, store::Stage::Released);
        }
        let full = self.adaptive_window_full();
        let reason = match self.inflight.release(ack.packet_id) {
            Some(first) => {
                if let Some(sent_at) = first {
                    self.inflight.acknowledged(sent_at, now, full);
                }
                ReasonCode::Success
            }
            None => ReasonCode::PacketIdentifierNotFound,
        };
        Some(Ack::with_reason(ack.packet_id, reason))
    }

    /// PUBCOMP from the client. False if the id is unknown.
    pub fn on_pubcomp(&mut self, id: u16) -> bool {
        self.complete(id, Stage::Released, None)
    }

    /// Encodes what is ready for the attached client into `buf`, stopping once `buf` holds
    /// `budget` bytes: resends of unacknowledged deliveries (DUP) first, then queued
    /// deliveries while the in-flight window has room.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut BytesMut, budget: usize) -> Transmit {
        self.poll_transmit_to(now, &mut SingleBuffer { buf, budget })
    }

    /// [`SessionState::poll_transmit`] into the buffer of each delivery's stream: a delivery
    /// whose stream has no room is passed over for later ones whose stream has room.
    pub fn poll_transmit_to(&mut self, now: Instant, out: &mut impl Outbox) -> Transmit {
        let mut t = Transmit::default();
        let window = self.send_window();
        let Some(link) = self.link.as_mut() else {
            return t;
        };
        let version = link.version;
        // Resends count against the window of the new connection, which may be smaller.
        while self.inflight.sent() < window {
            if out.is_full() {
                t.more = true;
                break;
            }
            let Some(e) = self.inflight.next_unsent(now) else { break };
            let buf = out.buffer(e.delivery.stream);
            match e.stage {
                Stage::Published => match publish_head(link, &e.delivery, e.packet_id, true, now) {
                    Some(head) => {
                        let _ = encode_publish(&head.view(&e.delivery.msg), version, buf);
                    }
                    None => {
                        // Too large for the client now: discard it as if sent (MQTT-3.1.2-25).
                        let (id, stage) = (e.packet_id, e.stage);
                        let seq = self.inflight.complete(id, stage).map_or(0, |(seq, _)| seq);
                        done(&mut self.persist, seq);
                        t.too_large += 1;
                    }
                },
                Stage::Released => {
                    let _ = encode(&Packet::PubRel(Ack::new(e.packet_id)), version, buf);
                }
            }
        }
        while !t.more && !self.queue.is_empty() {
            // The oldest delivery whose stream has room (with one buffer: the front, if any).
            let Some(i) = self.queue.position(|d| out.has_room(d.stream)) else {
                t.more = true;
                break;
            };
            let window_full = self.inflight.len() >= window;
            if window_full && self.queue.get(i).is_some_and(|d| d.qos != QoS::AtMostOnce) {
                break;
            }
            let Some(front) = self.queue.get(i) else { break };
            // A persisted delivery's packet id is derived from its sequence number; in the
            // rare case that id is still in flight, wait for it.
            let stored_id = (front.seq != 0).then(|| store::packet_id_for(front.seq));
            if front.qos != QoS::AtMostOnce && stored_id.is_some_and(|id| self.inflight.in_use(id)) {
                break;
            }
            let Some(d) = self.queue.remove(i) else { break };
            if d.msg.is_expired(now) {
                done(&mut self.persist, d.seq);
                t.expired += 1;
                continue;
            }
            let Some(mut head) = publish_head(link, &d, 1, false, now) else {
                done(&mut self.persist, d.seq);
                t.too_large += 1;
                continue;
            };
            let buf = out.buffer(d.stream);
            t.published[head.qos as usize] += 1;
            match (d.qos, stored_id, self.persist.as_deref_mut()) {
                (QoS::AtMostOnce, _, persist) => {
                    if let Some(persist) = persist {
                        persist.done(d.seq);
                    }
                    let _ = encode_publish(&head.view(&d.msg), version, buf);
                    continue;
                }
                (_, Some(id), Some(persist)) => {
                    persist.stage(d.seq, store::Stage::Sent);
                    head.packet_id = id;
                    self.inflight.push_with_id(d, id, Stage::Published, now);
                }
                _ => head.packet_id = self.inflight.push(d, now),
            }
            // Encoded from the entry it is now: the message's topic and payload are borrowed.
            if let Some(sent) = self.inflight.last() {
                let _ = encode_publish(&head.view(&sent.delivery.msg), version, buf);
            }
        }
        if self.queue.is_empty() {
            self.behind_since = None;
        }
        self.dropped += t.expired + t.too_large;
        t
    }
}

/// Bytes a Topic Alias property adds to a PUBLISH.
const ALIAS_PROPERTY_LEN: usize = 3;
/// The largest packet MQTT can express (fixed header included), a bit over 256 MiB.
const MAX_PACKET: usize = 268_435_455 + 5;

/// A delivery's PUBLISH on one link but for its topic and payload, which it borrows from the
/// message when it is encoded ([`PublishHead::view`]): nothing of the message is cloned per
/// delivery, and no reference count the other deliveries share is touched.
struct PublishHead {
    dup: bool,
    qos: QoS,
    retain: bool,
    packet_id: u16,
    properties: Properties,
    /// The topic goes as an alias the client knows: the topic name is empty.
    aliased: bool,
}

impl PublishHead {
    fn view<'a>(&'a self, msg: &'a Message) -> PublishView<'a> {
        PublishView {
            dup: self.dup,
            qos: self.qos,
            retain: self.retain,
            topic: if self.aliased { "" } else { &msg.topic },
            packet_id: self.packet_id,
            properties: &self.properties,
            payload: &msg.payload,
        }
    }
}

/// The PUBLISH for one delivery on this link, with expiry, subscription id and topic alias
/// applied; `None` if it exceeds the client's Maximum Packet Size (the spec says drop it).
fn publish_head(
    link: &mut Link,
    d: &Delivery,
    packet_id: u16,
    dup: bool,
    now: Instant,
) -> Option<PublishHead> {
    let msg = &d.msg;
    let mut p = PublishHead {
        dup: dup && d.qos != QoS::AtMostOnce,
        qos: d.qos,
        retain: d.retain,
        packet_id: if d.qos == QoS::AtMostOnce { 0 } else { packet_id.max(1) },
        properties: Properties::default(),
        aliased: false,
    };
    if link.version.is_v5() {
        // Only write when there is something to set: writing boxes empty properties.
        p.properties = msg.properties.clone();
        if let Some(left) = msg.remaining_expiry(now) {
            p.properties.message_expiry_interval = Some(left);
        }
        let ids = d.sub_ids.as_slice();
        if !ids.is_empty() {
            p.properties.subscription_identifiers.extend_from_slice(ids);
        }
    }
    // Most clients set no Maximum Packet Size: then there is nothing to measure.
    let max = link.max_packet_size as usize;
    let len = if max >= MAX_PACKET { 0 } else { p.view(msg).encoded_len(link.version) };
    if len > max {
        return None;
    }
    if link.version.is_v5() && len + ALIAS_PROPERTY_LEN <= max {
        match link.aliases.lookup(&msg.topic) {
            AliasUse::None => {}
            AliasUse::Define(a) => p.properties.topic_alias = Some(a),
            AliasUse::Reuse(a) => {
                p.properties.topic_alias = Some(a);
                p.aliased = true;
            }
        }
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SessionConfig;
    use crate::message::Message;
    use braid_proto::{decode, Bytes, Publish};
    use std::time::Duration;

    fn limits(max: usize) -> Arc<QueueLimits> {
        let config = SessionConfig {
            max_queued_messages: max,
            queue_overflow: OverflowPolicy::DropNewest,
            ..Default::default()
        };
        Arc::new(QueueLimits::from_config(&config))
    }

    fn link(version: ProtocolVersion, window: u16, alias_max: u16) -> Link {
        let ctl = ConnControl::new(&Default::default(), 0, 0);
        Link::new(version, window, u32::MAX, alias_max, ctl)
    }

    fn delivery(topic: &'static str, qos: QoS) -> Delivery {
        Delivery::of(
            Message::internal(ByteString::from_static(topic), Bytes::from_static(b"payload"), false),
            qos,
        )
    }

    /// Runs poll_transmit and decodes what it wrote.
    fn transmit(st: &mut SessionState, now: Instant) -> Vec<Packet> {
        let version = st.link.as_ref().unwrap().version;
        let mut buf = BytesMut::new();
        st.poll_transmit(now, &mut buf, usize::MAX);
        let mut out = Vec::new();
        while let Some(p) = decode(&mut buf, version, u32::MAX).unwrap() {
            out.push(p);
        }
        out
    }

    fn publishes(packets: &[Packet]) -> Vec<&Publish> {
        packets.iter().filter_map(|p| if let Packet::Publish(p) = p { Some(p) } else { None }).collect()
    }

    #[test]
    fn window_limits_unacked_deliveries_and_acks_open_it() {
        let mut st = SessionState::new(limits(100));
        st.attach(link(ProtocolVersion::V5, 2, 0));
        for _ in 0..5 {
            st.enqueue(delivery("t", QoS::AtLeastOnce), Instant::now());
        }
        let sent = transmit(&mut st, Instant::now());
        let ids: Vec<u16> = publishes(&sent).iter().map(|p| p.packet_id).collect();
        assert_eq!(ids.len(), 2, "Receive Maximum 2 allows two in flight");
        assert!(transmit(&mut st, Instant::now()).is_empty());
        assert!(st.on_puback(ids[0], Instant::now()));
        assert!(!st.on_puback(ids[0], Instant::now()), "a second PUBACK for the same id is unknown");
        assert_eq!(publishes(&transmit(&mut st, Instant::now())).len(), 1);
    }

    #[test]
    fn qos0_flows_without_using_the_window() {
        let mut st = SessionState::new(limits(100));
        st.attach(link(ProtocolVersion::V3_1_1, 1, 0));
        for _ in 0..3 {
            st.enqueue(delivery("t", QoS::AtMostOnce), Instant::now());
        }
        let sent = transmit(&mut st, Instant::now());
        assert!(publishes(&sent).iter().all(|p| p.packet_id == 0 && p.qos == QoS::AtMostOnce));
        assert_eq!(sent.len(), 3);
    }

    #[test]
    fn resume_resends_unacked_with_dup_and_pubrel_for_released() {
        let mut st = SessionState::new(limits(100));
        let g = st.attach(link(ProtocolVersion::V3_1_1, 10, 0));
        st.enqueue(delivery("a", QoS::AtLeastOnce), Instant::now());
        st.enqueue(delivery("b", QoS::ExactlyOnce), Instant::now());
        let sent = transmit(&mut st, Instant::now());
        let first = publishes(&sent).iter().map(|p| (p.packet_id, p.dup)).collect::<Vec<_>>();
        assert_eq!(first.iter().filter(|(_, dup)| *dup).count(), 0);
        let qos2_id = first[1].0;
        assert_eq!(st.on_pubrec(&Ack::new(qos2_id), Instant::now()), Some(Ack::new(qos2_id)));
        assert!(transmit(&mut st, Instant::now()).is_empty(), "nothing new to send");
        assert!(st.detach(g));
        st.attach(link(ProtocolVersion::V3_1_1, 10, 0));
        let again = transmit(&mut st, Instant::now());
        assert!(matches!(&again[0], Packet::Publish(p) if p.dup && p.packet_id == first[0].0));
        assert!(matches!(&again[1], Packet::PubRel(a) if a.packet_id == qos2_id));
        assert!(st.on_pubcomp(qos2_id));
    }

    #[test]
    fn offline_session_queues_qos1_not_qos0_and_counts_overflow() {
        let mut st = SessionState::new(limits(2));
        assert_eq!(st.enqueue(delivery("t", QoS::AtMostOnce), Instant::now()), Enqueued::SkippedOffline);
        assert_eq!(st.enqueue(delivery("t", QoS::AtLeastOnce), Instant::now()), Enqueued::Queued);
        assert_eq!(st.enqueue(delivery("t", QoS::ExactlyOnce), Instant::now()), Enqueued::Queued);
        assert_eq!(st.enqueue(delivery("t", QoS::AtLeastOnce), Instant::now()), Enqueued::DroppedFull);
        assert_eq!(st.dropped, 1);
        st.attach(link(ProtocolVersion::V5, 10, 0));
        assert_eq!(publishes(&transmit(&mut st, Instant::now())).len(), 2);
    }

    /// A session with the default limits but `qos0_pacing_ms`, attached, its window 64.
    fn paced(pacing_ms: u64) -> SessionState {
        let config = SessionConfig { qos0_pacing_ms: pacing_ms, ..Default::default() };
        let mut st = SessionState::new(Arc::new(QueueLimits::from_config(&config)));
        st.attach(link(ProtocolVersion::V5, 1000, 0));
        st
    }

    /// Queues 64 QoS 0 deliveries (one window), then offers one more.
    fn qos0_beyond_the_window(st: &mut SessionState) -> Enqueued {
        for _ in 0..64 {
            assert_eq!(st.enqueue(delivery("t", QoS::AtMostOnce), Instant::now()), Enqueued::Queued);
        }
        st.enqueue(delivery("t", QoS::AtMostOnce), Instant::now())
    }

    #[test]
    fn qos0_paces_publishers_for_the_pacing_time_then_until_the_queue_empties() {
        let mut st = paced(20);
        assert!(matches!(qos0_beyond_the_window(&mut st), Enqueued::Paced(_)), "behind: paced");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            st.enqueue(delivery("t", QoS::AtMostOnce), Instant::now()),
            Enqueued::Queued,
            "behind too long: left behind"
        );
        transmit(&mut st, Instant::now());
        assert!(st.queue.is_empty());
        assert!(matches!(qos0_beyond_the_window(&mut st), Enqueued::Paced(_)), "caught up: paced again");
    }

    #[test]
    fn qos0_pacing_off_never_holds_a_publisher() {
        let mut st = paced(0);
        assert_eq!(qos0_beyond_the_window(&mut st), Enqueued::Queued);
    }

    #[test]
    fn a_queue_beyond_the_window_holds_publishers_and_releases_them_in_turn() {
        let config = SessionConfig { max_queued_messages: 1000, ..Default::default() };
        let mut st = SessionState::new(Arc::new(QueueLimits::from_config(&config)));
        st.attach(link(ProtocolVersion::V5, 1000, 0));
        // While the window has room and a delivery is in flight, a long queue only waits for
        // the connection's turn to write: no publisher is held.
        st.enqueue(delivery("t", QoS::AtLeastOnce), Instant::now());
        assert_eq!(publishes(&transmit(&mut st, Instant::now())).len(), 1);
        for _ in 0..100 {
            assert_eq!(st.enqueue(delivery("t", QoS::AtLeastOnce), Instant::now()), Enqueued::Queued);
        }
        // A new connection's window is 64: it takes 63 more, and the queue beyond it is the
        // client's backlog. The 65th waiting delivery is one too many.
        assert_eq!(publishes(&transmit(&mut st, Instant::now())).len(), 63);
        for _ in 0..27 {
            assert_eq!(st.enqueue(delivery("t", QoS::AtLeastOnce), Instant::now()), Enqueued::Queued);
        }
        assert_eq!(st.enqueue(delivery("t", QoS::AtLeastOnce), Instant::now()), Enqueued::QueuedOverLimit);
        assert!(
            matches!(st.enqueue(delivery("t", QoS::AtMostOnce), Instant::now()), Enqueued::Paced(_)),
            "QoS 0 is paced"
        );
        for _ in 0..3 {
            assert!(st.blocks_publishers());
        }
        assert_eq!(st.take_drained(), Release::None, "not drained yet");
        // Far below three quarters of 64.
        while st.queue.len() > 2 {
            st.queue.pop();
        }
        assert_eq!(st.take_drained(), Release::First(3), "room for all three");
        assert_eq!(st.take_drained(), Release::None, "once");
        // More waiting than room: only as many as fit go, longest waiting first; all of them
        // once the queue is empty.
        for _ in 0..100 {
            st.enqueue(delivery("t", QoS::AtLeastOnce), Instant::now());
        }
        for _ in 0..100 {
            assert!(st.blocks_publishers());
        }
        while st.queue.len() > 40 {
            st.queue.pop();
        }
        assert_eq!(st.take_drained(), Release::First(24), "64 - 40");
        st.queue.drain().for_each(drop);
        assert_eq!(st.take_drained(), Release::All);
        assert_eq!(st.take_drained(), Release::None);
    }

    #[test]
    fn a_receive_maximum_below_the_window_keeps_the_window_from_growing() {
        // Receive Maximum 10 and prompt acknowledgements: the window is never filled (10 of
        // 64), so it does not grow, and the backlog that holds publishers stays one window
        // (it grew without end before, and with it the queue in front of the client).
        let config = SessionConfig { max_queued_messages: 1_000_000, ..Default::default() };
        let mut st = SessionState::new(Arc::new(QueueLimits::from_config(&config)));
        st.attach(link(ProtocolVersion::V5, 10, 0));
        let start = Instant::now();
        for round in 0..1000u64 {
            while !st.blocks_publishers_now() {
                st.enqueue(delivery("t", QoS::AtLeastOnce), start);
            }
            let now = start + Duration::from_micros(100 * round);
            let ids: Vec<u16> = publishes(&transmit(&mut st, now)).iter().map(|p| p.packet_id).collect();
            assert_eq!(ids.len(), 10, "Receive Maximum 10 in flight");
            for id in ids {
                assert!(st.on_puback(id, now + Duration::from_micros(50)));
            }
        }
        assert_eq!(st.inflight.adaptive().size(), 64);
        assert!(st.queue.len() <= 64 + 1, "{} queued before publishers were held", st.queue.len());
    }

    #[test]
    fn expired_messages_are_dropped_and_expiry_is_decremented() {
        let mut st = SessionState::new(limits(10));
        st.attach(link(ProtocolVersion::V5, 10, 0));
        let now = Instant::now();
        let mut props = Properties::from(braid_proto::PropertyValues {
            message_expiry_interval: Some(10),
            ..Default::default()
        });
        let make = |props: Properties| Publish {
            qos: QoS::AtLeastOnce,
            topic: ByteString::from_static("t"),
            packet_id: 1,
            properties: props,
            ..Default::default()
        };
        let live = Message::from_publish(make(props.clone()), now, 1, ByteString::new());
        props.message_expiry_interval = Some(1);
        let dead = Message::from_publish(make(props), now, 1, ByteString::new());
        for msg in [dead, live] {
            st.enqueue(
                Delivery {
                    msg,
                    qos: QoS::AtLeastOnce,
                    retain: false,
                    sub_ids: Default::default(),
                    seq: 0,
                    stream: Default::default(),
                    group: None,
                },
                Instant::now(),
            );
        }
        let later = now + std::time::Duration::from_secs(4);
        let sent = transmit(&mut st, later);
        let p = publishes(&sent);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].properties.message_expiry_interval, Some(6));
        assert_eq!(st.dropped, 1);
    }

    #[test]
    fn too_large_for_the_client_is_dropped_for_that_client_only() {
        let mut st = SessionState::new(limits(10));
        let mut l = link(ProtocolVersion::V5, 10, 0);
        l.max_packet_size = 20;
        st.attach(l);
        let mut big = delivery("t", QoS::AtLeastOnce);
        big.msg = Message::internal(ByteString::from_static("t"), Bytes::from(vec![0u8; 100]), false);
        st.enqueue(big, Instant::now());
        st.enqueue(delivery("t", QoS::AtLeastOnce), Instant::now());
        let sent = transmit(&mut st, Instant::now());
        assert_eq!(publishes(&sent).len(), 1);
        assert_eq!(st.dropped, 1);
        assert_eq!(st.inflight.len(), 1, "the dropped message took no packet id");
    }

    #[test]
    fn server_topic_alias_defined_then_reused() {
        let mut st = SessionState::new(limits(10));
        st.attach(link(ProtocolVersion::V5, 10, 5));
        st.enqueue(delivery("sensors/1", QoS::AtMostOnce), Instant::now());
        st.enqueue(delivery("sensors/1", QoS::AtMostOnce), Instant::now());
        let sent = transmit(&mut st, Instant::now());
        let p = publishes(&sent);
        assert_eq!((&*p[0].topic, p[0].properties.topic_alias), ("sensors/1", Some(1)));
        assert_eq!((&*p[1].topic, p[1].properties.topic_alias), ("", Some(1)));
    }

    #[test]
    fn v3_links_carry_no_properties() {
        let mut st = SessionState::new(limits(10));
        st.attach(link(ProtocolVersion::V3_1_1, 10, 5));
        st.enqueue(delivery("t", QoS::AtMostOnce), Instant::now());
        let sent = transmit(&mut st, Instant::now());
        assert!(matches!(&sent[0], Packet::Publish(p) if p.properties.is_empty() && &*p.topic == "t"));
    }

    #[test]
    fn stale_connection_cannot_detach_a_newer_one() {
        let mut st = SessionState::new(limits(10));
        let old = st.attach(link(ProtocolVersion::V5, 10, 0));
        let new = st.attach(link(ProtocolVersion::V5, 10, 0));
        assert!(!st.detach(old));
        assert!(st.is_attached(new));
    }
}
