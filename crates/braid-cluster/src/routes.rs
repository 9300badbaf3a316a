//! Routes: which filters each node's sessions subscribe to. A node keeps its own in a Redis
//! set and logs each change to a stream; every node follows that stream and subscribes a
//! remote subscriber per other node (the [`NodeSink`]) to those filters in its router, so a
//! message published anywhere is sent once to each node with a matching subscription.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::redis::Conn;
use redis::Value;
use tokio::sync::mpsc;
use tracing::debug;

use braid_broker::broker::Broker;
use braid_broker::router::{Delivered, FilterChange, Forward, RemoteRef, RemoteSink};
use braid_proto::{QoS, SubscriptionOptions};

use crate::link::Link;
use crate::membership;
use crate::redis::bytes;
use crate::streams::{last_id, position, read_log};
use crate::{log_failure, Shared};

/// The remote subscriber that stands for another node: what is published here goes over the
/// link to that node (see [`crate::link`]), the publisher's acknowledgement waiting for the
/// node's; without links, and for what other nodes forwarded here (a relay, see [`relay`], or
/// a shared group's message passed on), to its inbox through the store's writer, the
/// acknowledgement waiting for Redis.
#[derive(Debug)]
pub(crate) struct NodeSink {
    shared: Arc<Shared>,
    node: String,
    relay: bool,
    link: Option<Arc<Link>>,
}

impl RemoteSink for NodeSink {
    fn relays(&self) -> bool {
        self.relay
    }

    /// Not while its node is being taken over (or was, and has not announced routes since):
    /// a shared group passes it over for a member that can take the message.
    fn can_accept(&self) -> bool {
        !self.shared.gone.lock().contains(&self.node)
    }

    fn deliver(&self, fwd: Forward, _now: Instant) -> Delivered {
        // A node's own `$SYS` values stay on it.
        if fwd.msg.origin == 0 && fwd.msg.topic.starts_with("$SYS/") {
            return Delivered::queued(0);
        }
        self.shared.forwarded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match &self.link {
            // Published here: over the link. What came from another node keeps the inbox's
            // path, whose reader waits for the store's ticket before acknowledging its entry.
            Some(link) if fwd.msg.remote_id.is_none() => {
                let after = match fwd.msg.qos {
                    QoS::AtMostOnce => return Delivered { wake: link.send(fwd), ..Delivered::queued(0) },
                    QoS::AtLeastOnce => 0,
                    QoS::ExactlyOnce => self.shared.store.written_by(fwd.msg.origin),
                };
                let (confirm, wake) = link.send_confirmed(fwd, after);
                Delivered { confirm: Some(confirm), wake, ..Delivered::queued(0) }
            }
            _ => Delivered::queued(self.shared.store.forward(
                &self.node,
                &self.shared.incarnation,
                &fwd,
                self.relay,
            )),
        }
    }
}

/// Publishes this node's routes: the set is started afresh (sessions re-adopted at start are
/// already in the router), then every change of the router's local filters follows. Called
/// again (rejoining), it starts over and the previous announcer ends.
pub(crate) fn announce(shared: &Arc<Shared>, broker: &Arc<Broker>) {
    let me = &shared.me;
    let (set, log) = (shared.keys.routes(me), shared.keys.route_log());
    let mut reset = redis::cmd("DEL");
    reset.arg(&set);
    let mut logged = redis::cmd("XADD");
    logged.arg(&log).arg("*").arg("n").arg(me).arg("o").arg("reset").arg("f").arg("");
    shared.store.submit_cmds(vec![reset, logged]);
    let (tx, mut rx) = mpsc::unbounded_channel();
    broker.remotes().watch_filters(tx);
    let shared = shared.clone();
    tokio::spawn(async move {
        while let Some((number, change)) = rx.recv().await {
            let (op, filter) = match &change {
                FilterChange::Added(f) => ("add", f),
                FilterChange::Removed(f) => ("remove", f),
            };
            let mut set_cmd = redis::cmd(if op == "add" { "SADD" } else { "SREM" });
            set_cmd.arg(&set).arg(filter.as_bytes());
            let mut log_cmd = redis::cmd("XADD");
            log_cmd.arg(&log).arg("MAXLEN").arg("~").arg(100_000).arg("*");
            log_cmd.arg("n").arg(&shared.me).arg("o").arg(op).arg("f").arg(filter.as_bytes());
            let ticket = shared.store.submit_cmds(vec![set_cmd, log_cmd]);
            shared.announced.send_replace((number, ticket));
        }
    });
}

/// Waits until every filter change the broker made so far is in the route log in Redis.
pub(crate) async fn flushed(shared: &Shared, broker: &Broker) {
    let target = broker.remotes().filter_changes();
    let mut announced = shared.announced.subscribe();
    let Ok(at) = announced.wait_for(|(count, _)| *count >= target).await.map(|a| a.1) else { return };
    shared.store.wait_durable(at).await;
}

/// Waits until every live node has applied the filter changes the broker made so far (at
/// most two seconds: a node that lags that much is not waited for).
pub(crate) async fn propagated(shared: Arc<Shared>, broker: Arc<Broker>) {
    let target = broker.remotes().filter_changes();
    let mut conn = shared.conn.clone();
    let wait = async {
        flushed(&shared, &broker).await;
        let Ok(last) = last_id(&mut conn, &shared.keys.route_log()).await else { return };
        let last = position(&last);
        loop {
            let Ok(live) = membership::live_nodes(&shared, &mut conn).await else { return };
            let others: Vec<&String> = live.iter().filter(|n| **n != shared.me).collect();
            if others.is_empty() {
                return;
            }
            let seen: Vec<Option<String>> = match redis::cmd("HMGET")
                .arg(shared.keys.route_seen())
                .arg(&others)
                .query_async(&mut conn)
                .await
            {
                Ok(seen) => seen,
                Err(_) => return,
            };
            if seen.iter().all(|s| s.as_deref().is_some_and(|s| position(s) >= last)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(2), wait).await.is_ok() {
        shared.confirmed.fetch_max(target, Ordering::Relaxed);
    }
}

/// The other nodes' routes, which this node holds only as its router's subscriptions of each
/// node's sink (no copy of its own: at 100,000 clients on six nodes, each holds half a million).
mod table {
    use super::*;

    pub(super) fn add(shared: &Arc<Shared>, broker: &Broker, node: &str, filter: &str) {
        if broker.remotes().subscribe_remote(&sink(shared, broker, node), filter, everything()).is_err() {
            debug!(node, filter, "cluster: an invalid filter in the routes is ignored");
        }
    }

    pub(super) fn remove(shared: &Arc<Shared>, broker: &Broker, node: &str, filter: &str) {
        broker.remotes().unsubscribe_remote(&sink(shared, broker, node), filter);
    }

    /// Drops every route of `node`.
    pub(super) fn reset(shared: &Arc<Shared>, broker: &Broker, node: &str) {
        keep_only(shared, broker, node, &HashSet::new());
    }

    /// Drops the routes of `node` that are not in `wanted`.
    fn keep_only(shared: &Arc<Shared>, broker: &Broker, node: &str, wanted: &HashSet<String>) {
        let sink = sink(shared, broker, node);
        for filter in broker.remotes().remote_filters(&sink) {
            if !wanted.contains(&*filter) {
                broker.remotes().unsubscribe_remote(&sink, &filter);
            }
        }
    }

    /// Makes the routes `wanted` (a fresh read of every other node's set).
    pub(super) fn sync(shared: &Arc<Shared>, broker: &Broker, wanted: HashMap<String, HashSet<String>>) {
        let known: Vec<String> =
            shared.sinks.lock().keys().filter(|(_, relay)| !relay).map(|(node, _)| node.clone()).collect();
        for node in known.iter().filter(|n| !wanted.contains_key(*n)) {
            reset(shared, broker, node);
        }
        for (node, filters) in wanted {
            keep_only(shared, broker, &node, &filters);
            for filter in &filters {
                add(shared, broker, &node, filter);
            }
        }
    }
}

/// Subscription options for a node's route: the message goes at its own QoS; the node that
/// receives it applies its sessions' options.
fn everything() -> SubscriptionOptions {
    SubscriptionOptions { qos: QoS::ExactlyOnce, ..SubscriptionOptions::default() }
}

/// The remote subscriber for `node`, made on first use.
fn sink(shared: &Arc<Shared>, broker: &Broker, node: &str) -> Arc<RemoteRef> {
    node_sink(shared, broker, node, false)
}

fn node_sink(shared: &Arc<Shared>, broker: &Broker, node: &str, relay: bool) -> Arc<RemoteRef> {
    let make = || {
        let link = shared.links.as_ref().filter(|_| !relay).map(|l| l.to(shared, broker, node));
        broker.remotes().remote_sink(Arc::new(NodeSink {
            shared: shared.clone(),
            node: node.to_string(),
            relay,
            link,
        }))
    };
    shared.sinks.lock().entry((node.to_string(), relay)).or_insert_with(make).clone()
}

/// The relay to `node`: what a session that moved there subscribed to, published here or
/// forwarded here by nodes that do not know of the move yet, is passed on to `node`, which
/// drops what it got twice.
pub(crate) fn relay_sink(shared: &Arc<Shared>, broker: &Broker, node: &str) -> Arc<RemoteRef> {
    node_sink(shared, broker, node, true)
}

/// `filters` now relay to `node` (see [`braid_broker::broker::ClusterSide::release`]): for one lease, by when every node
/// routes by the session's new place.
pub(crate) fn relaying(shared: &Arc<Shared>, broker: &Arc<Broker>, node: &str, filters: Vec<String>) {
    if filters.is_empty() {
        return;
    }
    let sink = relay_sink(shared, broker, node);
    {
        let mut relays = shared.relays.lock();
        for f in &filters {
            *relays.entry((node.to_string(), f.clone())).or_default() += 1;
        }
    }
    let (shared, broker, node) = (shared.clone(), broker.clone(), node.to_string());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(shared.config.lease_ms)).await;
        let mut relays = shared.relays.lock();
        for f in filters {
            let key = (node.clone(), f);
            let left = relays.get_mut(&key).map(|n| {
                *n -= 1;
                *n
            });
            if left == Some(0) {
                relays.remove(&key);
                broker.remotes().unsubscribe_remote(&sink, &key.1);
            }
        }
    });
}

/// Follows the route log; after any failure it reads every node's set afresh.
pub(crate) async fn follow(shared: Arc<Shared>, broker: Arc<Broker>) {
    let mut conn = match shared.redis.connect(Duration::from_secs(5)).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("cluster: cannot follow routes: {e}");
            return;
        }
    };
    let mut failing = false;
    loop {
        let from = match snapshot(&shared, &mut conn).await {
            Ok((from, wanted)) => {
                table::sync(&shared, &broker, wanted);
                from
            }
            Err(e) => {
                log_failure("reading routes", &mut failing, &e);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    _ = broker.shutdown().cancelled() => return,
                }
            }
        };
        failing = false;
        let mut from = from;
        let log = shared.keys.route_log();
        report_seen(&shared, &mut conn, &from).await;
        loop {
            let read = tokio::select! {
                r = read_log(&mut conn, &log, &from) => r,
                _ = broker.shutdown().cancelled() => return,
            };
            match read {
                Ok(entries) => {
                    let any = !entries.is_empty();
                    for (id, fields) in entries {
                        apply(&shared, &broker, &fields);
                        from = id;
                    }
                    if any {
                        report_seen(&shared, &mut conn, &from).await;
                    }
                }
                Err(e) => {
                    log_failure("following routes", &mut failing, &e);
                    break;
                }
            }
        }
    }
}

/// Tells the other nodes (waiting for a SUBACK) how far this node has applied the route log.
async fn report_seen(shared: &Shared, conn: &mut Conn, at: &str) {
    let _: redis::RedisResult<()> =
        redis::cmd("HSET").arg(shared.keys.route_seen()).arg(&shared.me).arg(at).query_async(conn).await;
}

fn apply(shared: &Arc<Shared>, broker: &Broker, fields: &[Value]) {
    let get = |name: &[u8]| {
        fields
            .chunks(2)
            .find(|c| c.first().and_then(bytes) == Some(name))
            .and_then(|c| c.get(1).and_then(bytes))
            .map(|b| String::from_utf8_lossy(b).into_owned())
    };
    let (Some(node), Some(op), Some(filter)) = (get(b"n"), get(b"o"), get(b"f")) else { return };
    if node == shared.me {
        return;
    }
    match op.as_str() {
        "add" => {
            // Announcing routes, the node is back.
            shared.gone.lock().remove(&node);
            table::add(shared, broker, &node, &filter)
        }
        "remove" => table::remove(shared, broker, &node, &filter),
        "reset" => table::reset(shared, broker, &node),
        _ => {}
    }
}

/// The log position, then every other node's route set (read after it, so that replaying the
/// log from there cannot miss a change).
async fn snapshot(
    shared: &Shared,
    conn: &mut Conn,
) -> redis::RedisResult<(String, HashMap<String, HashSet<String>>)> {
    let from = last_id(conn, &shared.keys.route_log()).await?;
    let nodes: Vec<String> = redis::cmd("HKEYS").arg(shared.keys.nodes()).query_async(conn).await?;
    let mut wanted = HashMap::new();
    for node in nodes.into_iter().filter(|n| *n != shared.me) {
        let filters: HashSet<String> =
            redis::cmd("SMEMBERS").arg(shared.keys.routes(&node)).query_async(conn).await?;
        wanted.insert(node, filters);
    }
    Ok((from, wanted))
}
