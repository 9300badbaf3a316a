//! The broker's shared state and the operations connections call: connect (with takeover),
//! subscribe, unsubscribe, publish, and what happens when a client goes away.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use braid_proto::topic::{parse_shared, valid_topic_filter};
use braid_proto::{
    ByteString, ConnAck, Connect, LastWill, Properties, ProtocolVersion, Publish, QoS, ReasonCode,
    RetainHandling, SubAck, Subscribe, UnsubAck, Unsubscribe,
};

use crate::auth::{ConnectionAcl, Security};
use crate::config::{Config, QueuePolicy, Transport};
use crate::control::ConnControl;
use crate::limits::{topic_too_big, MemoryAlarm};
use crate::message::{Delivery, Message, StreamTag};
use crate::metrics::Metrics;
use crate::park::ParkingLot;
use crate::retained::Retained;
use crate::router::{Router, SubEntry};
use crate::session::{Enqueued, Link, Persist, QueueLimits, Release, Restore, Session, SubscriptionRecord};
use crate::store::{self, Op, Store, StoreError, Ticket};

/// Everything the connections share.
#[derive(Debug)]
pub struct Broker {
    /// Effective configuration.
    pub config: Config,
    /// Counters for `$SYS`.
    pub metrics: Metrics,
    /// When the broker started.
    pub started: Instant,
    /// Cancelled at shutdown: stops the listeners, timers and `$SYS`.
    pub shutdown: CancellationToken,
    /// Authentication methods and ACL rules.
    pub security: Security,
    /// Raised while memory is above `limits.memory_high_watermark`.
    pub memory: MemoryAlarm,
    sessions: Mutex<HashSet<ById>>,
    router: RwLock<Router>,
    retained: RwLock<Retained>,
    next_session_id: AtomicU64,
    /// `[session]` queue limits, for sessions recovered from the store until their client
    /// connects.
    queue_limits: Arc<QueueLimits>,
    /// The queue limits of each listener's clients (`[session]` with
    /// `[session.listeners.<transport>]`), in [`Transport::ALL`] order.
    listener_limits: [Arc<QueueLimits>; 5],
    /// Where persistent sessions and retained messages are kept.
    pub store: Arc<dyn Store>,
    /// Where idle plain-TCP connections park, once the server has started it.
    lot: OnceLock<Arc<ParkingLot>>,
    /// Notified when a connection answers a takeover or detaches (see [`crate::handover`]).
    pub(crate) handovers: Notify,
}

/// A session holding a publisher back.
#[derive(Debug)]
pub struct Holder {
    /// The session.
    pub session: Arc<Session>,
    /// Until when it paces the publisher (its delivery was QoS 0, see [`Enqueued::Paced`]);
    /// None: it holds the publisher by backpressure, until `session.slow_consumer_timeout_secs`
    /// evicts it.
    pub paced_until: Option<Instant>,
}

/// What became of a published message.
#[derive(Debug, Default)]
pub struct Published {
    /// Sessions that hold the publisher back (their queue is beyond its limit or their
    /// delivery window): it is read no further, and its acknowledgement waits, until each has
    /// drained ([`Session::wait_for_space`]).
    pub held: Vec<Holder>,
    /// The store ticket the acknowledgement waits for under sync durability (0: none).
    pub ticket: Ticket,
}

/// A CONNECT the broker accepted: the session the connection now serves.
#[derive(Debug)]
pub struct Accepted {
    /// The session.
    pub session: Arc<Session>,
    /// The attachment's generation (see [`crate::session::SessionState::detach`]).
    pub generation: u64,
    /// The connection's close signal.
    pub ctl: Arc<ConnControl>,
}

/// What [`Broker::connect`] gives an accepted connection: its attachment, the CONNACK to send
/// first and, for a persistent session, its deliveries being read back from disk (await them
/// and hand them to [`crate::session::SessionState::restore`] before transmitting).
pub type Connected = (Accepted, ConnAck, Option<Restore>);

/// How a connection ended, for will and session handling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// DISCONNECT with reason 0x00: discard the will.
    Normal,
    /// DISCONNECT 0x04, a network error, a protocol error or a keep-alive timeout: send the will.
    WithWill,
    /// Taken over, or the broker is shutting down: the will was handled elsewhere.
    Silent,
}

impl Broker {
    /// A broker with `config` and the memory store; call [`crate::server::Server`] to put it
    /// on the network.
    pub fn new(config: Config) -> Arc<Broker> {
        Broker::with_store(config, Arc::new(store::memory::MemoryStore::new()))
    }

    /// A broker with the store `config` names, its persistent sessions, subscriptions and
    /// retained messages reloaded. Must run inside a Tokio runtime (it schedules expiries).
    pub fn open(config: Config) -> Result<Arc<Broker>, StoreError> {
        let store = store::open(&config.store)?;
        let broker = Broker::with_store(config, store);
        broker.recover();
        Ok(broker)
    }

    fn with_store(config: Config, store: Arc<dyn Store>) -> Arc<Broker> {
        let router = Router::new(config.shared.strategy, config.mqtt.overlapping);
        let queue_limits = Arc::new(QueueLimits::from_config(&config.session));
        let listener_limits = Transport::ALL.map(|t| {
            let policy = config.session.listeners.get(t);
            if policy == &QueuePolicy::default() {
                queue_limits.clone()
            } else {
                Arc::new(QueueLimits::with_policy(&config.session, policy))
            }
        });
        Arc::new(Broker {
            security: Security::new(&config),
            memory: MemoryAlarm::new(config.limits.memory_high_watermark),
            config,
            metrics: Metrics::default(),
            started: Instant::now(),
            shutdown: CancellationToken::new(),
            sessions: Mutex::new(HashSet::new()),
            router: RwLock::new(router),
            retained: RwLock::new(Retained::default()),
            next_session_id: AtomicU64::new(1),
            queue_limits,
            listener_limits,
            lot: OnceLock::new(),
            handovers: Notify::new(),
            store,
        })
    }

    /// Loads what the store kept: retained messages, sessions (offline, their deliveries on
    /// disk) with their subscriptions; schedules their wills and expiry.
    fn recover(self: &Arc<Self>) {
        let found = self.store.take_recovered();
        self.next_session_id.fetch_max(found.next_session_id, Ordering::Relaxed);
        {
            let mut retained = self.retained.write();
            for msg in found.retained {
                retained.set(msg);
            }
        }
        let limits = &self.queue_limits;
        let now = store::unix_now();
        for r in found.sessions {
            let rec = r.record;
            let session = Arc::new(Session::new(rec.id, rec.client_id.clone(), limits.clone()));
            if rec.expiry_secs == 0 {
                // Ended with its last connection, just before the broker stopped.
                let mut st = session.lock();
                st.persist = Some(Box::new(Persist::new(self.store.clone(), rec.id, rec.client_id, 1)));
                st.forget();
                continue;
            }
            let offline_for = now.saturating_sub(rec.offline_since.unwrap_or(now));
            let will_delay = {
                let mut st = session.lock();
                st.expiry_secs = rec.expiry_secs;
                st.will = rec.will.map(Box::new);
                st.incoming_qos2 = r.incoming_qos2.into_iter().collect();
                let mut p = Persist::new(self.store.clone(), rec.id, rec.client_id.clone(), r.next_seq);
                let items = r.queued.into_iter().map(|(seq, size)| crate::session::OnDisk {
                    seq,
                    size,
                    qos: QoS::AtLeastOnce,
                });
                let mut disk = crate::session::Queue::new(limits.clone());
                for item in items {
                    disk.push_back(item);
                }
                p.offline = Some(disk);
                st.persist = Some(Box::new(p));
                st.will.as_ref().map(|w| will_delay(w, st.expiry_secs))
            };
            let mut router = self.router.write();
            for (filter, sub) in rec.subscriptions {
                if let Some((inner, group)) = split_filter(&filter) {
                    let entry = SubEntry {
                        session: session.clone(),
                        options: sub.options,
                        sub_id: sub.sub_id,
                        merge_overlaps: false,
                        overlaps: 0,
                        stream: StreamTag::default(),
                    };
                    router.restore(inner, group, entry);
                }
                session.lock().subscriptions.insert(filter, sub);
            }
            drop(router);
            self.sessions.lock().replace(ById(session.clone()));
            // A will still pending (its connection was lost with the broker, or its delay was
            // running) is sent as if the connection had ended now.
            let offline_for = u32::try_from(offline_for).unwrap_or(u32::MAX);
            self.schedule_end(&session, 0, will_delay, rec.expiry_secs, offline_for);
        }
    }

    /// Handles CONNECT on `transport`'s listener: validates the client id, applies limits,
    /// finds or creates the session (closing a connection that holds it) and attaches this
    /// connection, the session's queue now under that listener's policies; returns it with the
    /// CONNACK to send first. `Err` carries the CONNACK reason to refuse with.
    pub fn connect(self: &Arc<Self>, c: &Connect, transport: Transport) -> Result<Connected, ReasonCode> {
        let cfg = &self.config;
        let v5 = c.protocol.is_v5();
        let mut props = Properties::default();
        // Own copies: slices would pin the whole CONNECT read buffer for the life of the session.
        let mut client_id = ByteString::from(&*c.client_id);
        if client_id.is_empty() {
            if !cfg.mqtt.allow_empty_client_id || (!v5 && !c.clean_start) {
                return Err(ReasonCode::ClientIdentifierNotValid);
            }
            client_id = ByteString::from(format!("braid-{:016x}", rand::random::<u64>()));
            if v5 {
                props.assigned_client_identifier = Some(client_id.clone());
            }
        } else if c.protocol == ProtocolVersion::V3_1 && client_id.len() > 23 {
            return Err(ReasonCode::ClientIdentifierNotValid);
        }
        if c.properties.authentication_method.is_some() {
            return Err(ReasonCode::BadAuthenticationMethod);
        }
        if let Some(will) = &c.will {
            if !braid_proto::topic::valid_topic_name(&will.topic) {
                return Err(ReasonCode::TopicNameInvalid);
            }
            if will.qos as u8 > cfg.mqtt.max_qos {
                return Err(ReasonCode::QoSNotSupported);
            }
            if will.retain && !cfg.mqtt.retain_available {
                return Err(ReasonCode::RetainNotSupported);
            }
        }

        let mut keep_alive = c.keep_alive;
        // A v5 client asking for more than the maximum, or for none while a maximum is set,
        // gets Server Keep Alive.
        let max = cfg.mqtt.max_keep_alive;
        if v5 && (keep_alive > max || (keep_alive == 0 && max < u16::MAX)) {
            keep_alive = cfg.mqtt.max_keep_alive;
            props.server_keep_alive = Some(keep_alive);
        }
        let requested_expiry = if v5 {
            c.properties.session_expiry_interval.unwrap_or(0)
        } else if c.clean_start {
            0
        } else {
            u32::MAX
        };
        let expiry = requested_expiry.min(cfg.session.max_session_expiry_secs);
        if v5 {
            if expiry != requested_expiry {
                props.session_expiry_interval = Some(expiry);
            }
            props.receive_maximum = Some(cfg.mqtt.receive_maximum);
            props.maximum_packet_size = Some(cfg.mqtt.max_packet_size);
            props.topic_alias_maximum = Some(cfg.mqtt.topic_alias_maximum);
            if cfg.mqtt.max_qos < 2 {
                props.maximum_qos = Some(cfg.mqtt.max_qos);
            }
            if !cfg.mqtt.retain_available {
                props.retain_available = Some(0);
            }
        }

        let limits = &self.listener_limits[transport as usize];
        let (session, session_present, old) = {
            let mut sessions = self.sessions.lock();
            let existing = sessions.get(&*client_id).map(|s| s.0.clone());
            match existing {
                Some(s) if !c.clean_start => (s.clone(), true, Some((s, false))),
                existing => {
                    let id = self.next_session_id.fetch_add(1, Ordering::Relaxed);
                    let s = Arc::new(Session::new(id, client_id.clone(), limits.clone()));
                    if expiry > 0 && self.store.persistent() {
                        s.lock().persist =
                            Some(Box::new(Persist::new(self.store.clone(), id, client_id.clone(), 1)));
                    }
                    sessions.replace(ById(s.clone()));
                    (s, false, existing.map(|old| (old, true)))
                }
            }
        };
        if let Some((old, discard)) = old {
            self.take_over(&old, discard);
        }

        let ctl = Arc::new(ConnControl::new(keep_alive, self.now_ms()));
        let window = if v5 { c.properties.receive_maximum.unwrap_or(u16::MAX) } else { u16::MAX };
        let alias_max = match (v5, cfg.mqtt.server_topic_aliases) {
            (true, true) => c.properties.topic_alias_maximum.unwrap_or(0),
            _ => 0,
        };
        let max_packet_size = c.properties.maximum_packet_size.unwrap_or(u32::MAX);
        let window = usize::from(window.min(cfg.mqtt.max_inflight));
        let link = Link::new(c.protocol, window, max_packet_size, alias_max, ctl.clone());
        let (generation, restore) = {
            let mut st = session.lock();
            st.expiry_secs = expiry;
            st.will = c.will.clone().map(Box::new);
            st.queue.set_limits(limits.clone());
            let generation = st.attach(link);
            if expiry > 0 && self.store.persistent() && st.persist.is_none() {
                // An online session resumed by a connection that asks for persistence.
                let p = Persist::new(self.store.clone(), session.id, client_id.clone(), 1);
                st.persist = Some(Box::new(p));
            }
            st.save();
            (generation, st.load())
        };
        self.metrics.client_connected();
        if self.shutdown.is_cancelled() {
            // Attached after close_all() swept the sessions: close it here instead.
            ctl.close(ReasonCode::ServerShuttingDown);
        }
        let connack = ConnAck { session_present, reason: ReasonCode::Success, properties: props };
        Ok((Accepted { session, generation, ctl }, connack, restore))
    }

    /// The control of the connection attached to `client_id`'s session, if one is.
    pub(crate) fn attached(&self, client_id: &str) -> Option<Arc<ConnControl>> {
        let session = self.sessions.lock().get(client_id)?.0.clone();
        let ctl = session.lock().link.as_ref().map(|l| l.ctl.clone());
        ctl
    }

    /// Closes the connection attached to `old` (reason 0x8E) and, when `discard`, ends the
    /// session (clean start). A will without delay is sent, as the old connection closed
    /// without DISCONNECT; a delayed will is cancelled by the new connection.
    fn take_over(&self, old: &Arc<Session>, discard: bool) {
        let will = {
            let mut st = old.lock();
            if let Some(link) = st.link.take() {
                link.ctl
                    .close_because(ReasonCode::SessionTakenOver, "another connection took over the session");
                link.ctl.hand_over();
                self.metrics.client_disconnected();
            }
            st.will.take().filter(|w| w.properties.will_delay_interval.unwrap_or(0) == 0 || discard)
        };
        old.release_publishers(Release::All);
        if let Some(will) = will {
            self.publish_will(old, *will);
        }
        if discard {
            self.drop_subscriptions(old);
            old.lock().forget();
        }
        self.handovers.notify_waiters();
    }

    /// Handles SUBSCRIBE: queues matching retained messages and returns the SUBACK, which the
    /// caller writes before it transmits the session's queue. Filters the ACL or the limits
    /// refuse get 0x87 / 0x8F / 0x97 (3.1.x: 0x80). Deliveries for these subscriptions (and
    /// the retained messages they bring) go out on `stream` while it is open (MQTT over QUIC;
    /// `StreamTag::default()` elsewhere).
    pub fn subscribe(
        &self,
        session: &Arc<Session>,
        version: ProtocolVersion,
        sub: Subscribe,
        acl: &mut ConnectionAcl<'_>,
        stream: StreamTag,
    ) -> SubAck {
        let sub_id = sub.properties.subscription_identifiers.first().copied();
        let mut reasons = Vec::with_capacity(sub.filters.len());
        let mut retained_for = Vec::new();
        for (filter, mut options) in sub.filters {
            let Some((inner, group)) = split_filter(&filter) else {
                reasons.push(ReasonCode::TopicFilterInvalid);
                continue;
            };
            if let Some(refused) = self.refuse_filter(session, &filter, inner, acl) {
                reasons.push(refused);
                continue;
            }
            options.qos = options.qos.min(QoS::from_u8(self.config.mqtt.max_qos).unwrap_or(QoS::ExactlyOnce));
            let merge_overlaps = !version.is_v5();
            let entry =
                SubEntry { session: session.clone(), options, sub_id, merge_overlaps, overlaps: 0, stream };
            let is_new = self.router.write().subscribe(inner, group, entry);
            session.lock().subscriptions.insert(filter.clone(), SubscriptionRecord { options, sub_id });
            reasons.push(match options.qos {
                QoS::AtMostOnce => ReasonCode::Success,
                QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
                QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
            });
            let wants_retained = match options.retain_handling {
                RetainHandling::SendAtSubscribe => true,
                RetainHandling::SendIfNew => is_new,
                RetainHandling::DoNotSend => false,
            };
            if group.is_none() && wants_retained {
                retained_for.push((filter, options.qos));
            }
        }
        session.lock().save();
        let now = Instant::now();
        for (filter, qos) in retained_for {
            let matching = self.retained.read().matching(&filter, now);
            for msg in matching {
                let qos = qos.min(msg.qos);
                let d = Delivery { msg, qos, retain: true, sub_ids: sub_id.into(), seq: 0, stream };
                let _ = self.deliver(session, d);
            }
        }
        SubAck { packet_id: sub.packet_id, properties: Properties::default(), reasons }
    }

    /// Why a new subscription to `filter` (inner filter `inner`) is refused, if it is.
    fn refuse_filter(
        &self,
        session: &Session,
        filter: &str,
        inner: &str,
        acl: &mut ConnectionAcl<'_>,
    ) -> Option<ReasonCode> {
        let limits = &self.config.limits;
        if topic_too_big(limits, filter).is_some() {
            return Some(ReasonCode::TopicFilterInvalid);
        }
        if !acl.may_subscribe(inner) {
            return Some(ReasonCode::NotAuthorized);
        }
        let st = session.lock();
        let full = limits.max_subscriptions > 0 && st.subscriptions.len() >= limits.max_subscriptions;
        (full && !st.subscriptions.contains_key(filter)).then_some(ReasonCode::QuotaExceeded)
    }

    /// Handles UNSUBSCRIBE and returns the UNSUBACK.
    pub fn unsubscribe(
        &self,
        session: &Arc<Session>,
        version: ProtocolVersion,
        unsub: Unsubscribe,
    ) -> UnsubAck {
        let mut reasons = Vec::with_capacity(unsub.filters.len());
        for filter in unsub.filters {
            let reason = match split_filter(&filter) {
                None => ReasonCode::TopicFilterInvalid,
                Some((inner, group)) => {
                    let existed = self.router.write().unsubscribe(inner, group, session.id);
                    session.lock().subscriptions.remove(&filter);
                    if existed {
                        ReasonCode::Success
                    } else {
                        ReasonCode::NoSubscriptionExisted
                    }
                }
            };
            reasons.push(reason);
        }
        session.lock().save();
        if !version.is_v5() {
            reasons.clear();
        }
        UnsubAck { packet_id: unsub.packet_id, properties: Properties::default(), reasons }
    }

    /// Stores (if retained) and routes a message to every matching subscription; says what
    /// the publisher's acknowledgement must wait for.
    pub fn publish(&self, msg: Arc<Message>) -> Published {
        let mut out = Published::default();
        if msg.retain {
            self.retained.write().set(msg.clone());
            // `$SYS` values are the broker's own, made afresh at each start.
            if self.store.persistent() && !(msg.origin == 0 && msg.topic.starts_with('$')) {
                out.ticket = self.store.submit(Op::Retain(msg.clone()));
            }
        }
        let router = self.router.read();
        let mut targets = Vec::new();
        router.route(&msg, &mut targets);
        for e in targets {
            let (r, ticket) = self.deliver(e.session, e.delivery(&msg));
            out.ticket = out.ticket.max(ticket);
            let paced_until = match r {
                Enqueued::QueuedOverLimit => None,
                Enqueued::Paced(until) => Some(until),
                _ => continue,
            };
            // A client is never held back by its own subscription.
            if e.session.id != msg.origin {
                out.held.push(Holder { session: e.session.clone(), paced_until });
            }
        }
        out
    }

    fn deliver(&self, session: &Session, d: Delivery) -> (Enqueued, Ticket) {
        let r = session.deliver(d);
        if matches!(r.0, Enqueued::DroppedFull | Enqueued::QueuedDroppedOldest(_)) {
            Metrics::add(&self.metrics.messages_dropped, 1);
        }
        r
    }

    /// A connection of `session` ended. Sends or schedules the will and ends or schedules the
    /// end of the session, unless another connection took the session over.
    pub fn disconnected(self: &Arc<Self>, session: &Arc<Session>, generation: u64, ending: Ending) {
        let (will_delay, expiry, ctl) = {
            let mut st = session.lock();
            let ctl = st.link.as_ref().map(|l| l.ctl.clone());
            if !st.detach(generation) {
                return;
            }
            if ending != Ending::WithWill {
                st.will = None;
            }
            // Saved with a delayed will, so a restart before the delay still sends it.
            st.save();
            (st.will.as_ref().map(|w| will_delay(w, st.expiry_secs)), st.expiry_secs, ctl)
        };
        session.release_publishers(Release::All);
        self.metrics.client_disconnected();
        self.schedule_end(session, generation, will_delay, expiry, 0);
        // A CONNECT waiting to take the session over goes on, and finds it ended or offline.
        if let Some(ctl) = ctl {
            ctl.hand_over();
        }
        self.handovers.notify_waiters();
    }

    /// Sends the will of offline `session` after `will_delay` seconds (if it has one) and ends
    /// the session `expiry` seconds after it went offline, `offline_for` seconds ago; both
    /// unless connection `generation` is no longer the session's latest.
    fn schedule_end(
        self: &Arc<Self>,
        session: &Arc<Session>,
        generation: u64,
        will_delay: Option<u32>,
        expiry: u32,
        offline_for: u32,
    ) {
        if let Some(delay) = will_delay {
            let broker = self.clone();
            let s = session.clone();
            let send = move || {
                let will = {
                    let mut st = s.lock();
                    let will = st.will.take().filter(|_| st.generation == generation);
                    st.save();
                    will
                };
                if let Some(will) = will {
                    broker.publish_will(&s, *will);
                }
            };
            match delay.saturating_sub(offline_for) {
                0 => send(),
                left => self.after(left, send),
            }
        }
        match expiry {
            0 => self.end_session(session),
            u32::MAX => {}
            secs => {
                let broker = self.clone();
                let session = session.clone();
                self.after(secs.saturating_sub(offline_for), move || {
                    let still_offline = {
                        let st = session.lock();
                        st.generation == generation && !st.is_online()
                    };
                    if still_offline {
                        broker.end_session(&session);
                    }
                });
            }
        }
    }

    /// Runs `f` after `secs` seconds unless the broker shuts down first.
    fn after(&self, secs: u32, f: impl FnOnce() + Send + 'static) {
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(u64::from(secs))) => f(),
                _ = shutdown.cancelled() => {}
            }
        });
    }

    /// Removes the session from the registry (if it is still the registered one) and its
    /// subscriptions from the router.
    fn end_session(&self, session: &Arc<Session>) {
        {
            let mut sessions = self.sessions.lock();
            if sessions.get(&*session.client_id).is_some_and(|s| Arc::ptr_eq(&s.0, session)) {
                sessions.remove(&*session.client_id);
            }
        }
        self.drop_subscriptions(session);
        session.lock().forget();
    }

    fn drop_subscriptions(&self, session: &Arc<Session>) {
        let filters: Vec<ByteString> = session.lock().subscriptions.drain().map(|(f, _)| f).collect();
        let mut router = self.router.write();
        for filter in &filters {
            if let Some((inner, group)) = split_filter(filter) {
                router.unsubscribe(inner, group, session.id);
            }
        }
    }

    fn publish_will(&self, session: &Session, will: LastWill) {
        let mut properties = will.properties;
        if properties.will_delay_interval.is_some() {
            properties.will_delay_interval = None;
        }
        let p = Publish {
            dup: false,
            qos: will.qos,
            retain: will.retain,
            topic: will.topic,
            packet_id: 0,
            properties,
            payload: will.payload,
        };
        let _ = self.publish(Message::from_publish(p, Instant::now(), session.id, session.client_id.clone()));
    }

    /// Closes every attached connection with `reason` (at shutdown, after `shutdown` was
    /// cancelled, so connections attaching later close themselves).
    pub fn close_all(&self, reason: ReasonCode) {
        let sessions: Vec<Arc<Session>> = self.sessions.lock().iter().map(|s| s.0.clone()).collect();
        for s in sessions {
            if let Some(link) = &s.lock().link {
                link.ctl.close(reason);
            }
        }
    }

    /// Milliseconds since the broker started: the clock of connection activity.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Closes every connection that has been silent for 1.5 times its keep alive, and asks
    /// those idle for `listeners.park_after_secs` to park. One sweep over the sessions
    /// replaces a timer per connection (see [`crate::server`]).
    pub fn sweep_connections(&self) {
        let now = self.now_ms();
        let park_after = self.config.listeners.park_after_secs.saturating_mul(1000);
        for ById(s) in self.sessions.lock().iter() {
            if let Some(link) = &s.lock().link {
                link.ctl.expire_if_silent(now);
                if park_after > 0 {
                    link.ctl.request_park_if_idle(now, park_after);
                }
            }
        }
    }

    /// Uses `lot` for idle connections (once; the server's parking lot).
    pub fn set_parking_lot(&self, lot: &Arc<ParkingLot>) {
        let _ = self.lot.set(lot.clone());
    }

    /// Connections parked now (see [`crate::park`]).
    pub fn parked(&self) -> usize {
        self.lot.get().map_or(0, |l| l.len())
    }

    /// Removes expired retained messages (from the store too).
    pub fn purge_expired_retained(&self) {
        let purged = self.retained.write().purge_expired(Instant::now());
        if self.store.persistent() {
            for msg in purged {
                self.store.submit(Op::Retain(Message::internal(msg.topic.clone(), Default::default(), true)));
            }
        }
    }

    /// Numbers for `$SYS`: (sessions known, subscriptions, retained messages).
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.sessions.lock().len(), self.router.read().len(), self.retained.read().len())
    }
}

/// Seconds a will waits after its connection ended: its Will Delay Interval, at most the
/// session's expiry.
fn will_delay(will: &LastWill, expiry: u32) -> u32 {
    will.properties.will_delay_interval.unwrap_or(0).min(expiry)
}

/// `filter` split into the filter to match and the shared group, or None if invalid.
fn split_filter(filter: &str) -> Option<(&str, Option<&str>)> {
    match parse_shared(filter) {
        Ok(Some(shared)) => Some((shared.filter, Some(shared.group))),
        Ok(None) if valid_topic_filter(filter) => Some((filter, None)),
        _ => None,
    }
}

/// A session keyed by its client id: the set of these is the session table, and the key is the
/// session's own `client_id` rather than a second copy.
#[derive(Debug)]
struct ById(Arc<Session>);

impl PartialEq for ById {
    fn eq(&self, other: &Self) -> bool {
        self.0.client_id == other.0.client_id
    }
}

impl Eq for ById {}

impl Hash for ById {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `str` hashes, so that lookups by `&str` find it.
        (*self.0.client_id).hash(state)
    }
}

impl Borrow<str> for ById {
    fn borrow(&self) -> &str {
        &self.0.client_id
    }
}
