//! What the cluster and the bridges call: subscribers that are not sessions of this broker
//! (other nodes, a Kafka bridge), the filters they follow, and messages other nodes route here.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use braid_proto::{ReasonCode, SubscriptionOptions};

use super::{split_filter, Arrival, Broker, Published};
use crate::message::Message;
use crate::router::{FilterChange, RemoteRef, RemoteSink, Scope, SubEntry};

impl Broker {
    /// What the cluster and the bridges ask of this broker.
    pub fn remotes(&self) -> Remotes<'_> {
        Remotes { broker: self }
    }
}

/// The seam between the broker and its remote subscribers (other nodes of a cluster, bridges).
///
/// Locks: subscribing, unsubscribing and watching take the router's write lock; routing a
/// forwarded message takes its read lock and calls each matching [`RemoteSink::deliver`]
/// under it, as a local publish does. So a sink's `deliver` must not block, do I/O, spawn, or
/// call back into the broker: it queues (an outbox, a link's channel) and returns. The watcher
/// of [`Remotes::watch_filters`] is sent each change under the router's write lock: it must
/// be an unbounded channel's sender.
#[derive(Debug, Clone, Copy)]
pub struct Remotes<'a> {
    broker: &'a Broker,
}

impl Remotes<'_> {
    /// Gives `sink`, a subscriber that is not a session of this broker (another node, a
    /// bridge), an id among sessions, to subscribe it with [`Remotes::subscribe_remote`].
    pub fn remote_sink(&self, sink: Arc<dyn RemoteSink>) -> Arc<RemoteRef> {
        Arc::new(RemoteRef { id: self.broker.next_session_id.fetch_add(1, Ordering::Relaxed), sink })
    }

    /// Subscribes `remote` to `filter` (a `$share/{group}/` filter makes it a group member)
    /// with `options`: from now on, matching messages are handed to it. True if it is new;
    /// `Err(0x8F)` for an invalid filter.
    pub fn subscribe_remote(
        &self,
        remote: &Arc<RemoteRef>,
        filter: &str,
        options: SubscriptionOptions,
    ) -> Result<bool, ReasonCode> {
        let (inner, group) = split_filter(filter).ok_or(ReasonCode::TopicFilterInvalid)?;
        Ok(self.broker.router.write().subscribe(inner, group, SubEntry::remote(remote.clone(), options)))
    }

    /// From now on, sends `to` each filter that gains its first or loses its last subscription
    /// by a session of this broker or a relay, with the change's number (see
    /// [`Remotes::filter_changes`]); first an `Added` for each filter subscribed now. A watcher
    /// set before is replaced.
    pub fn watch_filters(&self, to: tokio::sync::mpsc::UnboundedSender<(u64, FilterChange)>) {
        self.broker.router.write().watch(to);
    }

    /// How many filter changes were sent to the watcher so far (see [`Remotes::watch_filters`]).
    pub fn filter_changes(&self) -> u64 {
        self.broker.router.read().changes()
    }

    /// The filters `remote` is subscribed to (a walk over every subscription: not for the
    /// publish path).
    pub fn remote_filters(&self, remote: &RemoteRef) -> Vec<Box<str>> {
        self.broker.router.read().filters_of(remote.id)
    }

    /// Removes `remote`'s subscription to `filter`; true if it existed.
    pub fn unsubscribe_remote(&self, remote: &RemoteRef, filter: &str) -> bool {
        split_filter(filter)
            .is_some_and(|(inner, group)| self.broker.router.write().unsubscribe(inner, group, remote.id))
    }
    /// Routes `msg`, sent here at `now` by another node, within `scope` (see
    /// [`crate::router::Router::route_forwarded`]) to the subscribers `arrival` leaves; says
    /// what its acknowledgement to that node must wait for.
    pub fn publish_forwarded(
        &self,
        msg: Arc<Message>,
        scope: &Scope,
        arrival: Arrival<'_>,
        now: Instant,
    ) -> Published {
        let mut out = Published::default();
        let router = self.broker.router.read();
        let mut targets = Vec::new();
        router.route_forwarded(&msg, scope, matches!(arrival, Arrival::Drained(_)), &mut targets);
        match arrival {
            Arrival::Sent => {}
            // Session ids and forward numbers come from one counter: a later session has a higher id.
            Arrival::Returned(number) => {
                targets.retain(|t| t.to.session().is_some_and(|s| t.group.is_some() || s.id > number))
            }
            Arrival::Drained(adopted) => targets
                .retain(|t| t.group.is_some() || t.to.session().is_some_and(|s| adopted.contains(&s.id))),
        }
        self.broker.forward_to_remotes(&msg, &targets, &mut out, now);
        self.broker.deliver_to_sessions(&msg, &targets, &mut out, now);
        out
    }

    /// Sets or clears (empty payload) a retained message another node stored, learned of at
    /// `now`: in the index only, nothing routed or written.
    pub fn apply_retained(&self, msg: Arc<Message>, now: Instant) {
        self.broker.retained.write().set(msg, now);
    }
}
