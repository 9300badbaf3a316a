//! The store of a cluster node: sessions, their queued deliveries and retained messages kept
//! in Redis, where any node can take them over, and the messages this node sends to others.
//! Every change goes through one writer task in submission order, many per Redis round trip
//! (a pipeline); a change's ticket is durable once Redis answered it, which is what a
//! publisher's acknowledgement waits for. The messages a round trip carries to one node go
//! packed in one entry of its inbox, after the round trip's other changes.
//!
//! Fencing: a session's writes carry the ownership epoch this node got when it claimed the
//! client id ([`crate::directory`]); a script refuses them once another node has claimed it
//! since, and the session is let go here.
//!
//! A delivery of a message read from an inbox entry that is not acknowledged yet is not
//! removed from Redis before that acknowledgement ([`Unacked`]): a node that dies in between
//! leaves the entry to be read again, and the session read back must still hold the message
//! to know it has had it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::redis::Conn;
use parking_lot::Mutex;
use redis::{Cmd, Value};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{error, warn};

use braid_broker::message::{Delivery, RemoteId};
use braid_broker::router::Forward;
use braid_broker::session::Item;
use braid_broker::store::{
    codec, Op, RecordError, Recovered, RecoveredSession, Stage, Store, StoreError, Stored, Ticket, UnixClock,
};
use braid_client::Backoff;
use braid_proto::ByteString;

use crate::keys::Keys;
use crate::redis::{bytes, int};
use crate::scripts;
use crate::wire;

/// A session this store writes for: its client id and ownership epoch.
#[derive(Debug, Clone)]
struct Bound {
    client_id: ByteString,
    epoch: u64,
}

/// What a write's reply is for.
#[derive(Debug)]
enum Reply {
    /// Nothing to read.
    None,
    /// A session change under an epoch: 0 means the session has a newer owner.
    Fenced(ByteString, u64),
    /// A session's deliveries (two replies: the queue and the stages), but for the finished
    /// ones whose removal waits (see [`Unacked`]), by sequence number.
    Load(oneshot::Sender<Result<Vec<Stored>, StoreError>>, Vec<u64>),
}

/// One unit of the writer's work.
#[derive(Debug)]
enum Job {
    Write {
        ticket: Ticket,
        cmds: Vec<Cmd>,
        reply: Reply,
    },
    /// A message (a [`wire::record`]) for the inbox `inbox`.
    Forward {
        ticket: Ticket,
        inbox: String,
        record: Vec<u8>,
    },
    Close(std::sync::mpsc::Sender<()>),
}

/// A pack grown past this many bytes is closed; the inbox's next messages start another.
const PACK_BYTES: usize = 256 * 1024;

/// Assigns tickets and queues jobs in one step, so that jobs reach the writer in ticket order.
#[derive(Debug)]
struct Submitter {
    last: Ticket,
    tx: mpsc::UnboundedSender<Job>,
}

/// The Redis store of a cluster node.
#[derive(Debug)]
pub(crate) struct RedisStore {
    keys: Keys,
    submitter: Mutex<Submitter>,
    durable: watch::Receiver<Ticket>,
    sessions: Mutex<HashMap<u64, Bound>>,
    epochs: Mutex<HashMap<ByteString, u64>>,
    recovered: Mutex<Option<Recovered>>,
    unacked: Mutex<Unacked>,
    /// Converts the expiries records keep.
    clock: UnixClock,
}

/// Messages routed from inbox entries not acknowledged yet, their deliveries, and which of
/// those are finished: a finished one's removal (`done`) waits for the acknowledgement.
/// Otherwise a node dying after the removal and before the acknowledgement would leave an
/// entry read again into a session that no longer knows the message: a QoS 2 subscriber
/// would get it twice.
#[derive(Debug, Default)]
struct Unacked {
    /// By message: how many unacknowledged entries it was routed from, and its deliveries
    /// as (session, seq).
    messages: HashMap<RemoteId, (usize, Vec<(u64, u64)>)>,
    /// By delivery (session, seq): its message, and whether it is finished.
    deliveries: HashMap<(u64, u64), (RemoteId, bool)>,
}

impl Unacked {
    /// The finished deliveries, as (session, seq), of the sessions `of` selects.
    fn finished(&self, of: impl Fn(u64) -> bool) -> Vec<(u64, u64)> {
        self.deliveries
            .iter()
            .filter(|((session, _), (_, done))| *done && of(*session))
            .map(|(d, _)| *d)
            .collect()
    }
}

/// The writer side, to be run by [`RedisStore::run_writer`].
#[derive(Debug)]
pub(crate) struct Writer {
    rx: mpsc::UnboundedReceiver<Job>,
    durable: watch::Sender<Ticket>,
    batch: usize,
    clock: UnixClock,
}

impl RedisStore {
    /// A store on `keys`, having found `retained` in Redis at start, converting the expiries
    /// records keep by `clock`.
    pub(crate) fn new(
        keys: Keys,
        retained: Vec<Arc<braid_broker::message::Message>>,
        batch: usize,
        clock: UnixClock,
    ) -> (Arc<RedisStore>, Writer) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (durable_tx, durable) = watch::channel(0);
        let recovered = Recovered { sessions: Vec::new(), retained, next_session_id: 1 };
        let store = Arc::new(RedisStore {
            keys,
            submitter: Mutex::new(Submitter { last: 0, tx }),
            durable,
            sessions: Mutex::new(HashMap::new()),
            epochs: Mutex::new(HashMap::new()),
            recovered: Mutex::new(Some(recovered)),
            unacked: Mutex::new(Unacked::default()),
            clock,
        });
        (store, Writer { rx, durable: durable_tx, batch, clock })
    }

    /// Writes for `client_id` carry `epoch` from now on (it was just claimed).
    pub(crate) fn set_epoch(&self, client_id: &str, epoch: u64) {
        self.epochs.lock().insert(client_id.into(), epoch);
        for b in self.sessions.lock().values_mut().filter(|b| &*b.client_id == client_id) {
            b.epoch = epoch;
        }
    }

    /// The epoch this node holds `client_id` under, if it does.
    pub(crate) fn epoch(&self, client_id: &str) -> Option<u64> {
        self.epochs.lock().get(client_id).copied()
    }

    /// Session `id` of the broker is `client_id`'s (adopted from Redis).
    pub(crate) fn bind(&self, id: u64, client_id: &str) {
        let epoch = self.epochs.lock().get(client_id).copied().unwrap_or(0);
        self.sessions.lock().insert(id, Bound { client_id: client_id.into(), epoch });
    }

    /// Converts the expiries records keep (read when the node joined the cluster).
    pub(crate) fn clock(&self) -> &UnixClock {
        &self.clock
    }

    /// Forgets `client_id`: another node holds it now.
    pub(crate) fn unbind(&self, client_id: &str) {
        self.epochs.lock().remove(client_id);
        self.sessions.lock().retain(|_, b| &*b.client_id != client_id);
    }

    /// Messages `ids` are routed from an inbox entry (or link frame) that is not acknowledged
    /// yet: their deliveries stay in Redis until [`RedisStore::acknowledged`].
    pub(crate) fn routing(&self, ids: &[RemoteId]) {
        let mut unacked = self.unacked.lock();
        for id in ids {
            unacked.messages.entry(id.clone()).or_default().0 += 1;
        }
    }

    /// The inbox entries the messages `ids` were routed from are acknowledged: their
    /// finished deliveries are removed from Redis now.
    pub(crate) fn acknowledged(&self, ids: &[RemoteId]) {
        let mut finished = Vec::new();
        {
            let mut u = self.unacked.lock();
            for id in ids {
                let Some((entries, deliveries)) = u.messages.get_mut(id) else { continue };
                *entries -= 1;
                if *entries > 0 {
                    continue;
                }
                let deliveries = std::mem::take(deliveries);
                u.messages.remove(id);
                for d in deliveries {
                    if u.deliveries.remove(&d).is_some_and(|(_, done)| done) {
                        finished.push(d);
                    }
                }
            }
        }
        for (session, seq) in finished {
            // Not if the session ended or moved meanwhile: its data went with it.
            if self.sessions.lock().contains_key(&session) {
                self.done(session, seq);
            }
        }
    }

    /// Removes now the finished deliveries of `client_id`'s session that wait for an inbox
    /// acknowledgement (it moves to another node, which does not read this node's inbox
    /// into it); returns the ticket of the last.
    pub(crate) fn finish_waiting(&self, client_id: &str) -> Ticket {
        let ids: Vec<u64> = self
            .sessions
            .lock()
            .iter()
            .filter(|(_, b)| &*b.client_id == client_id)
            .map(|(id, _)| *id)
            .collect();
        let finished: Vec<(u64, u64)> = {
            let mut u = self.unacked.lock();
            let mine = u.finished(|session| ids.contains(&session));
            for d in &mine {
                if let Some((id, _)) = u.deliveries.remove(d) {
                    if let Some((_, ds)) = u.messages.get_mut(&id) {
                        ds.retain(|x| x != d);
                    }
                }
            }
            mine
        };
        finished.into_iter().map(|(session, seq)| self.done(session, seq)).max().unwrap_or(0)
    }

    /// Removes delivery `seq` of `session` from Redis.
    fn done(&self, session: u64, seq: u64) -> Ticket {
        self.session_op(session, "done", [seq.to_string().as_bytes(), b"", b""])
    }

    /// Waits until the changes up to `ticket` are in Redis.
    pub(crate) async fn wait_durable(&self, ticket: Ticket) {
        if ticket == 0 {
            return;
        }
        let _ = self.durable.clone().wait_for(|t| *t >= ticket).await;
    }

    /// Queues `fwd` for `node`'s inbox (`relayed`: passed on by a relay); returns its ticket.
    pub(crate) fn forward(&self, node: &str, incarnation: &str, fwd: &Forward, relayed: bool) -> Ticket {
        let (inbox, record) = (self.keys.inbox(node), wire::record(incarnation, fwd, relayed, &self.clock));
        self.queue(|ticket| Job::Forward { ticket, inbox, record })
    }

    /// The ticket after which everything `session` wrote so far is durable: the last submitted
    /// if it is a session this store writes for (persistent), 0 if not.
    pub(crate) fn written_by(&self, session: u64) -> Ticket {
        match self.sessions.lock().contains_key(&session) {
            true => self.submitter.lock().last,
            false => 0,
        }
    }

    /// Queues `cmds` (no reply needed) after everything submitted; returns their ticket.
    pub(crate) fn submit_cmds(&self, cmds: Vec<Cmd>) -> Ticket {
        self.push(cmds, Reply::None)
    }

    fn push(&self, cmds: Vec<Cmd>, reply: Reply) -> Ticket {
        self.queue(|ticket| Job::Write { ticket, cmds, reply })
    }

    fn queue(&self, job: impl FnOnce(Ticket) -> Job) -> Ticket {
        let mut s = self.submitter.lock();
        s.last += 1;
        let ticket = s.last;
        if s.tx.send(job(ticket)).is_err() {
            error!("cluster store: the writer has stopped; a change is lost");
        }
        ticket
    }

    fn session_cmd(&self, b: &Bound, op: &str, args: [&[u8]; 3]) -> Cmd {
        let k = self.keys.session(&b.client_id);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(scripts::SESSION_OP).arg(4).arg(&k.all()[..]).arg(b.epoch).arg(op).arg(&args[..]);
        cmd
    }

    fn bound(&self, id: u64) -> Option<Bound> {
        let b = self.sessions.lock().get(&id).cloned();
        if b.is_none() {
            warn!(session = id, "cluster store: a change for a session not bound here is dropped");
        }
        b
    }

    fn session_op(&self, id: u64, op: &str, args: [&[u8]; 3]) -> Ticket {
        match self.bound(id) {
            Some(b) => {
                let cmd = self.session_cmd(&b, op, args);
                self.push(vec![cmd], Reply::Fenced(b.client_id, b.epoch))
            }
            None => self.submitter.lock().last,
        }
    }
}

impl Store for RedisStore {
    fn persistent(&self) -> bool {
        true
    }

    fn sync(&self) -> bool {
        true
    }

    fn submit(&self, op: Op) -> Ticket {
        match op {
            Op::Session(rec) => {
                let client_id = rec.client_id.clone();
                let epoch = self.epochs.lock().get(&client_id).copied().unwrap_or(0);
                self.sessions.lock().insert(rec.id, Bound { client_id, epoch });
                self.session_op(rec.id, "session", [&codec::session(&rec), b"", b""])
            }
            Op::EndSession(id) => {
                let ticket = self.session_op(id, "end", [b"", b"", b""]);
                if let Some(b) = self.sessions.lock().remove(&id) {
                    self.epochs.lock().remove(&b.client_id);
                }
                ticket
            }
            Op::Append { session, seq, delivery } => {
                let mut d = delivery;
                d.seq = seq;
                if let Some(id) = &d.msg.remote_id {
                    let mut u = self.unacked.lock();
                    if let Some((_, deliveries)) = u.messages.get_mut(id) {
                        deliveries.push((session, seq));
                        u.deliveries.insert((session, seq), (id.clone(), false));
                    }
                }
                let remote = d.msg.remote_id.as_ref().map(remote_key).unwrap_or_default();
                self.session_op(
                    session,
                    "append",
                    [seq.to_string().as_bytes(), &codec::delivery(&d, &self.clock), remote.as_bytes()],
                )
            }
            Op::Stage { session, seq, stage } => {
                self.session_op(session, "stage", [seq.to_string().as_bytes(), &[stage_byte(stage)], b""])
            }
            Op::Done { session, seq } => {
                if let Some((_, done)) = self.unacked.lock().deliveries.get_mut(&(session, seq)) {
                    *done = true;
                    return self.submitter.lock().last;
                }
                self.done(session, seq)
            }
            Op::IncomingQos2 { session, packet_id, pending } => {
                let pending: &[u8] = if pending { b"1" } else { b"0" };
                self.session_op(session, "qos2", [packet_id.to_string().as_bytes(), pending, b""])
            }
            Op::Retain(msg) => {
                let value =
                    if msg.payload.is_empty() { Vec::new() } else { codec::message(&msg, &self.clock) };
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(scripts::RETAIN_OP)
                    .arg(2)
                    .arg(self.keys.retained())
                    .arg(self.keys.retained_log())
                    .arg(&*msg.topic)
                    .arg(value);
                self.push(vec![cmd], Reply::None)
            }
            Op::Load { session, reply } => match self.bound(session) {
                Some(b) => {
                    let k = self.keys.session(&b.client_id);
                    let cmds = vec![
                        redis::cmd("HGETALL").arg(&k.queue).clone(),
                        redis::cmd("HGETALL").arg(&k.stages).clone(),
                    ];
                    let finished = self
                        .unacked
                        .lock()
                        .finished(|id| id == session)
                        .into_iter()
                        .map(|(_, seq)| seq)
                        .collect();
                    self.push(cmds, Reply::Load(reply, finished))
                }
                None => {
                    let _ = reply.send(Ok(Vec::new()));
                    self.submitter.lock().last
                }
            },
        }
    }

    fn durable(&self) -> watch::Receiver<Ticket> {
        self.durable.clone()
    }

    fn take_recovered(&self) -> Recovered {
        self.recovered.lock().take().unwrap_or_default()
    }

    fn close(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.submitter.lock().tx.send(Job::Close(tx)).is_ok() {
            // Redis may be away: what is not written by then stays unwritten.
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
    }
}

impl Writer {
    /// Writes the submitted changes in order, a batch per round trip, until the store is
    /// closed. A batch that fails (Redis away) is retried, with backoff, until it succeeds:
    /// every change is idempotent, and a message sent twice is dropped by its receiver.
    /// Client ids whose writes were fenced go to `fenced`, with the epoch the writes had.
    pub(crate) async fn run(mut self, mut conn: Conn, fenced: mpsc::UnboundedSender<(ByteString, u64)>) {
        let mut jobs = Vec::new();
        loop {
            let Some(first) = self.rx.recv().await else { return };
            jobs.push(first);
            while jobs.len() < self.batch {
                match self.rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            let mut batch = Vec::new();
            let mut closing = None;
            let mut last = 0;
            // Each write's replies: where they start in the batch, how many, what they are for.
            let mut wanted = Vec::new();
            let mut packs: Vec<(String, wire::Pack)> = Vec::new();
            for job in jobs.drain(..) {
                match job {
                    Job::Write { ticket, cmds, reply } => {
                        last = ticket;
                        wanted.push((batch.len(), cmds.len(), reply));
                        batch.extend(cmds);
                    }
                    Job::Forward { ticket, inbox, record } => {
                        last = ticket;
                        let open = packs.iter_mut().rev().find(|(i, _)| *i == inbox);
                        match open.filter(|(_, pack)| pack.len() < PACK_BYTES) {
                            Some((_, pack)) => pack.push(&record),
                            None => {
                                let mut pack = wire::Pack::default();
                                pack.push(&record);
                                packs.push((inbox, pack));
                            }
                        }
                    }
                    Job::Close(tx) => closing = Some(tx),
                }
            }
            batch.extend(packs.into_iter().map(|(inbox, pack)| pack.into_cmd(&inbox)));
            let replies =
                if batch.is_empty() { Vec::new() } else { write_until_done(&mut conn, &batch).await };
            for (at, n, reply) in wanted {
                let mine = replies.get(at..at + n).unwrap_or_default();
                match reply {
                    Reply::None => {}
                    Reply::Fenced(client_id, epoch) => {
                        if mine.first().and_then(int) == Some(0) {
                            let _ = fenced.send((client_id, epoch));
                        }
                    }
                    Reply::Load(tx, finished) => {
                        let mut deliveries = read_deliveries(mine, &self.clock);
                        deliveries.retain(|s| !finished.contains(&s.seq));
                        let _ = tx.send(Ok(deliveries));
                    }
                }
            }
            if last > 0 {
                self.durable.send_replace(last);
            }
            if let Some(tx) = closing {
                let _ = tx.send(());
                return;
            }
        }
    }
}

/// Runs `cmds` until Redis answers them all.
async fn write_until_done(conn: &mut Conn, cmds: &[Cmd]) -> Vec<Value> {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut failing = false;
    loop {
        match conn.run_all(cmds).await {
            Ok(replies) => {
                if failing {
                    warn!("cluster store: Redis answers again; writes resumed");
                }
                return replies;
            }
            Err(e) => {
                if !failing {
                    warn!("cluster store: cannot write to Redis ({e}); retrying with backoff, acknowledgements wait");
                    failing = true;
                }
                tokio::time::sleep(backoff.pause()).await;
            }
        }
    }
}

/// How a message's remote id is kept beside its delivery.
fn remote_key(id: &RemoteId) -> String {
    format!("{}#{}", id.sender, id.number)
}

/// Reads [`remote_key`]'s output.
fn read_remote_key(text: &[u8]) -> Option<RemoteId> {
    let text = std::str::from_utf8(text).ok()?;
    let (sender, number) = text.rsplit_once('#')?;
    Some(RemoteId { sender: sender.into(), number: number.parse().ok()? })
}

fn stage_byte(stage: Stage) -> u8 {
    match stage {
        Stage::Queued => 0,
        Stage::Sent => 1,
        Stage::Released => 2,
    }
}

/// The deliveries in the replies of HGETALL queue and HGETALL stages, oldest first (their
/// expiries converted by `clock`); one that does not read back is logged and skipped.
pub(crate) fn read_deliveries(replies: &[Value], clock: &UnixClock) -> Vec<Stored> {
    let stages: HashMap<u64, Stage> = pairs(replies.get(1))
        .filter_map(|(k, v)| {
            let stage = match v.first()? {
                1 => Stage::Sent,
                2 => Stage::Released,
                _ => Stage::Queued,
            };
            Some((parse_u64(k)?, stage))
        })
        .collect();
    let mut out = Vec::new();
    for (k, v) in pairs(replies.first()) {
        let Some(seq) = parse_u64(k) else { continue };
        match codec::read_delivery(v, clock) {
            Ok(delivery) => {
                let stage = stages.get(&seq).copied().unwrap_or(Stage::Queued);
                out.push(Stored { seq, stage, delivery: Delivery { seq, ..delivery } });
            }
            Err(e) => warn!(seq, "cluster store: an unreadable delivery is skipped: {e}"),
        }
    }
    out.sort_unstable_by_key(|s| s.seq);
    out
}

/// The field/value pairs of a HGETALL reply (an array or a RESP3 map).
pub(crate) fn pairs(v: Option<&Value>) -> impl Iterator<Item = (&[u8], &[u8])> {
    let items: Vec<(&[u8], &[u8])> = match v {
        Some(Value::Array(a)) => {
            a.chunks(2).filter_map(|c| Some((bytes(c.first()?)?, bytes(c.get(1)?)?))).collect()
        }
        Some(Value::Map(m)) => m.iter().filter_map(|(k, v)| Some((bytes(k)?, bytes(v)?))).collect(),
        _ => Vec::new(),
    };
    items.into_iter()
}

pub(crate) fn parse_u64(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// A session as Redis has it (the replies of HGET record, HGETALL queue and stages, SMEMBERS
/// qos2), for [`braid_broker::broker::ClusterSide::adopt`]; None if Redis has no record of it.
pub(crate) fn read_session(
    client_id: &str,
    record: &Value,
    queue_and_stages: &[Value],
    qos2: &Value,
    clock: &UnixClock,
) -> Result<Option<RecoveredSession>, RecordError> {
    let Some(body) = bytes(record) else { return Ok(None) };
    let mut record = codec::read_session(body)?;
    record.client_id = ByteString::from(client_id);
    let queued = read_deliveries(queue_and_stages, clock);
    let incoming_qos2 = match qos2 {
        Value::Array(a) | Value::Set(a) => {
            a.iter().filter_map(|v| std::str::from_utf8(bytes(v)?).ok()?.parse().ok()).collect()
        }
        _ => Vec::new(),
    };
    let next_seq = queued.last().map_or(1, |s| s.seq + 1);
    let sizes = queued.iter().map(|s| (s.seq, s.delivery.size())).collect();
    let shared = queued.into_iter().filter(|s| s.delivery.group.is_some()).collect();
    let held_remote = pairs(queue_and_stages.first())
        .filter(|(field, _)| field.first() == Some(&b'r'))
        .filter_map(|(_, id)| read_remote_key(id))
        .collect();
    Ok(Some(RecoveredSession { record, next_seq, queued: sizes, incoming_qos2, held_remote, shared }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_broker::message::Message;
    use braid_proto::{ByteString, Bytes, QoS};

    /// A delivery, to session 7 of client "c", of a message another node forwarded as `id`.
    fn remote_delivery(id: &RemoteId) -> Delivery {
        let msg = Message::internal(ByteString::from_static("t"), Bytes::from_static(b"x"), false);
        let msg = Arc::new(Message { remote_id: Some(id.clone()), ..(*msg).clone() });
        Delivery::of(msg, QoS::AtLeastOnce)
    }

    /// The jobs submitted to the writer so far: (writes, loads with the sequence numbers they
    /// leave out).
    fn jobs(writer: &mut Writer) -> (usize, Vec<Vec<u64>>) {
        let (mut writes, mut loads) = (0, Vec::new());
        while let Ok(job) = writer.rx.try_recv() {
            match job {
                Job::Write { reply: Reply::Load(_, finished), .. } => loads.push(finished),
                Job::Write { .. } => writes += 1,
                _ => {}
            }
        }
        (writes, loads)
    }

    #[test]
    fn a_finished_delivery_stays_in_redis_until_its_inbox_entry_is_acknowledged() {
        let (store, mut writer) = RedisStore::new(Keys::new("t"), Vec::new(), 16, UnixClock::read());
        store.set_epoch("c", 1);
        store.bind(7, "c");
        let id = RemoteId { sender: "n2@1".into(), number: 5 };
        store.routing(std::slice::from_ref(&id));
        store.submit(Op::Append { session: 7, seq: 1, delivery: remote_delivery(&id) });
        assert_eq!(jobs(&mut writer).0, 1, "the append is written at once");
        store.submit(Op::Done { session: 7, seq: 1 });
        assert_eq!(jobs(&mut writer).0, 0, "the removal waits for the inbox acknowledgement");
        let (tx, _rx) = oneshot::channel();
        store.submit(Op::Load { session: 7, reply: tx });
        assert_eq!(jobs(&mut writer).1, [vec![1]], "a read-back leaves the finished delivery out");
        store.acknowledged(std::slice::from_ref(&id));
        assert_eq!(jobs(&mut writer).0, 1, "acknowledged: the removal is written");
        // A message whose entry is acknowledged already is removed at once.
        store.submit(Op::Append { session: 7, seq: 2, delivery: remote_delivery(&id) });
        store.submit(Op::Done { session: 7, seq: 2 });
        assert_eq!(jobs(&mut writer).0, 2);
    }

    #[test]
    fn a_session_handed_over_has_its_waiting_removals_written_first() {
        let (store, mut writer) = RedisStore::new(Keys::new("t"), Vec::new(), 16, UnixClock::read());
        store.set_epoch("c", 1);
        store.bind(7, "c");
        let id = RemoteId { sender: "n2@1".into(), number: 9 };
        store.routing(std::slice::from_ref(&id));
        store.submit(Op::Append { session: 7, seq: 1, delivery: remote_delivery(&id) });
        store.submit(Op::Done { session: 7, seq: 1 });
        assert_eq!(jobs(&mut writer).0, 1);
        assert!(store.finish_waiting("c") > 0);
        assert_eq!(jobs(&mut writer).0, 1, "the waiting removal is written");
        store.acknowledged(&[id]);
        assert_eq!(jobs(&mut writer).0, 0, "and not written twice");
    }
}
