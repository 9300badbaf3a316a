//! Reloading what the store kept: retained messages and offline persistent sessions.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use braid_proto::QoS;

use super::lifecycle::will_delay;
use super::{split_filter, Broker, ById, ClusterSide};
use crate::message::{Delivery, StreamTag};
use crate::router::{SubEntry, Subscriber};
use crate::session::{OnDisk, Persist, Queue, RemoteIds, Session};
use crate::store::{RecoveredSession, Stage, Stored};

impl Broker {
    /// Loads what the store kept: retained messages, sessions (offline, their deliveries on
    /// disk) with their subscriptions; sets their wills and expiry as timers, measured from
    /// `now`, and sends the wills already due.
    pub(super) fn recover(&self, now: Instant) {
        let found = self.store.take_recovered();
        self.next_session_id.fetch_max(found.next_session_id, Ordering::Relaxed);
        {
            let mut retained = self.retained.write();
            for msg in found.retained {
                retained.set(msg, now);
            }
        }
        let unix_now = self.unix_secs(now);
        for r in found.sessions {
            self.restore_session(r, unix_now, now);
        }
    }

    /// Hands the deliveries `shared` of offline `client_id`'s session that its client may not
    /// have (queued, or QoS 1 sent without a PUBACK) to other members of their groups, as
    /// [`Broker::disconnected`] does for a client that goes away here.
    fn hand_off_shared(&self, client_id: &str, shared: Vec<Stored>, now: Instant) {
        let Some(session) = self.sessions.lock().get(client_id).map(|s| s.0.clone()) else { return };
        let others = self.other_members(&session);
        let unacked = |s: &Stored| match s.stage {
            Stage::Queued => true,
            Stage::Sent => s.delivery.qos == QoS::AtLeastOnce,
            Stage::Released => false,
        };
        let taken: Vec<Delivery> = shared
            .into_iter()
            .filter(|s| unacked(s) && others.covers(&s.delivery))
            .map(|s| s.delivery)
            .collect();
        self.with_persist(client_id, |p| taken.iter().for_each(|d| p.hand_off(d.seq)));
        self.hand_to_other_members(&session, &others, taken, now);
    }

    /// Runs `f` on the store link of `client_id`'s session, if it has one here.
    fn with_persist(&self, client_id: &str, f: impl FnOnce(&mut Persist)) {
        let Some(session) = self.sessions.lock().get(client_id).map(|s| s.0.clone()) else { return };
        let mut st = session.lock();
        if let Some(p) = st.persist.as_deref_mut() {
            f(p);
        }
    }

    /// Puts a session the store kept into the registry and its subscriptions into the router;
    /// sets its will and expiry as timers (`unix_now` is `now` as the store counts time).
    fn restore_session(&self, r: RecoveredSession, unix_now: u64, now: Instant) {
        let limits = &self.live().queue_limits;
        let rec = r.record;
        let session = Arc::new(Session::new(rec.id, rec.client_id.clone(), limits.clone()));
        if rec.expiry_secs == 0 {
            // Ended with its last connection, just before the broker stopped.
            let mut st = session.lock();
            st.persist = Some(Box::new(Persist::new(self.store.clone(), rec.id, rec.client_id, 1)));
            st.forget();
            return;
        }
        let offline_for = unix_now.saturating_sub(rec.offline_since.unwrap_or(unix_now));
        let will_delay = {
            let mut st = session.lock();
            st.expiry_secs = rec.expiry_secs;
            st.will = rec.will.map(Box::new);
            st.incoming_qos2 = r.incoming_qos2.into_iter().collect();
            let mut p = Persist::new(self.store.clone(), rec.id, rec.client_id.clone(), r.next_seq);
            let items = r.queued.into_iter().map(|(seq, size)| OnDisk { seq, size, qos: QoS::AtLeastOnce });
            let mut disk = Queue::new(limits.clone());
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
                    to: Subscriber::Session(session.clone()),
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
        self.schedule_end(&session, 0, will_delay, rec.expiry_secs, now, offline_for);
    }
}

impl ClusterSide<'_> {
    /// A session id no session of this broker has, for [`ClusterSide::adopt`].
    pub fn new_session_id(&self) -> u64 {
        self.broker.next_session_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Takes in `session`, handed over by another node of a cluster, as an offline persistent
    /// session whose deliveries the store keeps; its subscriptions route to it from now on.
    /// Its record's `id` must come from [`ClusterSide::new_session_id`] (the store may have to know
    /// it first: its will or its end may be due at once). Until [`ClusterSide::settled`], a message
    /// from another node it holds or was offered is not queued for it again.
    pub fn adopt(&self, mut session: RecoveredSession, now: Instant) {
        let client_id = session.record.client_id.clone();
        let held: RemoteIds = session.held_remote.iter().cloned().collect();
        let shared = std::mem::take(&mut session.shared);
        self.broker.restore_session(session, self.broker.unix_secs(now), now);
        self.broker.with_persist(&client_id, |p| p.remote_ids = Some(Box::new(held)));
        self.broker.hand_off_shared(&client_id, shared, now);
    }

    /// `client_id`'s move to this broker has settled: messages from other nodes no longer come
    /// to it by two ways, and it stops remembering them (see [`ClusterSide::adopt`]).
    pub fn settled(&self, client_id: &str) {
        self.broker.with_persist(client_id, |p| p.remote_ids = None);
    }
}
