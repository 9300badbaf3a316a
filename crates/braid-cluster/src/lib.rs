//! Braid's cluster: many broker nodes serving as one, on Redis (see `docs/cluster.md`).
//!
//! What lives in Redis: each node's lease and routes (the filters its sessions subscribe to,
//! with a change log every node follows), each node's inbox stream (messages other nodes
//! route to its sessions, read through a consumer group and acknowledged once delivered),
//! persistent sessions with their queued deliveries under an ownership epoch, and retained
//! messages with their change log. What stays on a node: its connections, the sessions it
//! holds (a write-through copy) and a cache of the other nodes' routes, which it hands to its
//! router as remote subscribers.
//!
//! - [`Node::connect`] reaches Redis and takes the node's lease; [`Node::store`] is the store
//!   the broker is built on; [`Node::start`] joins the broker to the cluster.
//!
//! The rooms, from the top: `directory` (one session per client id: claims, handovers,
//! fencing), `reaper` (taking over a gone node), `heartbeat` (the lease renewal loop),
//! `balance` (moving clients between nodes: `drain`, `rebalance`),
//! `sessions` (adopting sessions from Redis), `routes` (this node's routes out, the others'
//! in, relays), `inbox` (messages and handover requests from other nodes), `retained`,
//! `membership` (leases, live nodes), `store` (the Redis store and its writer), `scripts`
//! (the Lua scripts run in Redis), `streams`, `wire` (inbox entries), `keys`, `redis`
//! (connections).

mod balance;
mod directory;
mod drain;
mod heartbeat;
mod inbox;
mod keys;
mod link;
mod membership;
mod reaper;
mod rebalance;
mod redis;
mod report;
mod retained;
mod routes;
mod scripts;
mod sessions;
mod store;
mod streams;
mod wire;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use braid_broker::broker::Broker;
use braid_broker::config::ClusterConfig;
use braid_broker::router::RemoteRef;
use braid_broker::store::{RecordError, Store, UnixClock};
use braid_proto::ByteString;

use crate::redis::Conn;
use keys::Keys;
use store::{RedisStore, Writer};

/// A cluster that cannot be joined.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A `[cluster]` setting is unusable.
    #[error("{0}")]
    Config(String),
    /// Redis refused or could not be reached.
    #[error("cluster.redis: {what}{}{source}", if .what.is_empty() { "" } else { ": " })]
    Redis {
        /// What was being done, or which Redis (its URLs): empty if nothing to add.
        what: String,
        /// Redis's error.
        #[source]
        source: ::redis::RedisError,
    },
    /// A session's record in Redis does not read back.
    #[error("cluster.redis: the record of session {client_id:?}: {source}")]
    Record {
        /// The session's client id.
        client_id: String,
        /// What is wrong with the record.
        #[source]
        source: RecordError,
    },
    /// Another running node has this node's name.
    #[error("cluster.node: {0}")]
    NameInUse(String),
}

impl ClusterError {
    /// A Redis error while doing `what` (or with `what` the Redis it is from).
    fn redis(what: impl Into<String>) -> impl FnOnce(::redis::RedisError) -> ClusterError {
        let what = what.into();
        move |source| ClusterError::Redis { what, source }
    }
}

/// A Redis error with nothing to add.
impl From<::redis::RedisError> for ClusterError {
    fn from(source: ::redis::RedisError) -> ClusterError {
        ClusterError::Redis { what: String::new(), source }
    }
}

/// A node that has reached Redis and holds its lease, not yet serving.
#[derive(Debug)]
pub struct Node {
    shared: Arc<Shared>,
    writer: Writer,
    retained_from: String,
}

/// What the node's tasks share.
#[derive(Debug)]
struct Shared {
    config: ClusterConfig,
    me: String,
    keys: Keys,
    redis: redis::Redis,
    conn: Conn,
    store: Arc<RedisStore>,
    /// `node@start_ms`: this process among the node's lives.
    incarnation: String,
    /// Messages already received, by sender.
    seen: Mutex<inbox::Seen>,
    /// False while this node may not serve (cut off from Redis past its lease).
    serving: AtomicBool,
    /// A remote subscriber for each other node: by its routes, and as a relay.
    sinks: Mutex<HashMap<(String, bool), Arc<RemoteRef>>>,
    /// Nodes taken over here whose routes have not come back (see [`routes::NodeSink`]).
    gone: Mutex<HashSet<String>>,
    /// How many of the broker's filter changes were written to the route log, and the store
    /// ticket of the last one.
    announced: tokio::sync::watch::Sender<(u64, u64)>,
    /// How many of the broker's filter changes every node is known to have applied.
    confirmed: std::sync::atomic::AtomicU64,
    /// Claims under way here: this node's inbox routes nothing meanwhile.
    claiming: tokio::sync::watch::Sender<usize>,
    /// Relays to the node each session this node let go of moved to, with how many sessions
    /// of the same filter still relay (see [`routes::relay`]).
    relays: Mutex<HashMap<(String, String), usize>>,
    /// Takeovers of gone nodes draining their inbox now: handovers wait for none to be left.
    reaping: tokio::sync::watch::Sender<usize>,
    /// The position in the retained log this node has applied.
    retained_applied: tokio::sync::watch::Sender<(u64, u64)>,
    /// Handovers this node waits for, by client id.
    handovers: Mutex<HashMap<ByteString, oneshot::Sender<()>>>,
    /// The live nodes, as the heartbeat last read them.
    live: Mutex<Vec<String>>,
    /// Messages handed to other nodes (through their inboxes), and taken from this node's
    /// inbox and routed here.
    forwarded: std::sync::atomic::AtomicU64,
    received: std::sync::atomic::AtomicU64,
    /// Messages from other nodes dropped as received before (by their two ways, or read twice).
    duplicates: std::sync::atomic::AtomicU64,
    /// The links to the other nodes (None with `cluster.listen` empty: everything through
    /// Redis).
    links: Option<Arc<link::Links>>,
    /// This node's part in drains and rebalances.
    balance: balance::Balance,
}

impl Node {
    /// Reaches Redis (checking the URL and credentials), takes this node's lease (waiting
    /// out the lease of a previous process of the same name that died) and reads the
    /// retained messages.
    pub async fn connect(config: &ClusterConfig) -> Result<Node, ClusterError> {
        let redis = redis::Redis::new(&config.redis, &config.ca_file)?;
        let timeout = Duration::from_millis(config.lease_ms / 2).max(Duration::from_secs(1));
        let mut conn = redis.connect(timeout).await?;
        ::redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(ClusterError::redis(redis.display()))?;
        let keys = Keys::new(&config.key_prefix);
        // The node's reading of the wall clock: its incarnation, and the Unix times of the
        // records it writes and reads.
        let clock = UnixClock::read();
        let start_ms = clock.unix_ms(clock.at());
        let incarnation = format!("{}@{start_ms}", config.node);
        let links = link::Links::bind(config)?.map(Arc::new);
        if links.is_some() {
            membership::check_secret(&mut conn, &keys, config).await?;
        }
        membership::take_lease(&mut conn, &keys, config, &incarnation).await?;
        let (retained, retained_from) = retained::load(&mut conn, &keys, &clock).await?;
        info!(node = %config.node, redis = %redis.display(), retained = retained.len(), "joined the cluster's Redis");
        let (store, writer) = RedisStore::new(keys.clone(), retained, config.batch, clock);
        let shared = Arc::new(Shared {
            config: config.clone(),
            me: config.node.clone(),
            keys,
            redis,
            conn,
            store,
            incarnation,
            seen: Mutex::new(inbox::Seen::default()),
            serving: AtomicBool::new(true),
            sinks: Mutex::new(HashMap::new()),
            gone: Mutex::new(HashSet::new()),
            handovers: Mutex::new(HashMap::new()),
            reaping: tokio::sync::watch::Sender::new(0),
            claiming: tokio::sync::watch::Sender::new(0),
            announced: tokio::sync::watch::Sender::new((0, 0)),
            confirmed: std::sync::atomic::AtomicU64::new(0),
            relays: Mutex::new(HashMap::new()),
            retained_applied: tokio::sync::watch::Sender::new((0, 0)),
            live: Mutex::new(Vec::new()),
            forwarded: std::sync::atomic::AtomicU64::new(0),
            received: std::sync::atomic::AtomicU64::new(0),
            duplicates: std::sync::atomic::AtomicU64::new(0),
            links,
            balance: balance::Balance::default(),
        });
        Ok(Node { shared, writer, retained_from })
    }

    /// The store to build the broker on: sessions and retained messages in Redis.
    pub fn store(&self) -> Arc<dyn Store> {
        self.shared.store.clone()
    }

    /// The node's one reading of the clocks, by which its store converts times: the broker
    /// built on [`Node::store`] starts at it too.
    pub fn clock(&self) -> UnixClock {
        *self.shared.store.clock()
    }

    /// Joins `broker` (built on [`Node::store`]) to the cluster: CONNECTs claim their client
    /// id cluster-wide, subscriptions are announced to the other nodes and theirs routed to,
    /// messages for this node's sessions are read from its inbox, retained messages follow
    /// the cluster's. Its tasks run until the broker shuts down; then call [`Member::leave`].
    pub async fn start(self, broker: &Arc<Broker>) -> Result<Member, ClusterError> {
        let shared = self.shared;
        let (fenced_tx, fenced_rx) = mpsc::unbounded_channel();
        tokio::spawn(self.writer.run(shared.conn.clone(), fenced_tx));
        sessions::adopt_owned(&shared, broker).await?;
        broker.cluster().set_directory(Arc::new(directory::Directory::new(shared.clone(), broker)));
        tokio::spawn(directory::release_fenced(shared.clone(), broker.clone(), fenced_rx));
        routes::announce(&shared, broker);
        tokio::spawn(routes::follow(shared.clone(), broker.clone()));
        let on_release: inbox::OnRelease = {
            let (shared, broker) = (shared.clone(), broker.clone());
            Arc::new(move |client_id, to, clean| {
                tokio::spawn(directory::hand_over(shared.clone(), broker.clone(), client_id, to, clean));
            })
        };
        tokio::spawn(inbox::run(shared.clone(), broker.clone(), on_release).await?);
        if let Some(links) = &shared.links {
            info!(listen = %shared.config.listen, advertise = %links.advertise, "cluster: links listening");
            tokio::spawn(link::accept(shared.clone(), broker.clone(), links.clone()));
        } else {
            warn!("cluster: cluster.listen is empty: no links between nodes, every message between them goes through Redis");
        }
        tokio::spawn(retained::follow(shared.clone(), broker.clone(), self.retained_from));
        tokio::spawn(heartbeat::run(shared.clone(), broker.clone()));
        balance::start(&shared, broker);
        broker.add_report(Arc::new(report::Nodes(shared.clone())));
        tokio::spawn(reaper::run(shared.clone(), broker.clone()));
        Ok(Member { shared })
    }
}

/// A node serving in the cluster.
#[derive(Debug)]
pub struct Member {
    shared: Arc<Shared>,
}

impl Member {
    /// Gives up the node's lease once the broker has stopped and its store has written
    /// everything: a client that reconnects elsewhere then takes its session over at once.
    pub async fn leave(self) {
        balance::leave(&self.shared).await;
        membership::leave(&self.shared).await;
    }
}

impl Shared {
    /// True while this node may serve clients.
    fn serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }
}

/// Logs a Redis error once per failing stretch: `failing` is the stretch's state.
fn log_failure(what: &str, failing: &mut bool, e: &dyn std::fmt::Display) {
    if !*failing {
        warn!("cluster: {what}: {e}; retrying");
        *failing = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_error_keeps_its_source_and_says_what_was_done() {
        let refused =
            || ::redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let shown = refused().to_string();
        let plain = ClusterError::from(refused());
        assert_eq!(plain.to_string(), format!("cluster.redis: {shown}"));
        let at = ClusterError::redis("redis://127.0.0.1:6379")(refused());
        assert_eq!(at.to_string(), format!("cluster.redis: redis://127.0.0.1:6379: {shown}"));
        let source = std::error::Error::source(&at).and_then(|e| e.downcast_ref::<::redis::RedisError>());
        assert!(source.is_some_and(|e| e.kind() == ::redis::ErrorKind::Io), "{at:?}");
    }
}
