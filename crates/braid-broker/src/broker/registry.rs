//! The session registry: CONNECT finds or creates a client's session, closing a connection
//! that holds it (takeover).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use braid_proto::{
    ByteString, ConnAck, Connect, Properties, ProtocolVersion, QoS, ReasonCode, SubscriptionOptions,
};

use braid_rules::Event;

use super::rules::Who;
use super::{split_filter, Accepted, Broker, ById, ClusterSide, Connected, WillOnRelease};
use crate::control::ConnControl;
use crate::router::{RemoteRef, SubEntry};
use crate::session::{Link, Origin, Persist, QueueLimits, Release, Session};
use crate::store::Ticket;
use crate::transport_kind::Transport;

impl Broker {
    /// The queue limits of the sessions of clients that connect through `transport`'s
    /// listener.
    pub fn listener_limits(&self, transport: Transport) -> Arc<QueueLimits> {
        self.live().listener_limits(transport)
    }

    /// Handles CONNECT: validates the client id, applies limits, finds or creates the session
    /// (closing a connection that holds it) and attaches this connection, the session's queue
    /// now under `limits` (its listener's policies); returns it with the CONNACK to send
    /// first. `Err` carries the CONNACK reason to refuse with. `now` is when the CONNECT
    /// arrived.
    pub fn connect(
        &self,
        c: &Connect,
        limits: Arc<QueueLimits>,
        mut origin: Origin,
        now: Instant,
    ) -> Result<Connected, ReasonCode> {
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
        let expiry = requested_expiry.min(self.live().session.max_session_expiry_secs);
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

        let (session, session_present, old) = {
            let mut sessions = self.sessions.lock();
            let existing = sessions.get(&*client_id).map(|s| s.0.clone());
            match existing {
                Some(s) if !c.clean_start => (s.clone(), true, Some((s, false))),
                existing => {
                    let id = self.next_session_id.fetch_add(1, Ordering::Relaxed);
                    // Moved, not cloned: a clone of a string of its own would make it shared,
                    // a second allocation for as long as the session lasts.
                    let s = Arc::new(Session::new(id, std::mem::take(&mut client_id), limits.clone()));
                    if expiry > 0 && self.store.persistent() {
                        let p = Persist::new(self.store.clone(), id, s.client_id.clone(), 1);
                        s.lock().persist = Some(Box::new(p));
                    }
                    sessions.replace(ById(s.clone()));
                    (s, false, existing.map(|old| (old, true)))
                }
            }
        };
        if let Some((old, discard)) = old {
            self.take_over(&old, discard, now);
        }

        let ctl = ConnControl::new(&self.liveness, keep_alive, self.clock_ms(now));
        let window = if v5 { c.properties.receive_maximum.unwrap_or(u16::MAX) } else { u16::MAX };
        let alias_max = match (v5, cfg.mqtt.server_topic_aliases) {
            (true, true) => c.properties.topic_alias_maximum.unwrap_or(0),
            _ => 0,
        };
        let max_packet_size = c.properties.maximum_packet_size.unwrap_or(u32::MAX);
        let window = window.min(cfg.mqtt.max_inflight);
        let mut link = Link::new(c.protocol, window, max_packet_size, alias_max, ctl.clone());
        let transport = origin.transport;
        (origin.keep_alive, origin.connected_at) = (keep_alive, self.unix_secs(now));
        let connected = self.rules_take(Event::ClientConnected).then(|| Who::new(&origin, c.protocol));
        link.origin = origin;
        let (generation, restore) = {
            let mut st = session.lock();
            st.expiry_secs = expiry;
            st.will = c.will.as_ref().map(|w| Box::new(w.detached()));
            st.queue.set_limits(limits.clone());
            let generation = st.attach(link);
            if expiry > 0 && self.store.persistent() && st.persist.is_none() {
                // An online session resumed by a connection that asks for persistence.
                let p = Persist::new(self.store.clone(), session.id, session.client_id.clone(), 1);
                st.persist = Some(Box::new(p));
            }
            st.save(self.unix_secs(now));
            (generation, st.load())
        };
        self.metrics.client_connected(transport);
        if let Some(who) = connected {
            self.raise_connected(&session.client_id, &who, c, (keep_alive, expiry), now);
        }
        if self.shutdown.is_cancelled() {
            // Attached after close_all() swept the sessions: close it here instead.
            ctl.close(ReasonCode::ServerShuttingDown);
        }
        let connack = ConnAck { session_present, reason: ReasonCode::Success, properties: props };
        Ok((Accepted { session, generation, ctl }, connack, restore))
    }

    /// The client ids of the sessions this broker holds.
    pub fn client_ids(&self) -> Vec<ByteString> {
        self.sessions.lock().iter().map(|s| s.0.client_id.clone()).collect()
    }

    /// The filters `client_id`'s session here subscribes to (`$share/{group}/` included);
    /// empty if this broker holds no session of it.
    pub fn subscriptions_of(&self, client_id: &str) -> Vec<ByteString> {
        let Some(session) = self.session_of(client_id) else { return Vec::new() };
        let filters = session.lock().subscriptions.keys().cloned().collect();
        filters
    }

    /// How many deliveries `client_id`'s session here holds for its client: queued, in flight,
    /// and, while it is offline, waiting in the store; None if this broker holds no session of
    /// it.
    pub fn held_for(&self, client_id: &str) -> Option<usize> {
        let session = self.session_of(client_id)?;
        let st = session.lock();
        Some(st.waiting() + st.inflight.len())
    }

    /// `client_id`'s session here, if this broker holds one.
    pub(super) fn session_of(&self, client_id: &str) -> Option<Arc<Session>> {
        self.sessions.lock().get(client_id).map(|s| s.0.clone())
    }

    /// The control of the connection attached to `client_id`'s session, if one is.
    pub(crate) fn attached(&self, client_id: &str) -> Option<Arc<ConnControl>> {
        let session = self.session_of(client_id)?;
        let ctl = session.lock().link.as_ref().map(|l| l.ctl.clone());
        ctl
    }

    /// Closes the connection attached to `old` (reason 0x8E) and, when `discard`, ends the
    /// session (clean start). A will without delay is sent, as the old connection closed
    /// without DISCONNECT; a delayed will is cancelled by the new connection.
    fn take_over(&self, old: &Arc<Session>, discard: bool, now: Instant) {
        let (link, will) = {
            let mut st = old.lock();
            let will =
                st.will.take().filter(|w| w.properties.will_delay_interval.unwrap_or(0) == 0 || discard);
            (st.link.take(), will)
        };
        // Closed after the session's lock is released: a parked connection's close unparks it
        // (the parking lot's lock, epoll and a spawn).
        if let Some(link) = link {
            link.ctl.close_because(ReasonCode::SessionTakenOver, "another connection took over the session");
            link.ctl.hand_over();
            self.metrics.client_disconnected(link.origin.transport);
            if self.rules_take(Event::ClientDisconnected) {
                let who = Who::new(&link.origin, link.version);
                self.raise_disconnected(&old.client_id, &who, "takenover", now);
            }
        }
        old.release_publishers(Release::All);
        if let Some(will) = will {
            self.publish_will(old, *will, now);
        }
        if discard {
            // The session ends: what came through its shared subscriptions and was not
            // acknowledged goes to other members.
            let others = self.other_members(old);
            let taken = old.lock().take_shared(&others);
            self.hand_to_other_members(old, &others, taken, now);
            self.drop_subscriptions(old);
            old.lock().forget();
        }
        self.handovers.notify_waiters();
    }

    /// Closes every attached connection with `reason` (at shutdown, after `shutdown` was
    /// cancelled, so connections attaching later close themselves).
    pub fn close_all(&self, reason: ReasonCode) {
        let sessions: Vec<Arc<Session>> = self.sessions.lock().iter().map(|s| s.0.clone()).collect();
        for s in sessions {
            let ctl = s.lock().link.as_ref().map(|l| l.ctl.clone());
            if let Some(ctl) = ctl {
                ctl.close(reason);
            }
        }
    }
}

impl ClusterSide<'_> {
    /// The id of `client_id`'s session here, if this broker holds one.
    pub fn session_id(&self, client_id: &str) -> Option<u64> {
        self.broker.sessions.lock().get(client_id).map(|s| s.0.id)
    }

    /// True if this broker holds a session of `client_id` (connected or not).
    pub fn has_session(&self, client_id: &str) -> bool {
        self.broker.sessions.lock().contains(client_id)
    }

    /// Lets go of `client_id`'s session, which another node of a cluster takes over: its
    /// subscriptions go to `relay` (a remote subscriber for that node), if given, in the same
    /// step, so a message routed here meanwhile goes there; its connection is closed (0x8E) as in a
    /// takeover; what it persisted is left in the store for the new holder and nothing more is
    /// written for it; `will` says what becomes of its will. Returns the store ticket of its
    /// last change (the handover waits until that is durable) and the filters moved to `relay`,
    /// or None if there is no such session.
    pub fn release(
        &self,
        client_id: &str,
        now: Instant,
        relay: Option<&Arc<RemoteRef>>,
        will: WillOnRelease,
    ) -> Option<(Ticket, Vec<ByteString>)> {
        let session = self.broker.sessions.lock().get(client_id)?.0.clone();
        let filters: Vec<ByteString> = session.lock().subscriptions.keys().cloned().collect();
        {
            let mut router = self.broker.router.write();
            let options = SubscriptionOptions { qos: QoS::ExactlyOnce, ..SubscriptionOptions::default() };
            for filter in &filters {
                if let Some((inner, group)) = split_filter(filter) {
                    // The relay first: the filter never looks unsubscribed here.
                    if let Some(relay) = relay {
                        router.subscribe(inner, group, SubEntry::remote(relay.clone(), options));
                    }
                    router.unsubscribe(inner, group, session.id);
                }
            }
        }
        // The connection goes as in a takeover (its will, if due, is sent here, once); the
        // record is saved without the will unless it is kept, then nothing more is written:
        // whatever was routed to the session before is in its store ticket now.
        let delayed =
            session.lock().will.clone().filter(|w| w.properties.will_delay_interval.unwrap_or(0) > 0);
        self.broker.take_over(&session, false, now);
        match (will, delayed) {
            (WillOnRelease::Ended, Some(w)) => self.broker.publish_will(&session, *w, now),
            (WillOnRelease::Kept, Some(w)) => session.lock().will = Some(w),
            _ => {}
        }
        let persist = {
            let mut st = session.lock();
            st.save(self.broker.unix_secs(now));
            // Its timer here (if it had one) finds nothing to send.
            st.will = None;
            st.subscriptions.clear();
            st.persist.take()
        };
        {
            let mut sessions = self.broker.sessions.lock();
            if sessions.get(client_id).is_some_and(|s| Arc::ptr_eq(&s.0, &session)) {
                sessions.remove(client_id);
            }
        }
        session.lock().forget();
        Some((persist.map_or(0, |p| p.ticket), filters))
    }

    /// The client ids of the connections attached here and not closing, in-process clients (a
    /// bridge's) left out: the connections a cluster may move to its other nodes.
    pub fn connected_clients(&self) -> Vec<ByteString> {
        let sessions: Vec<Arc<Session>> = self.broker.sessions.lock().iter().map(|s| s.0.clone()).collect();
        sessions
            .iter()
            .filter(|s| !s.node_local() && s.lock().link.as_ref().is_some_and(|l| !l.ctl.is_closed()))
            .map(|s| s.client_id.clone())
            .collect()
    }

    /// Sends away the connections of `client_ids` that are attached and not closing: each is
    /// closed with `reason` and `detail`, and a v5 client is told to connect to the server that
    /// `server_reference` names for it (DISCONNECT's Server Reference; asked once per connection
    /// closed). Its session stays, as its expiry says, for its client to resume elsewhere. No
    /// I/O here, and no lock held for more than one lookup: each connection's task sends its
    /// DISCONNECT, so a caller paces its calls. Returns how many it closed.
    pub fn send_away(
        &self,
        client_ids: &[ByteString],
        reason: ReasonCode,
        detail: &'static str,
        mut server_reference: impl FnMut() -> Option<ByteString>,
    ) -> usize {
        let mut closed = 0;
        for client_id in client_ids {
            match self.broker.attached(client_id) {
                Some(ctl) if !ctl.is_closed() => {
                    ctl.close_to(reason, detail, server_reference());
                    closed += 1;
                }
                _ => {}
            }
        }
        closed
    }
}

#[cfg(test)]
mod tests {
    use braid_proto::{ByteString, Connect, Packet, Properties, ProtocolVersion, ReasonCode};

    use crate::harness::Harness;
    use crate::{Broker, Config};

    fn connect(client_id: &str, protocol: ProtocolVersion) -> Connect {
        let mut properties = Properties::default();
        properties.session_expiry_interval = protocol.is_v5().then_some(300);
        Connect {
            protocol,
            clean_start: false,
            keep_alive: 0,
            properties,
            client_id: client_id.into(),
            will: None,
            username: None,
            password: None,
        }
    }

    #[test]
    fn connections_sent_away_get_0x9c_with_their_server_reference_and_keep_their_sessions() {
        let broker = Broker::new(Config::embedded());
        let mut h = Harness::new(&broker);
        let (v5, _) = h.connect(connect("v5", ProtocolVersion::V5));
        let (v3, _) = h.connect(connect("v3", ProtocolVersion::V3_1_1));
        let (other, _) = h.connect(connect("other", ProtocolVersion::V5));
        let mut listed = broker.cluster().connected_clients();
        listed.sort();
        assert_eq!(listed, ["other", "v3", "v5"]);

        let mut targets = ["b:1883", "c:1883"].into_iter().map(ByteString::from);
        let ids = [ByteString::from("v5"), "v3".into(), "nobody".into()];
        let closed =
            broker.cluster().send_away(&ids, ReasonCode::UseAnotherServer, "draining", || targets.next());
        assert_eq!(closed, 2, "the two attached connections; no session of nobody");
        let Some(Packet::Disconnect(d)) = h.received(v5).pop() else { panic!("no DISCONNECT") };
        assert_eq!(d.reason, ReasonCode::UseAnotherServer);
        assert_eq!(d.properties.server_reference.as_deref(), Some("b:1883"));
        assert_eq!(d.properties.reason_string.as_deref(), Some("draining"));
        assert!(h.received(v3).is_empty(), "a 3.1.1 client is closed without DISCONNECT");
        assert_eq!(h.closed(v3), Some(ReasonCode::UseAnotherServer));
        assert_eq!(h.closed(other), None);
        assert_eq!(broker.cluster().connected_clients(), ["other"]);
        assert!(
            broker.cluster().has_session("v5") && broker.cluster().has_session("v3"),
            "persistent sessions stay"
        );
        let again = broker.cluster().send_away(&ids, ReasonCode::UseAnotherServer, "draining", || None);
        assert_eq!(again, 0, "closed already");
    }
}
