//! The broker core: the session registry, the router and the retained store, and the
//! operations connections call. It is sans-IO: it reads no clock (time comes in as `now`) and
//! spawns nothing; its timers (will delays, session expiry, the connection sweep) wait in one
//! heap that the runtime drives through [`Broker::poll_timeout`] and [`Broker::handle_timeout`].
//!
//! - `registry.rs`: CONNECT and takeover.
//! - `pubsub.rs`: SUBSCRIBE, UNSUBSCRIBE, PUBLISH.
//! - `lifecycle.rs`: disconnects, wills, session expiry, the timers.
//! - `recovery.rs`: what the store kept, reloaded at start.
//! - [`admin`]: what operators ask (sessions, kick, subscriptions, retained messages).
//! - [`live`]: the settings a reload changes without a restart.
//!
//! Lock order: the sessions map, then a session; the router before a session. A session lock
//! is never held while taking the sessions map or the router.

pub mod admin;
mod lifecycle;
pub mod live;
mod presence;
mod pubsub;
mod recovery;
mod registry;
pub mod remote;
mod rules;
mod timers;

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU16, AtomicU64};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use braid_proto::topic::{parse_shared, valid_topic_filter};
use braid_proto::ConnAck;
use braid_rules::Event;

use crate::auth::Security;
use crate::balance::Balancer;
use crate::config::{AutoSubscription, Config, SinkConfig};
use crate::control::{ConnControl, LivenessTable};
use crate::directory::Directory;
use crate::limits::MemoryAlarm;
use crate::metrics::Metrics;
use crate::report::Report;
use crate::retained::Retained;
use crate::rewrite::Rewrites;
use crate::router::{Confirm, Router};
use crate::rules::Rules;
use crate::session::{Restore, Session, Wakes};
use crate::store::{self, Store, StoreError, Ticket, UnixClock};
use crate::trace::Tracer;
use live::Live;

use timers::{Timer, Timers};

/// How often the connection sweep runs: a client is closed between 1.5 times its keep alive
/// and that plus this (and an idle one parked within this of `park_after_secs`).
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(500);

/// Everything the connections share.
#[derive(Debug)]
pub struct Broker {
    /// The configuration as the broker started with it; `[limits]` and `[session]` as they
    /// are now (a reload may change them) are in [`Broker::live`].
    config: Config,
    /// Counters for `$SYS`.
    metrics: Metrics,
    /// When the broker started: the origin of the connections' activity clocks.
    started: Instant,
    /// Cancelled at shutdown: stops the listeners, timers and `$SYS`.
    shutdown: CancellationToken,
    /// Authentication methods and ACL rules.
    security: Security,
    /// Raised while memory is above `limits.memory_high_watermark`.
    memory: MemoryAlarm,
    sessions: Mutex<HashSet<ById>>,
    /// Every connection's keep-alive and idleness clocks, which the connection sweep scans.
    liveness: LivenessTable<ConnControl>,
    router: RwLock<Router>,
    retained: RwLock<Retained>,
    /// The next session id, remote subscriber id and forward number (see
    /// [`Arrival::Returned`]): one counter.
    next_session_id: AtomicU64,
    /// `[limits]` and `[session]` as they are now.
    live: RwLock<Arc<Live>>,
    /// Where persistent sessions and retained messages are kept.
    store: Arc<dyn Store>,
    /// Notified when a connection answers a takeover or detaches (see [`crate::connection::handover`]).
    handovers: Notify,
    /// Will delays, session expiries and the connection sweep.
    timers: Mutex<Timers>,
    /// Notified when a timer earlier than every other was set: the runtime's wait for
    /// [`Broker::poll_timeout`] must be shortened.
    timers_changed: Notify,
    /// The Unix time at `started`: converts `now` to the wall-clock times the store keeps.
    clock: UnixClock,
    /// The cluster-wide session directory, when this broker is a node of a cluster.
    directory: OnceLock<Arc<dyn Directory>>,
    /// Drains and rebalances of the cluster's connections, when this broker is a node of one.
    balancer: OnceLock<Arc<dyn Balancer>>,
    /// The parts of the node that report to operators (bridges, the cluster membership).
    reports: RwLock<Vec<Arc<dyn Report>>>,
    /// Packet traces started by operators.
    tracer: Tracer,
    /// The rules in force, compiled (the configuration's, and those made through the API:
    /// see `crate::rule_book`), swapped whole when they change.
    rules: ArcSwap<Rules>,
    /// The sinks in force, for the workers that write to them.
    sinks: watch::Sender<Arc<[SinkConfig]>>,
    /// `rules`' events ([`Rules::events`]), read with one relaxed load on the publish and
    /// acknowledgement paths, before (and mostly instead of) loading the rules.
    rule_events: AtomicU16,
    /// Topic rewrite rules (`[[rewrite]]`).
    rewrites: Rewrites,
    /// What every client is subscribed to at connect (`[[auto_subscribe]]`), compiled.
    auto_subscriptions: Vec<AutoSubscription>,
}

impl Broker {
    /// The configuration as the broker started with it (`[limits]` and `[session]` as they are
    /// now: [`Broker::live`]).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The topic rewrite rules (`[[rewrite]]`), applied to what clients publish, subscribe to
    /// and unsubscribe from.
    pub fn rewrites(&self) -> &Rewrites {
        &self.rewrites
    }

    /// Counters for `$SYS` and `/metrics`.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// When the broker started: the origin of the connections' activity clocks.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Cancelled at shutdown: stops the listeners, timers, `$SYS`, bridges and the cluster.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Authentication methods and ACL rules.
    pub fn security(&self) -> &Security {
        &self.security
    }

    /// Raised while memory is above `limits.memory_high_watermark`.
    pub fn memory(&self) -> &MemoryAlarm {
        &self.memory
    }

    /// Where persistent sessions and retained messages are kept.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Notified when a timer earlier than every other was set: the runtime's wait for
    /// [`Broker::poll_timeout`] must be shortened.
    pub fn timers_changed(&self) -> &Notify {
        &self.timers_changed
    }

    /// Packet traces started by operators.
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    /// Notified when a connection answers a takeover or detaches (see
    /// [`crate::connection::handover`]).
    pub(crate) fn handovers(&self) -> &Notify {
        &self.handovers
    }
}

/// A session holding a publisher back.
#[derive(Debug)]
pub struct Holder {
    /// The session.
    pub session: Arc<Session>,
    /// Until when it paces the publisher (its delivery was QoS 0, see
    /// [`crate::session::Enqueued::Paced`]); None: it holds the publisher by backpressure, until
    /// `session.slow_consumer_timeout_secs` evicts it.
    pub paced_until: Option<Instant>,
}

impl Holder {
    /// Waits until it lets a publisher it held back at `since` go on: as its queue drains; for
    /// a paced one, at the end of its pacing (past it the subscriber is left behind); else, with
    /// `slow_consumer` set, once it has been evicted as a slow consumer past that. Cancel-safe.
    pub async fn released(&self, since: Instant, slow_consumer: Duration) {
        let s = &self.session;
        if let Some(until) = self.paced_until {
            let _ = tokio::time::timeout_at(until.into(), s.wait_for_space()).await;
        } else if slow_consumer.is_zero() {
            s.wait_for_space().await;
        } else if tokio::time::timeout_at((since + slow_consumer).into(), s.wait_for_space()).await.is_err() {
            s.evict_slow_consumer(slow_consumer.as_secs());
            s.wait_for_space().await;
        }
    }
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
    /// What the acknowledgement also waits for: remote subscribers' confirmations (see
    /// [`crate::router::Confirm`]).
    pub confirms: Vec<Confirm>,
    /// The subscribers' connections to wake, woken when this is dropped (after the router's
    /// lock is released) unless the caller takes them to wake later, with others.
    pub wakes: Wakes,
}

impl Published {
    /// Adds what `other` waits for and wakes to this.
    pub fn merge(&mut self, mut other: Published) {
        self.held.append(&mut other.held);
        self.ticket = self.ticket.max(other.ticket);
        self.confirms.append(&mut other.confirms);
        self.wakes.append(&mut other.wakes);
    }
}

/// How a message from another node came here, which decides who among the subscribers its
/// scope matches gets it (see [`crate::broker::remote::Remotes::publish_forwarded`]).
#[derive(Debug, Clone, Copy)]
pub enum Arrival<'a> {
    /// Sent here: this broker's sessions and relays.
    Sent,
    /// This broker published it and forwarded it as this number, and it came back (relayed by
    /// a node a session moved away from, or passed on by a node whose shared-group members had
    /// left): by a normal subscription only the sessions that came here since (the others had
    /// it then), one local member of each group in the scope (this broker picked another node
    /// for them), no remote subscriber.
    Returned(u64),
    /// Read from the inbox of a node this broker took over: by a normal subscription only the
    /// sessions adopted from that node, with these ids (the others here had their own copy);
    /// one member of each group in the scope (here, or on another node if none is left here).
    Drained(&'a HashSet<u64>),
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

/// What becomes of the will of a session this broker lets go of for another node of a
/// cluster (see [`ClusterSide::release`]). A will without delay of a connection it closes is sent
/// here in every case, as that connection ended without DISCONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WillOnRelease {
    /// Its client resumes it elsewhere: a delayed will is off, as on a takeover.
    Resumed,
    /// Its client starts clean elsewhere: the session ends, and a delayed will is sent now.
    Ended,
    /// No client claims it (this node is rejoining): a delayed will stays in its saved record,
    /// for whoever holds the session next.
    Kept,
}

impl Broker {
    /// A broker with `config` and the memory store; call [`crate::server::Server`] to put it
    /// on the network.
    pub fn new(config: Config) -> Arc<Broker> {
        Broker::with_store(config, Arc::new(store::memory::MemoryStore::new()))
    }

    /// A broker with the store `config` names, its persistent sessions, subscriptions and
    /// retained messages reloaded (their wills and expiries set as timers).
    pub fn open(config: Config) -> Result<Arc<Broker>, StoreError> {
        let clock = UnixClock::read();
        let store = store::open(&config.store, clock)?;
        Ok(Broker::open_on(config, store, clock))
    }

    /// A broker on `store`, which converts times by `clock` (the broker starts at its
    /// reading), with what it kept reloaded, as [`Broker::open`] does.
    pub fn open_on(config: Config, store: Arc<dyn Store>, clock: UnixClock) -> Arc<Broker> {
        let broker = Broker::with_clock(config, store, clock);
        broker.recover(broker.started);
        broker
    }

    /// A broker on `store`, started now: its one clock reading (as in [`Broker::open`]), the
    /// start from which `now` arguments are measured and converted to the Unix times the store
    /// keeps.
    pub fn with_store(config: Config, store: Arc<dyn Store>) -> Arc<Broker> {
        Broker::with_clock(config, store, UnixClock::read())
    }

    /// A broker on `store` that started at `clock`'s reading.
    fn with_clock(config: Config, store: Arc<dyn Store>, clock: UnixClock) -> Arc<Broker> {
        let started = clock.at();
        let router = Router::new(config.shared.strategy, config.mqtt.overlapping);
        let live = RwLock::new(Arc::new(Live::of(&config)));
        let node = config.cluster.enabled.then_some(config.cluster.node.as_str());
        let compiled_rules = Rules::compile(&config.rules, &config.sinks, node, clock.unix_ms(started));
        let (sinks, _) = watch::channel(Arc::from(config.sinks.as_slice()));
        let rule_events = AtomicU16::new(compiled_rules.events() | presence_events(&config));
        // A configuration that was loaded is checked already; one made in code is checked here.
        let rewrites = Rewrites::compile(&config.rewrite).unwrap_or_else(|e| {
            tracing::error!("topic rewrite is off: {e}");
            Rewrites::default()
        });
        let auto_subscriptions = (config.auto_subscribe.iter().enumerate())
            .filter_map(|(at, e)| e.compile(at).inspect_err(|e| tracing::error!("left out: {e}")).ok())
            .collect();
        let broker = Arc::new(Broker {
            security: Security::new(&config),
            memory: MemoryAlarm::new(config.limits.memory_high_watermark),
            config,
            metrics: Metrics::default(),
            started,
            clock,
            shutdown: CancellationToken::new(),
            sessions: Mutex::new(HashSet::new()),
            liveness: LivenessTable::default(),
            router: RwLock::new(router),
            retained: RwLock::new(Retained::default()),
            next_session_id: AtomicU64::new(1),
            live,
            handovers: Notify::new(),
            timers: Mutex::new(Timers::default()),
            timers_changed: Notify::new(),
            store,
            directory: OnceLock::new(),
            balancer: OnceLock::new(),
            reports: RwLock::new(Vec::new()),
            tracer: Tracer::default(),
            rules: ArcSwap::from_pointee(compiled_rules),
            sinks,
            rule_events,
            rewrites,
            auto_subscriptions,
        });
        broker.set_timer(started + SWEEP_INTERVAL, Timer::Sweep);
        broker
    }

    /// The cluster-wide session directory, if this broker is a node of a cluster.
    pub fn directory(&self) -> Option<&Arc<dyn Directory>> {
        self.directory.get()
    }

    /// Drains and rebalances of the cluster, if this broker is a node of one.
    pub fn balancer(&self) -> Option<&Arc<dyn Balancer>> {
        self.balancer.get()
    }

    /// Milliseconds from the start to `now`: the clock of connection activity.
    pub fn clock_ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.started).as_millis() as u64
    }

    /// `now` in seconds since the Unix epoch, as the store keeps times.
    fn unix_secs(&self, now: Instant) -> u64 {
        self.clock.unix_secs(now)
    }

    /// The broker's conversion between its instants and Unix time (read once, at the start),
    /// for what puts a time in a record: the store, and messages passed to other nodes.
    pub fn unix_clock(&self) -> &UnixClock {
        &self.clock
    }

    /// `[limits]` and `[session]` as they are now (`Broker::config` keeps them as they were at
    /// the start).
    pub fn live(&self) -> Arc<Live> {
        self.live.read().clone()
    }

    /// Puts `config`'s `[limits]` and `[session]` in force: for connections from now on (and,
    /// for the connection limits and the memory watermark, at once).
    pub fn apply_live(&self, config: &Config) {
        self.memory.set_watermark(config.limits.memory_high_watermark);
        *self.live.write() = Arc::new(Live::of(config));
    }

    /// Connections parked now (see [`crate::transport::tcp::park`]).
    pub fn parked(&self) -> usize {
        Metrics::get(&self.metrics.clients_parked) as usize
    }

    /// Numbers for `$SYS`: (sessions known, subscriptions, retained messages).
    pub fn counts(&self) -> (usize, usize, usize) {
        let sessions = self.sessions.lock().len();
        let subscriptions = self.router.read().len();
        (sessions, subscriptions, self.retained.read().len())
    }
}

/// `filter` split into the filter to match and the shared group, or None if invalid.
fn split_filter(filter: &str) -> Option<(&str, Option<&str>)> {
    match parse_shared(filter) {
        Ok(Some(shared)) => Some((shared.filter, Some(shared.group))),
        Ok(None) if valid_topic_filter(filter) => Some((filter, None)),
        _ => None,
    }
}

/// The client events presence (`sys.presence`) takes under `config`, as
/// [`Broker::rules_take`] reads them: the paths that raise them then do.
fn presence_events(config: &Config) -> u16 {
    match config.sys.presence {
        true => 1 << Event::ClientConnected as u8 | 1 << Event::ClientDisconnected as u8,
        false => 0,
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

impl Broker {
    /// What a cluster node asks of this broker (see [`ClusterSide`]).
    pub fn cluster(&self) -> ClusterSide<'_> {
        ClusterSide { broker: self }
    }
}

/// The seam between the broker and the cluster node it serves: the session directory and the
/// balancer it installs, sessions it adopts from other nodes or releases to them, and the
/// connections it sends away. (Remote subscribers, forwarded messages and the filter watcher
/// are [`remote::Remotes`], which bridges share.) Each call takes the registry's lock for one lookup
/// or copy, and a session's or the router's lock for its own change, never two sessions' at
/// once; none does I/O or waits, so the node calls them from its tasks (the store ticket a
/// release returns is what the node waits for, outside).
#[derive(Debug, Clone, Copy)]
pub struct ClusterSide<'a> {
    broker: &'a Broker,
}

impl ClusterSide<'_> {
    /// Makes CONNECTs claim their client id in `directory` first (a cluster node); once.
    pub fn set_directory(&self, directory: Arc<dyn Directory>) {
        let _ = self.broker.directory.set(directory);
    }

    /// Makes this broker's cluster drain and rebalance through `balancer` (set once, at the
    /// cluster's start).
    pub fn set_balancer(&self, balancer: Arc<dyn Balancer>) {
        let _ = self.broker.balancer.set(balancer);
    }
}
