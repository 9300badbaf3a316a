//! This node's inbox: a Redis stream other nodes write messages and handover requests into,
//! read through a consumer group. A message is routed to this node's sessions, and its entry
//! acknowledged and deleted only once what the sessions queued is durable in Redis: a node
//! that dies before that leaves the entry to be read again (by itself at its next start, or
//! by the node that takes its sessions over, see [`crate::reaper`]). A message that arrives
//! twice (that, a sender's retried write, or both its old and new holder's inbox) is dropped
//! by its sender's incarnation and number.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::redis::Conn;
use redis::Value;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use braid_broker::broker::{Arrival, Broker, Holder};
use braid_broker::message::RemoteId;
use braid_broker::session::Wakes;
use braid_broker::store::Ticket;
use braid_proto::ByteString;
use parking_lot::Mutex;

use crate::streams::stream_entries;
use crate::wire::{self, Entry, Incoming};
use crate::{log_failure, ClusterError, Shared};

/// The consumer group every inbox is read through.
pub(crate) const GROUP: &str = "braid";

/// A read that brought some messages, fewer than this, is followed by a pause of [`LINGER`].
const LINGER_BELOW: usize = 16;

/// How long the reader lets entries gather after a small read.
const LINGER: Duration = Duration::from_micros(1000);

/// Most entries read at once (each packs up to a writer's round trip of messages, see
/// [`crate::store`]), however large `cluster.batch` is.
const READ_ENTRIES: usize = 64;

/// How many entries to read at once with `cluster.batch` = `batch`.
pub(crate) fn read_count(batch: usize) -> usize {
    batch.min(READ_ENTRIES)
}

/// How many message numbers per sender the duplicate check remembers.
const REMEMBERED: usize = 1 << 16;

/// The messages received lately, by sender incarnation.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    by_sender: HashMap<Arc<str>, BTreeSet<u64>>,
}

impl Seen {
    /// True the first time `id` is offered.
    fn first(&mut self, id: &RemoteId) -> bool {
        let numbers = self.by_sender.entry(id.sender.clone()).or_default();
        let new = numbers.insert(id.number);
        if numbers.len() > REMEMBERED {
            numbers.pop_first();
        }
        new
    }
}

/// Creates `inbox`'s consumer group if it has none (reading from the stream's start: what was
/// sent while its node was away is delivered).
pub(crate) async fn create_group(conn: &mut Conn, inbox: &str) -> Result<(), ClusterError> {
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(inbox)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Err(e) if e.code() != Some("BUSYGROUP") => {
            Err(ClusterError::redis("cannot create the inbox group")(e))
        }
        _ => Ok(()),
    }
}

/// What the node does with a request, read from its inbox, to hand a session over: the
/// client id, the node that asks, and whether its client starts clean.
pub(crate) type OnRelease = Arc<dyn Fn(ByteString, String, bool) + Send + Sync>;

/// Creates this node's inbox group and returns the reader's task.
pub(crate) async fn run(
    shared: Arc<Shared>,
    broker: Arc<Broker>,
    on_release: OnRelease,
) -> Result<JoinHandle<()>, ClusterError> {
    let inbox = shared.keys.inbox(&shared.me);
    create_group(&mut shared.conn.clone(), &inbox).await?;
    let reader = shared.redis.connect(Duration::from_secs(5)).await?;
    Ok(tokio::spawn(read(shared, broker, reader, inbox, on_release)))
}

/// Entries read and not acknowledged yet, and their messages not routed yet: relayed ones
/// wait here while a claim is under way on this node (they may be for the session it takes
/// in), every one while sessions here are over their queue's limits.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    /// The entries' ids.
    pub ids: Vec<String>,
    pub(crate) messages: Vec<Incoming>,
    /// The messages routed from them so far (see [`crate::store::RedisStore::routing`]).
    pub(crate) routed: Vec<RemoteId>,
}

/// Entries whose messages are all routed, to be acknowledged.
#[derive(Debug, Default)]
pub(crate) struct Routed {
    ids: Vec<String>,
    messages: Vec<RemoteId>,
}

impl Routed {
    /// Takes `backlog`'s entries, all of whose messages are routed.
    pub(crate) fn take(&mut self, backlog: &mut Backlog) {
        self.ids.append(&mut backlog.ids);
        self.messages.append(&mut backlog.routed);
    }

    /// The entries are acknowledged: what waited for that goes on.
    fn acknowledged(&mut self, shared: &Shared) {
        shared.store.acknowledged(&self.messages);
        self.ids.clear();
        self.messages.clear();
    }
}

/// Reads the inbox until the broker shuts down: first what was read before but never
/// acknowledged (pending), then new entries. Handover requests and answers are acted on as
/// they come; messages are routed as they come too, except relayed ones while a claim is
/// under way here; an entry is acknowledged once all its messages are routed.
async fn read(
    shared: Arc<Shared>,
    broker: Arc<Broker>,
    mut conn: Conn,
    inbox: String,
    on_release: OnRelease,
) {
    let mut pending = true;
    let mut failing = false;
    let mut backlog = Backlog::default();
    let claiming = shared.claiming.subscribe();
    let slow_consumer = Duration::from_secs(broker.live().session.slow_consumer_timeout_secs);
    let (mut held, mut held_since) = (Vec::new(), Instant::now());
    // Entries routed, acknowledged with the next read (one round trip for both).
    let mut routed = Routed::default();
    // The last read brought only a few entries.
    let mut trickle = false;
    loop {
        still_held(&mut held, held_since, slow_consumer, Instant::now());
        if !backlog.ids.is_empty() && held.is_empty() {
            let hold_relayed = *claiming.borrow() > 0;
            held = route(&shared, &broker, &mut backlog, Source::Own, hold_relayed).await;
            held_since = Instant::now();
            if backlog.messages.is_empty() {
                routed.take(&mut backlog);
            }
        }
        if trickle && backlog.ids.is_empty() {
            // What was read is routed; before reading again, let a few more entries gather, so
            // that reads (and acknowledgements) go in batches, not one round trip per message.
            tokio::time::sleep(LINGER).await;
        }
        let from = if pending { "0" } else { ">" };
        // A read in flight is never dropped (what it took would stay pending unread): while
        // messages wait (a claim, a held session), reads wait briefly, to see that end soon.
        let block = if backlog.ids.is_empty() && held.is_empty() { 1000 } else { 10 };
        let read = tokio::select! {
            r = ack_and_read(&mut conn, &inbox, &shared.me, &routed.ids, from, read_count(shared.config.batch), block) => r,
            _ = broker.shutdown().cancelled() => {
                acknowledge(&shared, &inbox, &mut routed).await;
                return;
            }
        };
        let entries = match read {
            Ok(v) => {
                failing = false;
                routed.acknowledged(&shared);
                stream_entries(v)
            }
            Err(e) => {
                log_failure("reading the inbox", &mut failing, &e);
                if e.code() == Some("NOGROUP") {
                    // Redis lost it (restarted without persistence, or a takeover removed it).
                    let _ = create_group(&mut shared.conn.clone(), &inbox).await;
                }
                // After a reconnect, what was read but not acknowledged is read again (the
                // messages routed from it are dropped then as received twice: they wait for
                // the acknowledgement of those entries as they did).
                pending = true;
                backlog = Backlog { routed: std::mem::take(&mut backlog.routed), ..Backlog::default() };
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        if pending && entries.is_empty() {
            pending = false;
            continue;
        }
        let before = backlog.messages.len();
        take_in(&shared, entries, Some(&on_release), &mut backlog);
        // Not after a read of handover requests or answers only: a claim waits on those.
        trickle = (1..LINGER_BELOW).contains(&(backlog.messages.len() - before));
    }
}

/// Adds `entries` to `backlog`; with `on_release` (this node's own inbox), acts on the
/// handover requests and answers among them.
pub(crate) fn take_in(
    shared: &Shared,
    entries: Vec<(String, Vec<Value>)>,
    on_release: Option<&OnRelease>,
    backlog: &mut Backlog,
) {
    for (id, fields) in entries {
        backlog.ids.push(id);
        match wire::read(&fields, shared.store.clock()) {
            Ok(Entry::Messages(mut messages)) => backlog.messages.append(&mut messages),
            Ok(Entry::Release { client_id, from, clean }) => {
                if let Some(on_release) = on_release {
                    on_release(client_id, from, clean);
                }
            }
            Ok(Entry::Released { client_id }) if on_release.is_some() => {
                if let Some(tx) = shared.handovers.lock().remove(&client_id) {
                    let _ = tx.send(());
                }
            }
            Ok(_) => {}
            Err(e) => warn!("cluster: an unreadable inbox entry is skipped: {e}"),
        }
    }
}

/// What this node took over from a gone node: the ids here of the sessions it adopted (the
/// gone node's inbox was theirs) and the messages read from that inbox.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// Adopted sessions' ids.
    pub sessions: HashSet<u64>,
    /// The duplicate check of the gone node's inbox.
    pub seen: Mutex<Seen>,
}

/// Whose inbox entries are routed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source<'a> {
    /// This node's own.
    Own,
    /// A gone node's, taken over: its messages are for the sessions adopted from it.
    Gone(&'a Taken),
}

/// Routes the messages of `backlog` (of `source`), those received before excepted and
/// relayed ones left in it if `hold_relayed`, and waits until what they queued is durable:
/// once none is left, its entries may be acknowledged (`backlog.ids`). Returns the sessions
/// that hold the inbox back (see [`still_held`]).
pub(crate) async fn route(
    shared: &Shared,
    broker: &Broker,
    backlog: &mut Backlog,
    source: Source<'_>,
    hold_relayed: bool,
) -> Vec<Holder> {
    let (ticket, held) = route_now(shared, broker, backlog, source, hold_relayed);
    shared.store.wait_durable(ticket).await;
    held
}

/// Routes as [`route`] does without waiting: returns the store ticket that what they queued
/// is durable at, and the sessions that hold the sender back.
pub(crate) fn route_now(
    shared: &Shared,
    broker: &Broker,
    backlog: &mut Backlog,
    source: Source<'_>,
    hold_relayed: bool,
) -> (Ticket, Vec<Holder>) {
    let seen = match source {
        Source::Own => &shared.seen,
        Source::Gone(taken) => &taken.seen,
    };
    let mut ticket = 0;
    let mut held = Vec::new();
    // The subscribers' connections are woken once for the whole batch (when this is dropped).
    let mut wakes = Wakes::default();
    // One reading of the clock for the batch.
    let now = Instant::now();
    let mut messages: Vec<Incoming> = match hold_relayed {
        false => std::mem::take(&mut backlog.messages),
        true => {
            let (waiting, now) = backlog.messages.drain(..).partition(|m| m.relayed);
            backlog.messages = waiting;
            now
        }
    };
    // Those received before are dropped; the rest are routed, their deliveries kept in Redis
    // until their entry or frame is acknowledged (one lock each for the batch).
    {
        let mut seen = seen.lock();
        messages.retain(|m| match &m.msg.remote_id {
            Some(id) if !seen.first(id) => {
                shared.duplicates.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                debug!("cluster: a message received twice is dropped");
                false
            }
            _ => true,
        });
    }
    let routed = backlog.routed.len();
    backlog.routed.extend(messages.iter().filter_map(|m| m.msg.remote_id.clone()));
    shared.store.routing(&backlog.routed[routed..]);
    for Incoming { msg, scope, .. } in messages {
        let own = msg.remote_id.as_ref().filter(|id| *id.sender == *shared.incarnation).map(|id| id.number);
        let arrival = match (source, own) {
            (Source::Gone(taken), _) => Arrival::Drained(&taken.sessions),
            (Source::Own, Some(number)) => Arrival::Returned(number),
            (Source::Own, None) => Arrival::Sent,
        };
        let mut published = broker.remotes().publish_forwarded(msg, &scope, arrival, now);
        wakes.append(&mut published.wakes);
        shared.received.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ticket = ticket.max(published.ticket);
        held.extend(published.held);
    }
    (ticket, held)
}

/// Sessions over their queue's limits hold the inbox back, as they would hold a publisher of
/// their own node: what other nodes send waits in Redis meanwhile. Keeps those that still
/// hold at `now`; one held since `since` for `slow_consumer` (if set) is evicted as a slow
/// consumer, as on one node.
fn still_held(held: &mut Vec<Holder>, since: Instant, slow_consumer: Duration, now: Instant) {
    held.retain(|h| {
        let blocks = h.session.lock().blocks_publishers_now();
        match h.paced_until {
            Some(until) => blocks && now < until,
            None if blocks && !slow_consumer.is_zero() && now >= since + slow_consumer => {
                h.session.evict_slow_consumer(slow_consumer.as_secs());
                false
            }
            None => blocks,
        }
    });
}

/// XREADGROUP of up to `count` entries of `inbox` as consumer `me`, from `from` ("0": those
/// read before and not acknowledged; ">": new ones, waiting up to `block` ms for some).
pub(crate) async fn read_group(
    conn: &mut Conn,
    inbox: &str,
    me: &str,
    from: &str,
    count: usize,
    block: Option<u64>,
) -> redis::RedisResult<Value> {
    read_cmd(inbox, me, from, count, block).query_async(conn).await
}

fn read_cmd(inbox: &str, me: &str, from: &str, count: usize, block: Option<u64>) -> redis::Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP").arg(GROUP).arg(me).arg("COUNT").arg(count);
    if let (">", Some(ms)) = (from, block) {
        cmd.arg("BLOCK").arg(ms);
    }
    cmd.arg("STREAMS").arg(inbox).arg(from);
    cmd
}

/// Acknowledges and deletes the entries `ids` of `inbox` (handled), then reads on as
/// [`read_group`] does (waiting up to `block` ms for new entries): one round trip. On an error
/// the entries are acknowledged with a later read (what was read again meanwhile is dropped
/// as received twice).
async fn ack_and_read(
    conn: &mut Conn,
    inbox: &str,
    me: &str,
    ids: &[String],
    from: &str,
    count: usize,
    block: u64,
) -> redis::RedisResult<Value> {
    if ids.is_empty() {
        return read_group(conn, inbox, me, from, count, Some(block)).await;
    }
    let mut pipe = redis::pipe();
    pipe.cmd("XACK").arg(inbox).arg(GROUP).arg(ids).ignore();
    pipe.cmd("XDEL").arg(inbox).arg(ids).ignore();
    pipe.add_command(read_cmd(inbox, me, from, count, Some(block)));
    let (reply,): (Value,) = pipe.query_async(conn).await?;
    Ok(reply)
}

/// Acknowledges and deletes the entries of `routed`, retrying until Redis takes it.
pub(crate) async fn acknowledge(shared: &Shared, inbox: &str, routed: &mut Routed) {
    if routed.ids.is_empty() {
        return;
    }
    let ids = &routed.ids;
    let mut conn = shared.conn.clone();
    let mut failing = false;
    loop {
        let result: redis::RedisResult<()> = redis::pipe()
            .cmd("XACK")
            .arg(inbox)
            .arg(GROUP)
            .arg(ids)
            .ignore()
            .cmd("XDEL")
            .arg(inbox)
            .arg(ids)
            .ignore()
            .query_async(&mut conn)
            .await;
        match result {
            Ok(()) => {
                if failing {
                    info!("cluster: inbox acknowledgements resumed");
                }
                routed.acknowledged(shared);
                return;
            }
            Err(e) => {
                log_failure("acknowledging inbox entries", &mut failing, &e);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
