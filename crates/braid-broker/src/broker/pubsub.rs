//! SUBSCRIBE, UNSUBSCRIBE and PUBLISH: the router and the retained store on one side, the
//! target sessions on the other.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_proto::{
    ByteString, Properties, ProtocolVersion, QoS, ReasonCode, RetainHandling, SubAck, Subscribe,
    SubscriptionOptions, UnsubAck, Unsubscribe,
};

use super::{split_filter, Broker, Holder, Published};
use crate::auth::{ConnectionAcl, Identity};
use crate::limits::topic_too_big;
use crate::message::{Delivery, Message, StreamTag};
use crate::metrics::Metrics;
use crate::rewrite::Sender;
use crate::router::{Forward, RemoteRef, Scope, SubEntry, Subscriber, Target};
use crate::session::{Enqueued, OtherMembers, Session, Wakes};
use crate::store::{Op, SubscriptionRecord, Ticket};
use braid_rules::Event;
use serde_json::Map;

impl Broker {
    /// Handles SUBSCRIBE: queues matching retained messages and returns the SUBACK, which the
    /// caller writes before it transmits the session's queue. Filters the ACL or the limits
    /// refuse get 0x87 / 0x8F / 0x97 (3.1.x: 0x80). Deliveries for these subscriptions (and
    /// the retained messages they bring) go out on `stream` while it is open (MQTT over QUIC;
    /// `StreamTag::default()` elsewhere). `now` is when the SUBSCRIBE arrived.
    pub fn subscribe(
        &self,
        session: &Arc<Session>,
        version: ProtocolVersion,
        sub: Subscribe,
        acl: &mut ConnectionAcl<'_>,
        stream: StreamTag,
        now: Instant,
    ) -> SubAck {
        let sub_id = sub.properties.subscription_identifiers.first().copied();
        let mut reasons = Vec::with_capacity(sub.filters.len());
        let mut retained_for = Vec::new();
        let mut subscribed = self.rules_take(Event::SessionSubscribed).then(Vec::new);
        for (filter, mut options) in sub.filters {
            let Some((inner, _)) = split_filter(&filter) else {
                reasons.push(ReasonCode::TopicFilterInvalid);
                continue;
            };
            // The ACL sees the filter as the client sent it; the session keeps it rewritten
            // (as EMQX).
            let sender = Sender { client_id: &session.client_id, username: acl.username() };
            let rewritten = self.rewrites.rewrite_filter(&filter, sender).map(ByteString::from);
            let kept = rewritten.as_deref().unwrap_or(&filter);
            if let Some(refused) = self.refuse_filter(session, &filter, inner, kept, acl) {
                reasons.push(refused);
                continue;
            }
            let filter = rewritten.unwrap_or(filter);
            let Some((inner, group)) = split_filter(&filter) else {
                reasons.push(ReasonCode::TopicFilterInvalid);
                continue;
            };
            options.qos = options.qos.min(QoS::from_u8(self.config.mqtt.max_qos).unwrap_or(QoS::ExactlyOnce));
            let merge_overlaps = !version.is_v5();
            let to = Subscriber::Session(session.clone());
            let entry = SubEntry { to, options, sub_id, merge_overlaps, overlaps: 0, stream };
            let is_new = self.router.write().subscribe(inner, group, entry);
            // An own copy of the filter: a slice would keep the whole read buffer the
            // SUBSCRIBE arrived in for as long as the subscription lasts.
            let key = ByteString::from(&*filter);
            if let Some(subscribed) = &mut subscribed {
                subscribed.push((key.clone(), options.qos as u8));
            }
            session.lock().subscriptions.insert(key, SubscriptionRecord { options, sub_id });
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
        session.lock().save(self.unix_secs(now));
        if let Some(subscribed) = subscribed {
            self.raise_subscriptions(Event::SessionSubscribed, session, &subscribed, now);
        }
        let mut wakes = Wakes::default();
        for (filter, qos) in retained_for {
            let matching = self.retained.read().matching(&filter, now);
            for msg in matching {
                let qos = qos.min(msg.qos);
                let d =
                    Delivery { msg, qos, retain: true, sub_ids: sub_id.into(), seq: 0, stream, group: None };
                let _ = self.deliver(session, d, now, &mut wakes);
            }
        }
        SubAck { packet_id: sub.packet_id, properties: Properties::default(), reasons }
    }

    /// Subscribes the client of `session` (user `username`, at `peer`) to the
    /// `[[auto_subscribe]]` topics, as a SUBSCRIBE of version `version` from it would, past the
    /// ACL (the operator's choice, as EMQX's auto-subscribe); retained messages come as a
    /// subscription's Retain Handling says. Returns the filters refused (a limit reached).
    pub fn auto_subscribe(
        &self,
        session: &Arc<Session>,
        version: ProtocolVersion,
        username: Option<&str>,
        peer: SocketAddr,
        now: Instant,
    ) -> Vec<ByteString> {
        if self.auto_subscriptions.is_empty() {
            return Vec::new();
        }
        let mut client = Map::new();
        client.insert("clientid".into(), session.client_id.to_string().into());
        if let Some(username) = username {
            client.insert("username".into(), username.into());
        }
        client.insert("host".into(), peer.ip().to_string().into());
        client.insert("port".into(), peer.port().into());
        let filters: Vec<(ByteString, SubscriptionOptions)> = (self.auto_subscriptions.iter())
            .filter_map(|a| Some((ByteString::from(a.topic.render_all(&client)?), a.options)))
            .collect();
        if filters.is_empty() {
            return Vec::new();
        }
        let wanted: Vec<ByteString> = filters.iter().map(|(f, _)| f.clone()).collect();
        let sub = Subscribe { packet_id: 1, properties: Properties::default(), filters };
        let seed =
            self.security.seed(Identity::unrestricted(username.unwrap_or_default()), &session.client_id);
        let mut acl = self.security.resume_acl(seed, &session.client_id);
        let ack = self.subscribe(session, version, sub, &mut acl, StreamTag::default(), now);
        wanted.into_iter().zip(ack.reasons).filter(|(_, r)| r.is_error()).map(|(f, _)| f).collect()
    }

    /// Why a retained PUBLISH of `payload_len` bytes to `topic` is refused under
    /// `[retained]`, if it is; an empty one (a clear) never is. (Two publishes racing for the
    /// last place may both get it: the count is read, not reserved.)
    pub fn retained_refusal(&self, topic: &str, payload_len: usize) -> Option<&'static str> {
        let limits = &self.config.retained;
        if payload_len == 0 {
            return None;
        }
        if limits.max_payload_bytes > 0 && payload_len > limits.max_payload_bytes {
            return Some("its payload is over retained.max_payload_bytes");
        }
        if limits.max_messages > 0 {
            let retained = self.retained.read();
            if retained.clients_len() >= limits.max_messages && !retained.contains(topic) {
                return Some("retained.max_messages messages are retained already");
            }
        }
        None
    }

    /// `msg` as the retained index keeps it, published at `now`: its expiry capped by
    /// `retained.max_expiry_secs`, or set by `retained.default_expiry_secs` if it has none.
    fn retained_copy(&self, msg: &Arc<Message>, now: Instant) -> Arc<Message> {
        let limits = &self.config.retained;
        let after = |secs: u64| (secs > 0).then(|| now + Duration::from_secs(secs));
        let cap = after(limits.max_expiry_secs);
        let expires_at = match msg.expires_at.or(after(limits.default_expiry_secs)) {
            Some(at) => Some(cap.map_or(at, |cap| at.min(cap))),
            None => cap,
        };
        if expires_at == msg.expires_at {
            return msg.clone();
        }
        Arc::new(Message { expires_at, ..(**msg).clone() })
    }

    /// Why a new subscription to `filter` (inner filter `inner`), kept in the session as
    /// `kept` (rewritten, see [`crate::rewrite`]), is refused, if it is.
    fn refuse_filter(
        &self,
        session: &Session,
        filter: &str,
        inner: &str,
        kept: &str,
        acl: &mut ConnectionAcl<'_>,
    ) -> Option<ReasonCode> {
        let live = self.live();
        let limits = &live.limits;
        if topic_too_big(limits, filter).is_some() {
            return Some(ReasonCode::TopicFilterInvalid);
        }
        if !acl.may_subscribe(inner) {
            return Some(ReasonCode::NotAuthorized);
        }
        let st = session.lock();
        let full = limits.max_subscriptions > 0 && st.subscriptions.len() >= limits.max_subscriptions;
        (full && !st.subscriptions.contains_key(kept)).then_some(ReasonCode::QuotaExceeded)
    }

    /// Handles UNSUBSCRIBE, arrived at `now`, and returns the UNSUBACK.
    pub fn unsubscribe(
        &self,
        session: &Arc<Session>,
        version: ProtocolVersion,
        unsub: Unsubscribe,
        now: Instant,
    ) -> UnsubAck {
        let mut reasons = Vec::with_capacity(unsub.filters.len());
        let mut unsubscribed = self.rules_take(Event::SessionUnsubscribed).then(Vec::new);
        for filter in unsub.filters {
            let reason = match split_filter(&filter) {
                None => ReasonCode::TopicFilterInvalid,
                Some((inner, group)) => {
                    let existed = self.router.write().unsubscribe(inner, group, session.id);
                    let record = session.lock().subscriptions.remove(&filter);
                    if let (Some(unsubscribed), Some(record)) = (&mut unsubscribed, record) {
                        unsubscribed.push((ByteString::from(&*filter), record.options.qos as u8));
                    }
                    if existed {
                        ReasonCode::Success
                    } else {
                        ReasonCode::NoSubscriptionExisted
                    }
                }
            };
            reasons.push(reason);
        }
        session.lock().save(self.unix_secs(now));
        if let Some(unsubscribed) = unsubscribed {
            self.raise_subscriptions(Event::SessionUnsubscribed, session, &unsubscribed, now);
        }
        if !version.is_v5() {
            reasons.clear();
        }
        UnsubAck { packet_id: unsub.packet_id, properties: Properties::default(), reasons }
    }

    /// Stores (if retained) and routes a message, published at `now`, to every matching
    /// subscription; says what the publisher's acknowledgement must wait for. A remote
    /// subscriber gets the message once, however many of its subscriptions match.
    pub fn publish(&self, msg: Arc<Message>, now: Instant) -> Published {
        let mut out = Published::default();
        if msg.retain {
            let kept = self.retained_copy(&msg, now);
            self.retained.write().set(kept.clone(), now);
            // `$SYS` values are the broker's own, made afresh at each start.
            if self.store.persistent() && !(msg.origin == 0 && msg.topic.starts_with('$')) {
                out.ticket = self.store.submit(Op::Retain(kept));
            }
        }
        let watched = self.message_events_wanted(&msg);
        let mut delivered = Vec::new();
        let nobody = {
            let router = self.router.read();
            let mut targets = Vec::new();
            router.route(&msg, &mut targets);
            self.forward_to_remotes(&msg, &targets, &mut out, now);
            self.deliver_to_sessions(&msg, &targets, &mut out, now);
            if watched.delivered {
                delivered.extend(targets.iter().filter_map(|t| match t.to {
                    Subscriber::Session(s) => Some((s.clone(), t.qos(&msg))),
                    Subscriber::Remote(_) => None,
                }));
            }
            targets.is_empty()
        };
        if watched.any() {
            self.raise_message_events(&msg, &delivered, nobody && watched.dropped, now);
        }
        out
    }

    /// The shared subscriptions of `session` whose groups have other members.
    pub(super) fn other_members(&self, session: &Session) -> OtherMembers {
        let filters: Vec<ByteString> =
            session.lock().subscriptions.keys().filter(|f| f.starts_with('$')).cloned().collect();
        if filters.is_empty() {
            // No shared subscription (the common case): the router is not looked at.
            return OtherMembers::default();
        }
        let router = self.router.read();
        let shared = filters.iter().filter_map(|f| {
            let (inner, group) = split_filter(f)?;
            let group = group?;
            router.has_other_member(inner, group, session.id).then(|| (group.into(), inner.into()))
        });
        OtherMembers(shared.collect())
    }

    /// Hands `taken`, deliveries that `from` got through its shared subscriptions `others` and
    /// did not acknowledge before it went offline, to other members of those groups at `now`.
    /// One whose group has lost its other members meanwhile goes back to `from`.
    pub(super) fn hand_to_other_members(
        &self,
        from: &Arc<Session>,
        others: &OtherMembers,
        taken: Vec<Delivery>,
        now: Instant,
    ) {
        if taken.is_empty() {
            return;
        }
        // Declared first, so dropped (its connections woken) after the router's lock.
        let mut out = Published::default();
        let router = self.router.read();
        for d in taken {
            let pick =
                others.of(&d).and_then(|(group, filter)| router.pick_instead(filter, group, from.id, &d.msg));
            let Some(target) = pick else {
                self.deliver(from, d, now, &mut out.wakes);
                continue;
            };
            // Under a new identity: a node it goes to may have seen the one it came with.
            let msg = match d.msg.remote_id {
                Some(_) => Arc::new(Message { remote_id: None, ..(*d.msg).clone() }),
                None => d.msg,
            };
            let targets = [target];
            self.forward_to_remotes(&msg, &targets, &mut out, now);
            self.deliver_to_sessions(&msg, &targets, &mut out, now);
        }
    }

    /// Hands `msg` to the remote subscribers among `targets`, once each, with the scope of
    /// their matching subscriptions.
    pub(super) fn forward_to_remotes(
        &self,
        msg: &Arc<Message>,
        targets: &[Target],
        out: &mut Published,
        now: Instant,
    ) {
        let mut remotes: Vec<(&RemoteRef, Scope)> = Vec::new();
        for e in targets {
            let Subscriber::Remote(remote) = e.to else { continue };
            let i = match remotes.iter().position(|(r, _)| r.id == remote.id) {
                Some(i) => i,
                None => {
                    remotes.push((remote, Scope::default()));
                    remotes.len() - 1
                }
            };
            match e.group {
                None => remotes[i].1.plain = true,
                Some(g) => remotes[i].1.groups.push(g.into()),
            }
        }
        if remotes.is_empty() {
            return;
        }
        let id = self.next_session_id.fetch_add(1, Ordering::Relaxed);
        for (remote, scope) in remotes {
            let d = remote.sink.deliver(Forward { msg: msg.clone(), scope, id }, now);
            self.count_drop(d.enqueued);
            out.ticket = out.ticket.max(d.ticket);
            out.confirms.extend(d.confirm);
            if let Some(waker) = d.wake {
                out.wakes.push_remote(waker);
            }
        }
    }

    pub(super) fn deliver_to_sessions(
        &self,
        msg: &Arc<Message>,
        targets: &[Target],
        out: &mut Published,
        now: Instant,
    ) {
        for e in targets {
            let Subscriber::Session(session) = e.to else { continue };
            self.deliver_holding(session, e.delivery(msg), out, now);
        }
    }

    /// Delivers `d` to `session` at `now`, adding to `out` the store ticket and, if the session
    /// is behind, the session as one that holds the publisher back (unless the publisher is
    /// the session itself: a client is never held back by its own subscription).
    pub(super) fn deliver_holding(
        &self,
        session: &Arc<Session>,
        d: Delivery,
        out: &mut Published,
        now: Instant,
    ) -> Enqueued {
        let origin = d.msg.origin;
        let (r, ticket) = self.deliver(session, d, now, &mut out.wakes);
        out.ticket = out.ticket.max(ticket);
        let paced_until = match r {
            Enqueued::QueuedOverLimit => None,
            Enqueued::Paced(until) => Some(until),
            _ => return r,
        };
        if session.id != origin {
            out.held.push(Holder { session: session.clone(), paced_until });
        }
        r
    }

    fn deliver(
        &self,
        session: &Arc<Session>,
        d: Delivery,
        now: Instant,
        wakes: &mut Wakes,
    ) -> (Enqueued, Ticket) {
        let r = session.deliver(d, now, wakes);
        self.count_drop(r.0);
        r
    }

    /// Counts a delivery dropped by a full queue.
    fn count_drop(&self, r: Enqueued) {
        if matches!(r, Enqueued::DroppedFull | Enqueued::QueuedDroppedOldest(_)) {
            Metrics::add(&self.metrics.dropped_queue_full, 1);
        }
    }
}
