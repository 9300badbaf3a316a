//! What the broker does with each packet a connected client sends.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_proto::{
    decode, encode, Ack, ByteString, BytesMut, Disconnect, Packet, ProtocolVersion, Publish, QoS, ReadBuffer,
    ReasonCode, SubAck, Subscribe,
};

use super::receive_window::WindowShare;
use crate::auth::ConnectionAcl;
use crate::broker::live::Live;
use crate::broker::{Broker, Ending, Holder, Published};
use crate::config::DeniedPublish;
use crate::directory::Waiting;
use crate::limits::{topic_too_big, PublishLimiter};
use crate::message::{Message, StreamTag};
use crate::metrics::Metrics;
use crate::rewrite::{Rewriting, Sender};
use crate::router::Confirm;
use crate::rules::Publisher;
use crate::session::{Qos2Ids, Session, Wakes};
use crate::store::Ticket;
use crate::trace::Direction;
use braid_rules::Event;
use futures_util::FutureExt;

/// What the read loop does after a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep reading.
    Continue,
    /// The client said DISCONNECT.
    End(Ending),
    /// Close the connection with this reason and detail (sent in a v5 DISCONNECT).
    Close(ReasonCode, Cow<'static, str>),
}

/// Per-connection inbound state.
pub(crate) struct Inbound<'a> {
    broker: &'a Broker,
    session: Arc<Session>,
    version: ProtocolVersion,
    /// Topic aliases the client defined on this connection.
    aliases: HashMap<u16, ByteString>,
    /// An ack freed in-flight room or a subscription queued retained messages.
    transmit: bool,
    /// The last PUBLISH, while subscriber queues that are full or behind hold it back.
    held: Option<Box<Held>>,
    /// Sync durability: acknowledgements waiting, in order, for their store tickets to be on
    /// disk (boxed: only connections that touch persistent sessions have one).
    durable: Option<Box<Durable>>,
    /// Which topics this client may use.
    acl: ConnectionAcl<'a>,
    /// `[limits]` and `[session]` as they were when the client connected.
    live: Arc<Live>,
    /// The client's publish rate.
    limiter: PublishLimiter,
    /// Not reading from the client: over its publish rate, the memory alarm is raised, or a
    /// SUBSCRIBE waits for the cluster.
    pause: Option<Pause>,
    /// What waits for the cluster: a SUBSCRIBE to handle, or its SUBACK to send, when the
    /// pause ends.
    deferred: Option<Deferred>,
    /// The stream this state reads (QUIC); subscriptions made here deliver on it.
    stream: StreamTag,
    /// Inbound QoS 2 ids of a QUIC data stream, whose packet ids are its own; `None` uses the
    /// session's set, which outlives the connection (and is persisted).
    stream_qos2: Option<Qos2Ids>,
    /// This reader's part of the connection's Receive Maximum count (besides the session's
    /// unreleased QoS 2 ids): a data stream's unreleased QoS 2 ids and PUBACKs not sent yet.
    window: WindowShare,
    /// Subscribers' connections to wake once the packets of this read are handled (see
    /// [`Inbound::handle_buffered`]).
    wakes: Wakes,
}

/// Why a connection is not read from, though no acknowledgement is held.
enum Pause {
    /// Over its publish rate: until then.
    Until(Instant),
    /// The memory alarm is raised: until it clears.
    Memory,
    /// A SUBSCRIBE or its SUBACK (in `deferred`) waits for the cluster (see
    /// [`crate::directory::Directory::before_subscribe`] and `after_subscribe`).
    Cluster(Waiting),
}

impl std::fmt::Debug for Pause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pause::Until(t) => write!(f, "Until({t:?})"),
            Pause::Memory => f.write_str("Memory"),
            Pause::Cluster(_) => f.write_str("Cluster"),
        }
    }
}

/// A SUBSCRIBE's part that waits for the cluster.
#[derive(Debug)]
enum Deferred {
    /// The SUBSCRIBE, until the node has what the cluster stored before it.
    Subscribe(Subscribe),
    /// Its SUBACK, until every node routes by the new subscriptions.
    SubAck(SubAck),
}

/// Acknowledgements waiting for the store's group commit.
struct Durable {
    acks: VecDeque<WaitingAck>,
    synced: tokio::sync::watch::Receiver<Ticket>,
}

/// An acknowledgement that waits for its store ticket and its remote subscribers'
/// confirmations.
struct WaitingAck {
    ticket: Ticket,
    confirms: Vec<Confirm>,
    ack: Packet,
}

/// A held PUBLISH's acknowledgement, released: what it still waits for (see
/// [`Inbound::ack_confirmed`]).
#[derive(Debug)]
pub(crate) struct Released {
    pub(crate) ack: Packet,
    pub(crate) ticket: Ticket,
    pub(crate) confirms: Vec<Confirm>,
}

impl<'a> Inbound<'a> {
    /// State for a connection that has just been accepted at `now` (or resumed with the topic
    /// aliases its client defined), with its topic authorization.
    pub(crate) fn new(
        broker: &'a Broker,
        session: &Arc<Session>,
        version: ProtocolVersion,
        aliases: HashMap<u16, ByteString>,
        acl: ConnectionAcl<'a>,
        now: Instant,
    ) -> Self {
        let live = broker.live();
        let limiter = PublishLimiter::new(&live.limits, now);
        Inbound {
            broker,
            live,
            session: session.clone(),
            version,
            aliases,
            transmit: false,
            held: None,
            durable: None,
            acl,
            limiter,
            pause: None,
            deferred: None,
            stream: StreamTag::default(),
            stream_qos2: None,
            window: WindowShare::default(),
            wakes: Wakes::default(),
        }
    }

    /// Counts this reader's publishes against Receive Maximum in `connection`, the count every
    /// stream of its QUIC connection shares.
    pub(crate) fn counting_in(mut self, connection: Arc<AtomicUsize>) -> Self {
        self.window = WindowShare::of(connection);
        self
    }

    /// True if `unreleased_qos2` of the session's QoS 2 ids plus what this connection counts
    /// exceed the Receive Maximum advertised in CONNACK.
    fn exceeds_receive_maximum(&self, unreleased_qos2: usize) -> bool {
        unreleased_qos2 + self.window.used() > usize::from(self.broker.config().mqtt.receive_maximum)
    }

    /// State for a QUIC data stream `stream`: its packet ids (and so its unreleased QoS 2 ids)
    /// and its topic aliases are its own, and its subscriptions deliver on it.
    pub(crate) fn for_stream(
        broker: &'a Broker,
        session: &Arc<Session>,
        version: ProtocolVersion,
        stream: StreamTag,
        acl: ConnectionAcl<'a>,
        now: Instant,
    ) -> Self {
        Inbound {
            stream,
            stream_qos2: Some(Qos2Ids::default()),
            ..Inbound::new(broker, session, version, HashMap::new(), acl, now)
        }
    }

    /// Records inbound QoS 2 packet id `id`: whether it is new (a resend is acknowledged again
    /// but not delivered twice) and the store ticket its PUBREC waits for; the close if the
    /// connection would exceed Receive Maximum.
    fn receive_qos2(&mut self, id: u16) -> Result<(bool, Ticket), Flow> {
        let mut st = self.session.lock();
        if let Some(ids) = &self.stream_qos2 {
            // A QUIC data stream's own ids, kept in memory only (docs/quic.md).
            if ids.contains(id) {
                return Ok((false, 0));
            }
        } else if st.incoming_qos2.contains(id) {
            return Ok((false, st.ticket()));
        }
        // This one included.
        if self.exceeds_receive_maximum(st.incoming_qos2.len() + 1) {
            return Err(receive_maximum_exceeded());
        }
        match self.stream_qos2.as_mut() {
            Some(ids) => {
                self.window.take();
                Ok((ids.insert(id), 0))
            }
            None => Ok((st.receive_qos2(id), st.ticket())),
        }
    }

    /// What a connection that parks keeps: the topic aliases its client defined and its
    /// authorization.
    pub(crate) fn into_kept(self) -> (HashMap<u16, ByteString>, ConnectionAcl<'a>) {
        (self.aliases, self.acl)
    }

    /// True (once) if the session may have deliveries to send since the last call.
    pub(crate) fn take_transmit(&mut self) -> bool {
        std::mem::take(&mut self.transmit)
    }

    /// Decodes and handles the complete packets in `rbuf`, which arrived by `now`, until it
    /// holds no complete packet, the connection is held (see [`Inbound::is_held`]) or a packet
    /// ends it; replies are encoded into `out`. `check` sees each packet first and may refuse
    /// it (a transport's own rules, e.g. packets a QUIC data stream may not carry). Every
    /// transport reads through this loop.
    ///
    /// The subscribers' connections the PUBLISHes of this read deliver to are woken once, at
    /// the end: each then writes all the read brought it in one go.
    pub(crate) fn handle_buffered(
        &mut self,
        rbuf: &mut ReadBuffer,
        now: Instant,
        out: &mut BytesMut,
        check: impl FnMut(&Packet) -> Option<Flow>,
    ) -> Flow {
        let flow = self.handle_packets(rbuf, now, out, check);
        self.wakes.wake_all();
        flow
    }

    fn handle_packets(
        &mut self,
        rbuf: &mut ReadBuffer,
        now: Instant,
        out: &mut BytesMut,
        mut check: impl FnMut(&Packet) -> Option<Flow>,
    ) -> Flow {
        let max = self.broker.config().mqtt.max_packet_size;
        match (self.is_held(), self.deferred.take()) {
            (false, Some(Deferred::Subscribe(s))) => self.subscribe(s, now, out),
            (false, Some(Deferred::SubAck(ack))) => self.ack_change(Packet::SubAck(ack), out),
            (_, deferred) => self.deferred = deferred,
        }
        loop {
            if self.is_held() {
                return Flow::Continue;
            }
            let p = match decode(rbuf.bytes(), self.version, max) {
                Ok(Some(p)) => p,
                Ok(None) => return Flow::Continue,
                Err(e) => return Flow::Close(e.reason_code(), e.to_string().into()),
            };
            if self.broker.tracer().is_active() {
                self.broker.tracer().record(&self.session.client_id, Direction::In, &p);
            }
            if let Some(refused) = check(&p) {
                return refused;
            }
            match self.handle(p, now, out) {
                Flow::Continue => {}
                other => return other,
            }
        }
    }

    /// Handles one packet, arrived by `now`; replies are encoded into `out`.
    pub(crate) fn handle(&mut self, p: Packet, now: Instant, out: &mut BytesMut) -> Flow {
        let reply = match p {
            Packet::Publish(p) => return self.publish(p, now, out),
            Packet::PubAck(a) => {
                self.acknowledged(a.packet_id, false, now);
                None
            }
            Packet::PubRec(a) => {
                self.transmit = true;
                // PUBREL only once its stage is on disk: a restart must not resend the PUBLISH.
                let (rel, ticket) = {
                    let mut st = self.session.lock();
                    (st.on_pubrec(&a, now), st.ticket())
                };
                if let Some(rel) = rel {
                    self.ack(Packet::PubRel(rel), ticket, out);
                }
                None
            }
            Packet::PubComp(a) => {
                self.acknowledged(a.packet_id, true, now);
                None
            }
            Packet::PubRel(a) => {
                let (known, ticket) = match self.stream_qos2.as_mut() {
                    Some(ids) => {
                        let known = ids.remove(a.packet_id);
                        if known {
                            self.window.give();
                        }
                        (known, 0)
                    }
                    None => {
                        let mut st = self.session.lock();
                        (st.release_qos2(a.packet_id), st.ticket())
                    }
                };
                let reason = if known { ReasonCode::Success } else { ReasonCode::PacketIdentifierNotFound };
                self.ack(Packet::PubComp(Ack::with_reason(a.packet_id, reason)), ticket, out);
                None
            }
            Packet::Subscribe(s) => {
                // In a cluster, first what other nodes stored is caught up with (retained).
                if let Some(waiting) = self.broker.directory().and_then(|d| d.before_subscribe()) {
                    self.pause = Some(Pause::Cluster(waiting));
                    self.deferred = Some(Deferred::Subscribe(s));
                    return Flow::Continue;
                }
                self.subscribe(s, now, out);
                None
            }
            Packet::Unsubscribe(mut u) => {
                let sender = Sender { client_id: &self.session.client_id, username: self.acl.username() };
                for filter in &mut u.filters {
                    if let Some(rewritten) = self.broker.rewrites().rewrite_filter(filter, sender) {
                        *filter = rewritten.into();
                    }
                }
                let ack = self.broker.unsubscribe(&self.session, self.version, u, now);
                self.ack_change(Packet::UnsubAck(ack), out);
                None
            }
            Packet::PingReq => Some(Packet::PingResp),
            Packet::Disconnect(d) => return self.disconnect(d),
            Packet::Connect(_) => return close(ReasonCode::ProtocolError, "second CONNECT on a connection"),
            // No authentication method is configured, so AUTH has nothing to continue; packets
            // only a server sends are errors too.
            Packet::Auth(_)
            | Packet::ConnAck(_)
            | Packet::SubAck(_)
            | Packet::UnsubAck(_)
            | Packet::PingResp => return close(ReasonCode::ProtocolError, "a packet only a server may send"),
        };
        if let Some(p) = reply {
            self.reply(&p, out);
        }
        Flow::Continue
    }

    /// Handles SUBSCRIBE; its SUBACK goes into `out`, or waits until every node of a cluster
    /// routes by the new subscriptions (see [`crate::directory::Directory::after_subscribe`]).
    fn subscribe(&mut self, s: Subscribe, now: Instant, out: &mut BytesMut) {
        self.transmit = true;
        let ack = self.broker.subscribe(&self.session, self.version, s, &mut self.acl, self.stream, now);
        match self.broker.directory().and_then(|d| d.after_subscribe()) {
            Some(waiting) => {
                self.pause = Some(Pause::Cluster(waiting));
                self.deferred = Some(Deferred::SubAck(ack));
            }
            None => self.ack_change(Packet::SubAck(ack), out),
        }
    }

    /// Sends the SUBACK or UNSUBACK `p` once what it changed in a persistent session is
    /// durable (see [`Inbound::ack`]): a subscription acknowledged survives a crash.
    fn ack_change(&mut self, p: Packet, out: &mut BytesMut) {
        let ticket = self.session.lock().ticket();
        self.ack(p, ticket, out);
    }

    /// Answers a PUBLISH of `qos` (packet id `id`) that is dropped: a PUBACK or PUBREC with
    /// `reason` (nothing for QoS 0).
    fn refuse_publish(&self, qos: QoS, id: u16, reason: ReasonCode, out: &mut BytesMut) {
        let ack = Ack::with_reason(id, reason);
        match qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => self.reply(&Packet::PubAck(ack), out),
            QoS::ExactlyOnce => self.reply(&Packet::PubRec(ack), out),
        }
    }

    /// Encodes a reply to the client into `out`.
    pub(crate) fn reply(&self, p: &Packet, out: &mut BytesMut) {
        // Replies are well-formed packets of this connection's version; encoding cannot fail.
        let _ = encode(p, self.version, out);
    }

    fn disconnect(&mut self, d: Disconnect) -> Flow {
        if let Some(expiry) = d.properties.session_expiry_interval {
            let mut st = self.session.lock();
            // A session that was to end at disconnect may not be revived here (MQTT-3.14.2-2).
            if st.expiry_secs == 0 && expiry != 0 {
                return close(
                    ReasonCode::ProtocolError,
                    "session expiry set at DISCONNECT after connecting with 0",
                );
            }
            st.expiry_secs = expiry.min(self.live.session.max_session_expiry_secs);
        }
        match d.reason {
            ReasonCode::DisconnectWithWill => Flow::End(Ending::WithWill),
            _ => Flow::End(Ending::Normal),
        }
    }

    fn publish(&mut self, mut p: Publish, now: Instant, out: &mut BytesMut) -> Flow {
        let cfg = &self.broker.config().mqtt;
        if let Some(alias) = p.properties.topic_alias {
            if alias == 0 || alias > cfg.topic_alias_maximum {
                return close(ReasonCode::TopicAliasInvalid, "topic alias 0 or above Topic Alias Maximum");
            }
            if p.topic.is_empty() {
                match self.aliases.get(&alias) {
                    Some(topic) => p.topic = topic.clone(),
                    None => {
                        return close(ReasonCode::ProtocolError, "topic alias used before it was defined")
                    }
                }
            } else {
                self.aliases.insert(alias, p.topic.clone());
            }
        }
        if p.qos as u8 > cfg.max_qos {
            return close(ReasonCode::QoSNotSupported, "QoS above Maximum QoS");
        }
        if p.retain && !cfg.retain_available {
            return close(ReasonCode::RetainNotSupported, "retained messages are disabled");
        }
        if let Some(why) = topic_too_big(&self.live.limits, &p.topic) {
            return close(ReasonCode::TopicNameInvalid, why);
        }
        self.broker.metrics().messages_received.add(p.qos, 1);
        // Every PUBLISH, allowed or not, counts towards the rate; the pause starts after it.
        if let Some(until) = self.limiter.on_publish(p.topic.len() + p.payload.len(), now) {
            self.pause = Some(Pause::Until(until));
        }
        if self.broker.memory().is_raised() {
            self.pause = Some(Pause::Memory);
        }
        let (qos, id) = (p.qos, p.packet_id);
        // Only the broker publishes under $SYS.
        if is_sys_topic(&p.topic) || !self.acl.may_publish(&p.topic) {
            // Acknowledge (v5: Not authorized) and drop; 3.1.x clients may be disconnected.
            if !self.version.is_v5()
                && self.broker.config().acl.v3_denied_publish == DeniedPublish::Disconnect
            {
                return close(ReasonCode::NotAuthorized, "the ACL denies publishing to this topic");
            }
            Metrics::add(&self.broker.metrics().publishes_denied, 1);
            self.refuse_publish(qos, id, ReasonCode::NotAuthorized, out);
            return Flow::Continue;
        }
        // The ACL saw the topic as the client sent it; now it is rewritten (as EMQX).
        let sender = Sender { client_id: &self.session.client_id, username: self.acl.username() };
        if let Some(topic) = self.broker.rewrites().rewrite(Rewriting::Publish, &p.topic, sender) {
            p.topic = topic.into();
        }
        if let Some(why) = p.retain.then(|| self.broker.retained_refusal(&p.topic, p.payload.len())).flatten()
        {
            Metrics::add(&self.broker.metrics().retained_refused, 1);
            if self.version.is_v5() {
                // Refused whole: Quota exceeded tells the publisher, which may retry later.
                tracing::debug!(client_id = %self.session.client_id, topic = %p.topic, "retained PUBLISH refused: {why}");
                self.refuse_publish(qos, id, ReasonCode::QuotaExceeded, out);
                return Flow::Continue;
            }
            // A 3.1.x publisher cannot be told: its message goes out, not retained (as EMQX).
            p.retain = false;
        }
        let msg = Message::from_publish(p, now, self.session.id, self.session.client_id.clone());
        let (ack, mut ticket) = match qos {
            QoS::AtMostOnce => (None, 0),
            QoS::AtLeastOnce => {
                // Counted until its PUBACK is sent: at once (then it never counts), unless held
                // or awaiting a commit (checked below, once that is known).
                self.window.take();
                (Some(Packet::PubAck(Ack::new(id))), 0)
            }
            QoS::ExactlyOnce => {
                let (first, ticket) = match self.receive_qos2(id) {
                    Ok(r) => r,
                    Err(flow) => return flow,
                };
                let ack = Packet::PubRec(Ack::new(id));
                // A PUBLISH resent before PUBREL is acknowledged again but not delivered twice.
                if !first {
                    self.ack(ack, ticket, out);
                    return Flow::Continue;
                }
                (Some(ack), ticket)
            }
        };
        let for_rules = (self.broker.rules_take(Event::MessagePublish)
            && self.broker.rules().wants_topic(&msg.topic))
        .then(|| msg.clone());
        let mut published = self.broker.publish(msg, now);
        if let Some(msg) = for_rules {
            published.merge(self.apply_rules(&msg, now));
        }
        self.wakes.append(&mut published.wakes);
        ticket = ticket.max(published.ticket);
        let confirms = published.confirms;
        if !published.held.is_empty() {
            Metrics::add(&self.broker.metrics().publishes_held, 1);
            self.held = Some(Box::new(Held { ack, ticket, confirms, sessions: published.held, since: now }));
        } else if let Some(ack) = ack {
            self.ack_confirmed(ack, ticket, confirms, out);
        }
        // A QoS 1 PUBLISH whose PUBACK waits counts against Receive Maximum.
        if qos == QoS::AtLeastOnce
            && self.window.used() > 0
            && self.exceeds_receive_maximum(self.session.lock().incoming_qos2.len())
        {
            return receive_maximum_exceeded();
        }
        Flow::Continue
    }

    /// The client's PUBACK (`released` false) or PUBCOMP (true) for delivery `id`, at `now`:
    /// completes it, and raises `$events/message_acked` (after the session's lock) when a rule
    /// takes it.
    fn acknowledged(&mut self, id: u16, released: bool, now: Instant) {
        let acked = {
            let mut st = self.session.lock();
            let watched = self.broker.rules_take(Event::MessageAcked);
            let acked = watched.then(|| st.in_flight_message(id, released)).flatten();
            self.transmit |= if released { st.on_pubcomp(id) } else { st.on_puback(id, now) };
            acked
        };
        if let Some((msg, qos)) = acked {
            self.broker.raise_acked(&self.session, &msg, qos, now);
        }
    }

    /// Runs the broker's rules on `msg`, which this client published, with who it is; returns
    /// what the client's acknowledgement waits for.
    fn apply_rules(&self, msg: &Message, now: Instant) -> Published {
        let (username, peer) = {
            let st = self.session.lock();
            let origin = st.link.as_ref().map(|l| &l.origin);
            (origin.and_then(|o| o.username.clone()), origin.map(|o| o.peer))
        };
        let publisher = Publisher { username: username.as_deref(), peer };
        self.broker.apply_rules(msg, publisher, now)
    }

    /// Sends an acknowledgement once the store changes it confirms (up to `ticket`) are on
    /// disk: at once unless durability is sync and the group commit has not reached it yet.
    /// Acknowledgements keep their order (MQTT-4.6.0-2), so one behind a waiting one waits too.
    pub(crate) fn ack(&mut self, p: Packet, ticket: Ticket, out: &mut BytesMut) {
        self.ack_confirmed(p, ticket, Vec::new(), out);
    }

    /// Sends an acknowledgement as [`Inbound::ack`] does, once `confirms` (remote subscribers'
    /// word that the other side has the message) have resolved too; one that failed gives a
    /// v5 PUBACK / PUBREC its reason code.
    pub(crate) fn ack_confirmed(
        &mut self,
        ack: Packet,
        ticket: Ticket,
        confirms: Vec<Confirm>,
        out: &mut BytesMut,
    ) {
        let store = &self.broker.store();
        // Under async durability an acknowledgement does not wait for the store.
        let ticket = if store.sync() { ticket } else { 0 };
        let durable = |d: Option<&Durable>| match d {
            Some(d) => *d.synced.borrow(),
            None => *store.durable().borrow(),
        };
        let waits = !confirms.is_empty() || (ticket > 0 && durable(self.durable.as_deref()) < ticket);
        let waiting = WaitingAck { ticket, confirms, ack };
        match self.durable.as_deref_mut() {
            Some(d) if waits || !d.acks.is_empty() => d.acks.push_back(waiting),
            None if waits => {
                let synced = store.durable();
                self.durable = Some(Box::new(Durable { acks: VecDeque::from([waiting]), synced }));
            }
            _ => send_ack(&mut self.window, self.version, &waiting.ack, out),
        }
    }

    /// Acknowledges a PUBLISH that was held, once what it still waits for is done.
    pub(crate) fn ack_released(&mut self, r: Released, out: &mut BytesMut) {
        self.ack_confirmed(r.ack, r.ticket, r.confirms, out);
    }

    /// True while acknowledgements wait for the group commit or for confirmations.
    pub(crate) fn awaits_sync(&self) -> bool {
        self.durable.as_ref().is_some_and(|d| !d.acks.is_empty())
    }

    /// Encodes the acknowledgements the group commit has made durable, and whose
    /// confirmations have come, into `out`.
    pub(crate) fn flush_synced(&mut self, out: &mut BytesMut) {
        let Some(d) = self.durable.as_deref_mut() else { return };
        let synced = *d.synced.borrow_and_update();
        while d.acks.front().is_some_and(|w| w.ticket <= synced && w.confirms.is_empty()) {
            let Some(w) = d.acks.pop_front() else { break };
            send_ack(&mut self.window, self.version, &w.ack, out);
        }
    }

    /// Waits for a held PUBLISH to be released (its subscriber queues drained) and returns its
    /// acknowledgement, for a pause to end or, while acknowledgements await the group commit,
    /// for the commit to move on (`None`: call [`Inbound::flush_synced`]). Cancel-safe.
    pub(crate) async fn next_ack(&mut self) -> Option<Released> {
        let timeout = Duration::from_secs(self.live.session.slow_consumer_timeout_secs);
        let (held, durable, pause) = (&mut self.held, &mut self.durable, &mut self.pause);
        tokio::select! {
            ack = release_held(held, timeout) => ack,
            () = commit_moved(durable) => None,
            () = pause_ended(pause, self.broker) => None,
        }
    }

    /// True while a PUBLISH is held back by subscriber queues (full, or behind), the client is
    /// paused (publish rate, memory alarm), or too many acknowledgements wait for the group
    /// commit: the connection reads nothing more from this client until [`Inbound::next_ack`]
    /// releases it.
    pub(crate) fn is_held(&self) -> bool {
        self.held.is_some()
            || self.pause.is_some()
            || self
                .durable
                .as_ref()
                .is_some_and(|d| d.acks.len() >= usize::from(self.broker.config().mqtt.receive_maximum))
    }
}

/// Waits until every subscriber queue that held the PUBLISH has drained (or its client went
/// away), then returns its acknowledgement (None for QoS 0) and ticket. A subscriber that
/// paces it holds it until its pacing ends at the latest; one that holds it by backpressure
/// past `slow_consumer` is disconnected. Cancel-safe; never resolves when nothing is held.
async fn release_held(held: &mut Option<Box<Held>>, slow_consumer: Duration) -> Option<Released> {
    let Some(h) = held.as_mut() else { return std::future::pending().await };
    while let Some(holder) = h.sessions.last() {
        holder.released(h.since, slow_consumer).await;
        h.sessions.pop();
    }
    match held.take() {
        Some(h) => {
            let Held { ack, ticket, confirms, .. } = *h;
            ack.map(|ack| Released { ack, ticket, confirms })
        }
        None => std::future::pending().await,
    }
}

/// Waits until a pause ends (the publish rate allows more, the memory alarm clears, or the
/// cluster has caught up), then clears it. Cancel-safe; never resolves without a pause.
async fn pause_ended(pause: &mut Option<Pause>, broker: &Broker) {
    match pause {
        Some(Pause::Until(t)) => tokio::time::sleep_until((*t).into()).await,
        Some(Pause::Memory) => broker.memory().wait_cleared().await,
        Some(Pause::Cluster(waiting)) => waiting.await,
        None => std::future::pending().await,
    }
    *pause = None;
}

/// Waits until the first waiting acknowledgement's confirmations have come, or, when it
/// waits for none, until the group commit moves on. Cancel-safe.
async fn commit_moved(durable: &mut Option<Box<Durable>>) {
    let Some(d) = durable.as_deref_mut().filter(|d| !d.acks.is_empty()) else {
        return std::future::pending().await;
    };
    match d.acks.front_mut() {
        Some(w) if !w.confirms.is_empty() => {
            confirmed(w).await;
            // Those behind it whose confirmations came meanwhile go out with it, in one write
            // (a remote's word often settles many at once).
            for w in d.acks.iter_mut().skip(1) {
                if !confirmed_now(w) {
                    break;
                }
            }
        }
        _ => {
            if d.synced.changed().await.is_err() {
                std::future::pending().await
            }
        }
    }
}

/// Waits for `w`'s confirmations, each taken out once it resolved (so that a cancelled wait
/// goes on where it stopped); a failed one sets the acknowledgement's reason code.
async fn confirmed(w: &mut WaitingAck) {
    while let Some(confirm) = w.confirms.last_mut() {
        let reason = confirm.await;
        w.resolved(reason);
    }
}

/// Takes out `w`'s confirmations that have resolved already, without waiting; true if none is
/// left.
fn confirmed_now(w: &mut WaitingAck) -> bool {
    while let Some(confirm) = w.confirms.last_mut() {
        let Some(reason) = confirm.now_or_never() else { return false };
        w.resolved(reason);
    }
    true
}

impl WaitingAck {
    /// Its last confirmation resolved with `reason`: taken out; a failure sets the
    /// acknowledgement's reason code.
    fn resolved(&mut self, reason: ReasonCode) {
        self.confirms.pop();
        if reason != ReasonCode::Success {
            if let Packet::PubAck(a) | Packet::PubRec(a) = &mut self.ack {
                a.reason = reason;
            }
        }
    }
}

/// A PUBLISH whose subscriber queues hold its publisher back: its acknowledgement (None for
/// QoS 0) waits for them to drain.
struct Held {
    ack: Option<Packet>,
    ticket: Ticket,
    confirms: Vec<Confirm>,
    sessions: Vec<Holder>,
    since: Instant,
}

/// True for `$SYS` and everything below it.
fn is_sys_topic(topic: &str) -> bool {
    topic.strip_prefix("$SYS").is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Encodes an acknowledgement; a PUBACK ends its PUBLISH's count against Receive Maximum.
fn send_ack(window: &mut WindowShare, version: ProtocolVersion, p: &Packet, out: &mut BytesMut) {
    if matches!(p, Packet::PubAck(_)) {
        window.give();
    }
    // Acknowledgements are well-formed packets of this connection's version.
    let _ = encode(p, version, out);
}

fn receive_maximum_exceeded() -> Flow {
    close(ReasonCode::ReceiveMaximumExceeded, "more unacknowledged QoS 1/2 messages than Receive Maximum")
}

fn close(reason: ReasonCode, detail: &'static str) -> Flow {
    Flow::Close(reason, Cow::Borrowed(detail))
}
