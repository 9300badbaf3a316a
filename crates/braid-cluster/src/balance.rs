//! Moving clients between nodes, the node's part (see `docs/cluster.md`, "Drain and
//! rebalance"; the requests are in [`crate::drain`] and [`crate::rebalance`]). Every quarter
//! lease, as its heartbeat, the node writes its connection count to `load` (and how its drain
//! goes to `drainstate`) and reads the cluster's: every node's count and Server Reference
//! (`servers`, written with the lease), the drains asked and how they go, the rebalance under
//! way. Between reads, every [`STEP`], it sends away what its drain or its share of a
//! rebalance asks, paced at the request's rate ([`Pacer`]): each connection closed with 0x9C
//! and the Server Reference of the node that serves with the fewest connections, counted as its
//! last count plus what this node sent it since its last two reads, so that the sends of one
//! read spread over the nodes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use tracing::info;

use braid_broker::balance::{Answer, Balancer};
use braid_broker::broker::Broker;
use braid_broker::message::Message;
use braid_broker::metrics::Metrics;
use braid_broker::report::Sample;
use braid_broker::transport::Transport;
use braid_proto::{ByteString, ReasonCode};

use crate::drain::{self, Progress};
use crate::rebalance::{self, Request};
use crate::redis::{bytes, Conn};
use crate::store::pairs;
use crate::Shared;

/// How often a node with connections to send away sends the next ones.
const STEP: Duration = Duration::from_millis(100);

/// At most this long's worth of the rate goes at once (when a step came late).
const BURST: Duration = Duration::from_millis(250);

/// The node's part in drains and rebalances.
#[derive(Debug, Default)]
pub(crate) struct Balance {
    /// The address the other nodes send this node's clients to.
    reference: OnceLock<String>,
    /// True while this node drains: CONNECTs are refused (0x9C).
    draining: AtomicBool,
    state: Mutex<State>,
    /// Wakes the node's task: a request was made here.
    nudge: Notify,
    /// Connections sent away by drains, and by rebalances.
    drained: AtomicU64,
    rebalanced: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// The cluster as last read.
    view: View,
    /// This node's connections, as last counted.
    connections: u64,
    /// This node's drain, while it drains.
    drain: Option<Progress>,
    /// The rebalance under way, and how many connections this node still sends away for it.
    rebalance: Option<(Request, u64)>,
    /// Connections sent to each node since the last read, and in the interval before it.
    recent: [HashMap<String, u64>; 2],
    pacer: Pacer,
    /// The connections to send away next.
    queue: Vec<ByteString>,
}

/// The cluster as a node read it.
#[derive(Debug, Default)]
struct View {
    /// Node -> its connections.
    loads: HashMap<String, u64>,
    /// Node -> its Server Reference.
    servers: HashMap<String, String>,
    /// Node -> the rate of the drain asked of it.
    drains: HashMap<String, u32>,
    /// Node -> how its drain goes.
    progress: HashMap<String, Progress>,
    rebalance: Option<Request>,
}

impl View {
    /// The replies of HGETALL `load`, `servers`, `drain`, `drainstate` and GET `rebalance`.
    fn read(replies: &[redis::Value]) -> View {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let count = |v: &[u8]| std::str::from_utf8(v).ok()?.parse().ok();
        View {
            loads: pairs(replies.first()).filter_map(|(n, v)| Some((text(n), count(v)?))).collect(),
            servers: pairs(replies.get(1)).map(|(n, v)| (text(n), text(v))).collect(),
            drains: pairs(replies.get(2))
                .filter_map(|(n, v)| Some((text(n), drain::parse_request(v)?)))
                .collect(),
            progress: pairs(replies.get(3))
                .filter_map(|(n, v)| Some((text(n), Progress::parse(v)?)))
                .collect(),
            rebalance: replies.get(4).and_then(bytes).and_then(Request::parse),
        }
    }
}

/// A node clients may be sent to.
#[derive(Debug)]
struct Target {
    node: String,
    reference: ByteString,
    /// Its connections as counted here.
    load: u64,
}

/// The least loaded of `targets` (the first by name among equals), counted as one more.
fn pick(targets: &mut [Target]) -> Option<&Target> {
    let least = targets.iter_mut().min_by(|a, b| (a.load, &a.node).cmp(&(b.load, &b.node)))?;
    least.load += 1;
    Some(least)
}

impl State {
    /// `node`'s connections: its last count, plus what this node sent it since the read before
    /// last.
    fn estimate(&self, node: &str) -> u64 {
        let sent: u64 = self.recent.iter().filter_map(|r| r.get(node)).sum();
        self.view.loads.get(node).copied().unwrap_or(0) + sent
    }

    /// The nodes `me` may send clients to: live, not draining, with a Server Reference.
    fn targets(&self, live: &[String], me: &str) -> Vec<Target> {
        live.iter()
            .filter(|n| *n != me && !self.view.drains.contains_key(*n))
            .filter_map(|n| {
                let reference = ByteString::from(self.view.servers.get(n)?.as_str());
                Some(Target { node: n.clone(), reference, load: self.estimate(n) })
            })
            .collect()
    }

    /// `node` was sent a client.
    fn sent(&mut self, node: &str) {
        *self.recent[0].entry(node.to_string()).or_default() += 1;
    }
}

/// What a read changed, for the log and `$SYS`.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// This node began to drain.
    Draining { rate: u32, connections: u64 },
    /// This node has no connection left.
    Drained { moved: u64 },
    /// This node's drain was cancelled.
    Cancelled,
    /// This node's share of a new rebalance.
    Sharing { excess: u64, connections: u64 },
}

impl Event {
    /// Logs it and, for a change of this node's drain, publishes its state on
    /// `$SYS/cluster/drain` (retained) at `now`.
    fn report(&self, broker: &Broker, now: Instant) {
        let state = match *self {
            Event::Draining { rate, connections } => {
                info!(
                    rate,
                    connections, "cluster: draining: refusing connections and sending clients to other nodes"
                );
                "draining"
            }
            Event::Drained { moved } => {
                info!(
                    moved,
                    "cluster: drained: no client left; refusing connections until stopped or cancelled"
                );
                "drained"
            }
            Event::Cancelled => {
                info!("cluster: drain cancelled: accepting connections again");
                "up"
            }
            Event::Sharing { excess, connections } => {
                info!(
                    excess,
                    connections,
                    "cluster: rebalance: sending this node's excess connections to the least loaded nodes"
                );
                return;
            }
        };
        let message = Message::internal("$SYS/cluster/drain".into(), state.into(), true);
        let _ = broker.publish(message, now);
    }
}

impl Balance {
    /// Sets the address the other nodes send this node's clients to (once, at start).
    fn set_reference(&self, reference: String) {
        let _ = self.reference.set(reference);
    }

    /// That address, once set.
    pub(crate) fn reference(&self) -> Option<&str> {
        self.reference.get().map(String::as_str)
    }

    /// True while this node drains: it refuses CONNECTs with 0x9C.
    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Has the node's task read the cluster now (a request was made on this node).
    pub(crate) fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// Where a client `me` refuses should go: the Server Reference of the least loaded live
    /// node that is not draining, counted as one more.
    pub(crate) fn suggest(&self, live: &[String], me: &str) -> Option<ByteString> {
        let mut st = self.state.lock();
        let mut targets = st.targets(live, me);
        let target = pick(&mut targets)?;
        st.sent(&target.node);
        Some(target.reference.clone())
    }

    /// What `/api/v1/nodes` shows of `node` (`this`: this node): its state while it drains
    /// (`draining`, then `drained`), and its `connections`, `draining` and `drain` fields.
    pub(crate) fn describe(&self, node: &str, this: bool) -> (Option<&'static str>, Map<String, Value>) {
        let st = self.state.lock();
        let connections = if this { Some(st.connections) } else { st.view.loads.get(node).copied() };
        let progress = match (this, st.view.drains.get(node)) {
            (true, _) => st.drain.map(|p| Progress { remaining: st.connections, ..p }),
            (false, Some(&rate)) => Some(
                st.view.progress.get(node).copied().unwrap_or(Progress::new(rate, connections.unwrap_or(0))),
            ),
            (false, None) => None,
        };
        let mut fields = Map::new();
        fields.insert("connections".into(), json!(connections));
        fields.insert("draining".into(), json!(progress.is_some()));
        fields.insert("drain".into(), progress.map_or(Value::Null, Progress::to_json));
        (progress.map(|p| p.state()), fields)
    }

    /// Its metrics.
    pub(crate) fn samples(&self, out: &mut Vec<Sample>) {
        out.push(Sample::gauge(
            "braid_cluster_draining",
            "1 while this node drains (drained included): it refuses connections, sends its clients away.",
            f64::from(u8::from(self.draining())),
        ));
        out.push(Sample::counter(
            "braid_cluster_drained_connections_total",
            "Connections this node sent to other nodes while draining.",
            self.drained.load(Ordering::Relaxed),
        ));
        out.push(Sample::counter(
            "braid_cluster_rebalanced_connections_total",
            "Connections this node sent to other nodes to even the cluster's connections out.",
            self.rebalanced.load(Ordering::Relaxed),
        ));
    }

    /// Takes in a read of the cluster, `count` being this node's connections: starts, follows
    /// or ends its drain and sets its share of the rebalance under way. Returns what changed,
    /// and the rebalance to end if the loads are even.
    fn apply(&self, view: View, count: u64, live: &[String], me: &str) -> (Vec<Event>, Option<Request>) {
        let mut st = self.state.lock();
        st.view = view;
        st.connections = count;
        st.recent[1] = std::mem::take(&mut st.recent[0]);
        let mut events = Vec::new();
        let before = st.drain.map(|p| p.state());
        st.drain = match (st.view.drains.get(me).copied(), st.drain) {
            (Some(rate), Some(p)) => Some(Progress { rate, remaining: count, ..p }),
            (Some(rate), None) => {
                events.push(Event::Draining { rate, connections: count });
                Some(Progress::new(rate, count))
            }
            (None, Some(_)) => {
                events.push(Event::Cancelled);
                None
            }
            (None, None) => None,
        };
        if let Some(p) = st.drain.filter(|p| p.state() == "drained" && before != Some("drained")) {
            events.push(Event::Drained { moved: p.moved });
        }
        self.draining.store(st.drain.is_some(), Ordering::Relaxed);

        let mut done = None;
        let previous = st.rebalance.take();
        st.rebalance = match st.view.rebalance.clone() {
            Some(request) if st.drain.is_none() => {
                let serving: Vec<&String> =
                    live.iter().filter(|n| !st.view.drains.contains_key(*n)).collect();
                let own = |n: &str, other: u64| if n == me { count } else { other };
                // What this node sends is set when it first reads the request, from its own count
                // and the others' settled ones; later reads would count what it sent twice.
                let share = match previous {
                    Some((seen, left)) if seen.id == request.id => left,
                    _ if request.senders.iter().any(|n| n == me) && serving.iter().any(|n| *n == me) => {
                        let estimated: Vec<u64> = serving.iter().map(|n| own(n, st.estimate(n))).collect();
                        let excess = rebalance::excess(count, &estimated);
                        if excess > 0 {
                            events.push(Event::Sharing { excess, connections: count });
                        }
                        excess
                    }
                    _ => 0,
                };
                let counted: Vec<u64> =
                    serving.iter().map(|n| own(n, st.view.loads.get(*n).copied().unwrap_or(0))).collect();
                let quiet = st.recent.iter().all(HashMap::is_empty);
                if share == 0 && quiet && rebalance::balanced(&counted) {
                    done = Some(request.clone());
                }
                Some((request, share))
            }
            _ => None,
        };
        (events, done)
    }
}

/// Joins `broker` to the cluster's drains and rebalances: this node's Server Reference (which
/// the lease renewal writes), its task, and the requests of the admin API.
pub(crate) fn start(shared: &Arc<Shared>, broker: &Arc<Broker>) {
    let config = &shared.config;
    let advertise = shared.links.as_ref().map(|l| l.advertise.as_str());
    let advertise = advertise.or(Some(config.advertise.as_str()).filter(|a| !a.is_empty()));
    match server_reference(&config.server_reference, broker.config().listeners.tcp, advertise) {
        Some(reference) => shared.balance.set_reference(reference),
        None => tracing::warn!(
            "cluster: no address to send clients to this node (the TCP listener's port is 0, or no host \
             is known): set cluster.server_reference"
        ),
    }
    tokio::spawn(run(shared.clone(), broker.clone()));
    broker.cluster().set_balancer(Arc::new(Requests(shared.clone())));
}

/// The node's task: reads the cluster every quarter lease (at once when nudged) and sends away,
/// every [`STEP`], what its drain or rebalance share allows, until the broker shuts down.
async fn run(shared: Arc<Shared>, broker: Arc<Broker>) {
    let every = Duration::from_millis(shared.config.lease_ms / 4);
    let mut conn = shared.conn.clone();
    let mut failing = false;
    // A drain asked of a previous process of this node ended with it.
    if let Err(e) = conn.run_all(&forget(&shared, false)).await {
        crate::log_failure("forgetting this node's last drain", &mut failing, &e);
    }
    let mut next_read = Instant::now();
    loop {
        if Instant::now() >= next_read {
            match observe(&shared, &broker, &mut conn, Instant::now()).await {
                Ok(()) => failing = false,
                Err(e) => crate::log_failure("reading the nodes' connection counts", &mut failing, &e),
            }
            next_read = Instant::now() + every;
        }
        let busy = step(&shared, &broker, Instant::now());
        let wake = if busy { (Instant::now() + STEP).min(next_read) } else { next_read };
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = shared.balance.nudge.notified() => next_read = Instant::now(),
            _ = broker.shutdown().cancelled() => return,
        }
    }
}

/// Takes this node out of the others' choices as it stops: its count, its Server Reference
/// and its drain, which ends with the process.
pub(crate) async fn leave(shared: &Shared) {
    if let Err(e) = shared.conn.clone().run_all(&forget(shared, true)).await {
        tracing::warn!("cluster: could not remove this node's connection count ({e}); it stays listed");
    }
}

/// The commands that delete this node's drain and, when `all`, its count and Server Reference.
fn forget(shared: &Shared, all: bool) -> Vec<redis::Cmd> {
    let keys = &shared.keys;
    let mut hashes = vec![keys.drain(), keys.drain_state()];
    if all {
        hashes.extend([keys.load(), keys.servers()]);
    }
    hashes.into_iter().map(|h| redis::cmd("HDEL").arg(h).arg(&shared.me).clone()).collect()
}

/// This node's connections through its listeners (in-process clients left out).
fn connections(broker: &Broker) -> u64 {
    let by = &broker.metrics().connected_by_transport;
    Transport::ALL.iter().map(|t| Metrics::get(by.get(*t))).sum()
}

/// Writes this node's count (and how its drain goes) and reads the cluster's, then settles
/// what it sends away until the next read.
async fn observe(shared: &Shared, broker: &Broker, conn: &mut Conn, now: Instant) -> redis::RedisResult<()> {
    let (keys, me) = (&shared.keys, &shared.me);
    let count = connections(broker);
    let mut cmds = vec![
        redis::cmd("HSET").arg(keys.load()).arg(me).arg(count).clone(),
        redis::cmd("HGETALL").arg(keys.load()).clone(),
        redis::cmd("HGETALL").arg(keys.servers()).clone(),
        redis::cmd("HGETALL").arg(keys.drain()).clone(),
        redis::cmd("HGETALL").arg(keys.drain_state()).clone(),
        redis::cmd("GET").arg(keys.rebalance()).clone(),
    ];
    {
        let st = shared.balance.state.lock();
        match st.drain {
            Some(p) => {
                let progress = Progress { remaining: count, ..p }.to_json().to_string();
                cmds.push(redis::cmd("HSET").arg(keys.drain_state()).arg(me).arg(progress).clone());
            }
            None if st.view.progress.contains_key(me) => {
                cmds.push(redis::cmd("HDEL").arg(keys.drain_state()).arg(me).clone());
            }
            None => {}
        }
    }
    let replies = conn.run_all(&cmds).await?;
    let view = View::read(&replies[1..]);
    let live = shared.live.lock().clone();
    let (events, done) = shared.balance.apply(view, count, &live, me);
    for event in events {
        event.report(broker, now);
    }
    if let Some(request) = done {
        rebalance::end(shared, conn, &request).await?;
    }
    Ok(())
}

/// Sends away what this node's drain or rebalance share allows at `now`; true while it has
/// more to send.
fn step(shared: &Shared, broker: &Broker, now: Instant) -> bool {
    let balance = &shared.balance;
    let count = connections(broker);
    let live = shared.live.lock().clone();
    let (n, mut targets, mut queue, draining) = {
        let mut st = balance.state.lock();
        st.connections = count;
        let (rate, wanted) = match (&st.drain, &st.rebalance) {
            (Some(p), _) => (p.rate, count),
            (None, Some((request, share))) => (request.rate, *share),
            (None, None) => (0, 0),
        };
        if wanted == 0 {
            st.pacer.rest();
            st.queue.clear();
            return false;
        }
        let n = st.pacer.take(rate, now).min(wanted);
        if n == 0 {
            return true;
        }
        (n, st.targets(&live, &shared.me), std::mem::take(&mut st.queue), st.drain.is_some())
    };
    if queue.is_empty() {
        queue = broker.cluster().connected_clients();
    }
    let ids = queue.split_off(queue.len().saturating_sub(usize::try_from(n).unwrap_or(usize::MAX)));
    let detail = match draining {
        true => "this node is draining: connect to the Server Reference",
        false => "rebalancing the cluster's connections: connect to the Server Reference",
    };
    let mut sent = Vec::new();
    let closed = broker.cluster().send_away(&ids, ReasonCode::UseAnotherServer, detail, || {
        let target = pick(&mut targets)?;
        sent.push(target.node.clone());
        Some(target.reference.clone())
    }) as u64;
    let mut st = balance.state.lock();
    for node in &sent {
        st.sent(node);
    }
    st.queue = queue;
    if let Some(p) = st.drain.as_mut() {
        p.moved += closed;
        balance.drained.fetch_add(closed, Ordering::Relaxed);
    } else if let Some((_, share)) = st.rebalance.as_mut() {
        *share = share.saturating_sub(closed);
        balance.rebalanced.fetch_add(closed, Ordering::Relaxed);
    }
    true
}

/// Spreads sends over time at a rate: each call tells how many may go now.
#[derive(Debug, Default)]
struct Pacer {
    last: Option<Instant>,
    /// What the time passed allowed and was not sent yet: a fraction of one, or a burst.
    allowance: f64,
}

impl Pacer {
    /// How many may go at `now` at `rate` per second: what the time since the last call
    /// allows (one [`STEP`]'s worth on the first), at most [`BURST`]'s worth but at least one.
    fn take(&mut self, rate: u32, now: Instant) -> u64 {
        let elapsed = self.last.map_or(STEP, |last| now.saturating_duration_since(last));
        self.last = Some(now);
        let rate = f64::from(rate);
        let most = (rate * BURST.as_secs_f64()).max(1.0);
        self.allowance = (self.allowance + rate * elapsed.as_secs_f64()).min(most);
        let n = self.allowance.floor();
        self.allowance -= n;
        n as u64
    }

    /// Nothing to send: the next send starts afresh.
    fn rest(&mut self) {
        *self = Pacer::default();
    }
}

/// The address other nodes send this node's clients to: `configured` (`cluster.server_reference`)
/// if set, else the TCP listener's address `tcp`, an unspecified IP replaced by the host of
/// `advertise` (the links' advertised address); None if neither tells one.
fn server_reference(configured: &str, tcp: SocketAddr, advertise: Option<&str>) -> Option<String> {
    if !configured.is_empty() {
        return Some(configured.to_string());
    }
    if tcp.port() == 0 {
        return None;
    }
    if !tcp.ip().is_unspecified() {
        return Some(tcp.to_string());
    }
    let (host, _) = advertise?.rsplit_once(':')?;
    Some(format!("{host}:{}", tcp.port()))
}

/// The admin API's way to the cluster's drains and rebalances.
#[derive(Debug)]
struct Requests(Arc<Shared>);

impl Balancer for Requests {
    fn drain<'a>(&'a self, node: &'a str, rate: u32) -> Answer<'a> {
        Box::pin(drain::start(&self.0, node, rate))
    }

    fn cancel_drain<'a>(&'a self, node: &'a str) -> Answer<'a> {
        Box::pin(drain::cancel(&self.0, node))
    }

    fn rebalance(&self, rate: u32, bound: Duration) -> Answer<'_> {
        Box::pin(rebalance::start(&self.0, rate, bound))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// A view of `loads`, every node with a Server Reference `<name>:1883`.
    fn view(loads: &[(&str, u64)]) -> View {
        View {
            loads: loads.iter().map(|(n, l)| (n.to_string(), *l)).collect(),
            servers: loads.iter().map(|(n, _)| (n.to_string(), format!("{n}:1883"))).collect(),
            ..View::default()
        }
    }

    #[test]
    fn the_pacer_keeps_to_its_rate_and_carries_fractions_over() {
        let start = Instant::now();
        let mut p = Pacer::default();
        assert_eq!(p.take(100, start), 10, "one step's worth first");
        let sent: u64 = (1..=10).map(|i| p.take(100, start + STEP * i)).sum();
        assert_eq!(sent, 100, "100 a second");
        let mut slow = Pacer::default();
        let sent: u64 = (0..29).map(|i| slow.take(2, start + STEP * i)).sum();
        assert_eq!(sent, 5, "2 a second: fractions add up");
        assert_eq!(p.take(100, start + Duration::from_secs(60)), 25, "a late step sends a burst at most");
        p.rest();
        assert_eq!(p.take(100, start + Duration::from_secs(61)), 10);
    }

    #[test]
    fn sends_spread_over_the_least_loaded_nodes() {
        let mut st = State { view: view(&[("a", 0), ("b", 40), ("c", 100), ("d", 0)]), ..State::default() };
        st.view.drains.insert("d".into(), 100);
        let live = names(&["a", "b", "c", "d", "e"]);
        let mut targets = st.targets(&live, "c");
        let got: Vec<String> = (0..60).map(|_| pick(&mut targets).unwrap().node.clone()).collect();
        assert_eq!(got.iter().filter(|n| *n == "a").count(), 50, "a first, until it has as many as b");
        assert_eq!(got.iter().filter(|n| *n == "b").count(), 10);
        assert!(!got.iter().any(|n| n == "d" || n == "e"), "not draining d, nor e without a reference");
        for n in &got {
            st.sent(n);
        }
        assert_eq!(st.estimate("a"), 50, "what was sent counts until the next reads");
        st.recent[1] = std::mem::take(&mut st.recent[0]);
        assert_eq!(st.estimate("a"), 50);
        st.recent[1].clear();
        assert_eq!(st.estimate("a"), 0);
    }

    #[test]
    fn a_read_starts_and_ends_a_drain_and_sets_a_rebalance_share() {
        let b = Balance::default();
        let live = names(&["n1", "n2", "n3"]);
        let mut v = view(&[("n1", 300), ("n2", 0), ("n3", 0)]);
        v.drains.insert("n1".into(), 50);
        let (events, _) = b.apply(v, 300, &live, "n1");
        assert_eq!(events, [Event::Draining { rate: 50, connections: 300 }]);
        assert!(b.draining());
        assert_eq!(b.suggest(&live, "n1").as_deref(), Some("n2:1883"));
        assert_eq!(b.suggest(&live, "n1").as_deref(), Some("n3:1883"), "n2 counted one more");
        let (state, fields) = b.describe("n1", true);
        assert_eq!(
            (state, &fields["draining"], &fields["connections"]),
            (Some("draining"), &json!(true), &json!(300))
        );

        let mut v = view(&[("n1", 0), ("n2", 150), ("n3", 150)]);
        v.drains.insert("n1".into(), 50);
        let (events, _) = b.apply(v, 0, &live, "n1");
        assert_eq!(events, [Event::Drained { moved: 0 }]);
        assert_eq!(b.describe("n1", true).0, Some("drained"));
        let (events, _) = b.apply(view(&[("n1", 0), ("n2", 150), ("n3", 150)]), 0, &live, "n1");
        assert_eq!(events, [Event::Cancelled]);
        assert!(!b.draining());

        let request = Request { id: 1, rate: 100, senders: names(&["n1"]) };
        let mut v = view(&[("n1", 300), ("n2", 0), ("n3", 0)]);
        v.rebalance = Some(request.clone());
        let (events, done) = b.apply(v, 300, &live, "n1");
        assert_eq!(events, [Event::Sharing { excess: 200, connections: 300 }]);
        assert_eq!((b.state.lock().rebalance.clone(), done), (Some((request.clone(), 200)), None));
        let mut v = view(&[("n1", 200), ("n2", 0), ("n3", 100)]);
        v.rebalance = Some(request.clone());
        let (events, done) = b.apply(v, 200, &live, "n1");
        assert_eq!((events, done), (vec![], None), "the share is set once, counted down as sent");
        assert_eq!(b.state.lock().rebalance, Some((request.clone(), 200)));
        b.state.lock().rebalance.as_mut().unwrap().1 = 0;
        let mut v = view(&[("n1", 100), ("n2", 99), ("n3", 101)]);
        v.rebalance = Some(request.clone());
        let (events, done) = b.apply(v, 100, &live, "n1");
        assert_eq!((events, done), (vec![], Some(request.clone())), "sent, and even: it ends");

        let n3 = Balance::default();
        let mut v = view(&[("n1", 160), ("n2", 40), ("n3", 100)]);
        v.rebalance = Some(request.clone());
        let (events, done) = n3.apply(v, 140, &live, "n3");
        assert_eq!((events, done), (vec![], None), "n3 is no sender, above the average as it may seem");
        assert_eq!(n3.state.lock().rebalance, Some((request, 0)));
    }

    #[test]
    fn the_server_reference_is_the_tcp_listener_on_the_advertised_host() {
        let any: SocketAddr = "0.0.0.0:1883".parse().unwrap();
        let one: SocketAddr = "127.0.0.1:1884".parse().unwrap();
        assert_eq!(
            server_reference("mqtt.example.com:1883", any, None).as_deref(),
            Some("mqtt.example.com:1883")
        );
        assert_eq!(server_reference("", one, Some("10.0.0.5:4370")).as_deref(), Some("127.0.0.1:1884"));
        assert_eq!(server_reference("", any, Some("10.0.0.5:4370")).as_deref(), Some("10.0.0.5:1883"));
        assert_eq!(server_reference("", any, Some("[fd00::5]:4370")).as_deref(), Some("[fd00::5]:1883"));
        assert_eq!(server_reference("", any, None), None);
        assert_eq!(server_reference("", "0.0.0.0:0".parse().unwrap(), Some("10.0.0.5:4370")), None);
    }
}
