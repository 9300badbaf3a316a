//! What operators ask of a running broker (the HTTP admin API), through [`Operators`]: its sessions and one
//! client's detail, kicking a client, a session's subscriptions, the retained messages, and
//! the parts of the node that report themselves.

use std::sync::Arc;
use std::time::Instant;

use braid_proto::{ByteString, ProtocolVersion, ReasonCode, Subscribe, SubscriptionOptions, Unsubscribe};

use super::Broker;
use crate::auth::Identity;
use crate::message::StreamTag;
use crate::report::Report;
use crate::retained::Kept;
use crate::session::{Origin, Session};
use crate::store::SubscriptionRecord;

/// One session as operators see it.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    /// Its client id.
    pub client_id: ByteString,
    /// The attached connection's origin and protocol, while one is attached.
    pub connection: Option<(Origin, ProtocolVersion)>,
    /// True if it outlives its connection (Session Expiry Interval above 0).
    pub persistent: bool,
    /// Session Expiry Interval in seconds (`u32::MAX`: never).
    pub expiry_secs: u32,
    /// Its subscriptions by full filter, in filter order.
    pub subscriptions: Vec<(ByteString, SubscriptionRecord)>,
    /// Deliveries waiting to be sent (in memory, and on disk while it is offline).
    pub queued: usize,
    /// Deliveries sent and not yet acknowledged.
    pub inflight: usize,
    /// Deliveries it dropped (queue full, expired, too large).
    pub dropped: u64,
}

impl ClientInfo {
    fn of(session: &Session) -> ClientInfo {
        let st = session.lock();
        let mut subscriptions: Vec<_> = st.subscriptions.iter().map(|(f, r)| (f.clone(), *r)).collect();
        subscriptions.sort_by(|a, b| a.0.cmp(&b.0));
        ClientInfo {
            client_id: session.client_id.clone(),
            connection: st.link.as_ref().map(|l| (l.origin.clone(), l.version)),
            persistent: st.expiry_secs > 0,
            expiry_secs: st.expiry_secs,
            subscriptions,
            queued: st.waiting(),
            inflight: st.inflight.len(),
            dropped: st.dropped,
        }
    }
}

/// Totals over every session, for metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueTotals {
    /// Deliveries waiting to be sent (in memory, and on disk for offline sessions).
    pub queued: usize,
    /// Deliveries sent and not yet acknowledged.
    pub inflight: usize,
    /// Publishers held back by full queues now.
    pub publishers_held: u64,
}

impl Broker {
    /// What operators ask of this broker (the admin API, `/metrics`).
    pub fn operators(&self) -> Operators<'_> {
        Operators { broker: self }
    }

    /// Registers a part of the node that reports to operators.
    pub fn add_report(&self, report: Arc<dyn Report>) {
        self.reports.write().push(report);
    }

    /// Takes `report` (registered with [`Broker::add_report`]) off the reports.
    pub fn remove_report(&self, report: &Arc<dyn Report>) {
        self.reports.write().retain(|r| !Arc::ptr_eq(r, report));
    }
}

/// What operators ask of a broker: its sessions, one client's detail, the retained messages and
/// the reports, and the few actions an operator takes on a client. Each call holds the
/// registry's, the router's or one session's lock only for its own reading, and none while it
/// calls back into the broker; none is on the publish path.
#[derive(Debug, Clone, Copy)]
pub struct Operators<'a> {
    broker: &'a Broker,
}

impl Operators<'_> {
    /// Totals over every session this broker holds.
    pub fn queue_totals(&self) -> QueueTotals {
        let sessions: Vec<Arc<Session>> = self.broker.sessions.lock().iter().map(|s| s.0.clone()).collect();
        let mut t = QueueTotals::default();
        for s in sessions {
            let st = s.lock();
            t.queued += st.waiting();
            t.inflight += st.inflight.len();
            t.publishers_held += u64::from(st.holding());
        }
        t
    }

    /// Every session this broker holds, connected or not, in-process clients' included, in
    /// no particular order.
    pub fn clients(&self) -> Vec<ClientInfo> {
        let sessions: Vec<Arc<Session>> = self.broker.sessions.lock().iter().map(|s| s.0.clone()).collect();
        sessions.iter().map(|s| ClientInfo::of(s)).collect()
    }

    /// `client_id`'s session, if this broker holds one.
    pub fn client(&self, client_id: &str) -> Option<ClientInfo> {
        self.broker.session_of(client_id).map(|s| ClientInfo::of(&s))
    }

    /// Closes `client_id`'s connection, if one is attached (v5 clients get DISCONNECT 0x98
    /// Administrative action); its session stays as its expiry says. False if none is.
    pub fn kick(&self, client_id: &str) -> bool {
        let Some(ctl) = self.broker.attached(client_id) else { return false };
        ctl.close_because(ReasonCode::AdministrativeAction, "an operator closed the connection");
        true
    }

    /// Subscribes `client_id`'s session to `filter` for an operator (no ACL applies; no
    /// retained messages are sent). Returns the reason code a SUBACK would carry, or None if
    /// this broker holds no session of it.
    pub fn subscribe_for(
        &self,
        client_id: &str,
        filter: &str,
        mut options: SubscriptionOptions,
        now: Instant,
    ) -> Option<ReasonCode> {
        let session = self.broker.session_of(client_id)?;
        let version = version_of(&session);
        options.retain_handling = braid_proto::RetainHandling::DoNotSend;
        let sub = Subscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: vec![(ByteString::from(filter), options)],
        };
        let seed = self.broker.security.seed(Identity::unrestricted("admin"), client_id);
        let mut acl = self.broker.security.resume_acl(seed, client_id);
        let suback = self.broker.subscribe(&session, version, sub, &mut acl, StreamTag::default(), now);
        suback.reasons.first().copied()
    }

    /// Unsubscribes `client_id`'s session from `filter` for an operator: Some(true) if it
    /// was subscribed, Some(false) if not, None if this broker holds no session of it.
    pub fn unsubscribe_for(&self, client_id: &str, filter: &str, now: Instant) -> Option<bool> {
        let session = self.broker.session_of(client_id)?;
        let had = session.lock().subscriptions.contains_key(filter);
        let unsub = Unsubscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: vec![ByteString::from(filter)],
        };
        self.broker.unsubscribe(&session, ProtocolVersion::V5, unsub, now);
        Some(had)
    }

    /// The retained messages whose topics match `filter` at `now`.
    pub fn retained_matching(&self, filter: &str, now: Instant) -> Vec<Kept> {
        self.broker.retained.read().matching_kept(filter, now)
    }

    /// Every registered report.
    pub fn reports(&self) -> Vec<Arc<dyn Report>> {
        self.broker.reports.read().clone()
    }
}

/// The protocol of the session's connection, or 5 when none is attached.
fn version_of(session: &Session) -> ProtocolVersion {
    session.lock().link.as_ref().map_or(ProtocolVersion::V5, |l| l.version)
}
