//! A persistent session's link to the store: the sequence numbers of its deliveries, the
//! index of what waits on disk while it is offline, and the ticket of its latest change (what
//! an acknowledgement waits for under sync durability).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use tokio::sync::oneshot;

use braid_proto::ByteString;

use super::queue::{Enqueued, Item, OnDisk, Queue, QueueLimits};
use crate::message::{Delivery, RemoteId};
use crate::store::{Op, SessionRecord, Stage, Store, StoreError, Stored, Ticket};

/// The deliveries of a session read back from the store.
pub type Restore = oneshot::Receiver<Result<Vec<Stored>, StoreError>>;

/// Store state of one persistent session.
#[derive(Debug)]
pub struct Persist {
    store: Arc<dyn Store>,
    id: u64,
    client_id: ByteString,
    next_seq: u64,
    /// Deliveries waiting on disk only, oldest first: while the client is offline, and after
    /// it reconnects until they are read back.
    pub offline: Option<Queue<OnDisk>>,
    /// Ticket of the latest change submitted.
    pub ticket: Ticket,
    /// For a session a cluster node adopted, while the move settles (see
    /// [`crate::broker::ClusterSide::adopt`]): the messages from other nodes it holds or was offered,
    /// none of which is queued twice (it may come by two nodes' inboxes meanwhile).
    pub remote_ids: Option<Box<RemoteIds>>,
}

/// The latest messages from other nodes a session was offered, by their remote id.
#[derive(Debug, Default)]
pub struct RemoteIds {
    ids: HashSet<RemoteId>,
    order: VecDeque<RemoteId>,
}

impl RemoteIds {
    /// How many it remembers.
    const KEPT: usize = 4096;

    /// Remembers `id`; false if it did already.
    pub fn first(&mut self, id: &RemoteId) -> bool {
        if !self.ids.insert(id.clone()) {
            return false;
        }
        self.order.push_back(id.clone());
        if self.order.len() > Self::KEPT {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
        true
    }
}

impl FromIterator<RemoteId> for RemoteIds {
    fn from_iter<I: IntoIterator<Item = RemoteId>>(ids: I) -> RemoteIds {
        let mut out = RemoteIds::default();
        for id in ids {
            out.first(&id);
        }
        out
    }
}

impl Persist {
    /// Links session `id` to `store`; its next delivery gets sequence number `next_seq`.
    pub fn new(store: Arc<dyn Store>, id: u64, client_id: ByteString, next_seq: u64) -> Persist {
        Persist {
            store,
            id,
            client_id,
            next_seq: next_seq.max(1),
            offline: None,
            ticket: 0,
            remote_ids: None,
        }
    }

    fn submit(&mut self, op: Op) {
        self.ticket = self.store.submit(op);
    }

    /// Persists `d` under the next sequence number, which it now carries.
    pub fn append(&mut self, d: &mut Delivery) {
        d.seq = self.next_seq;
        self.next_seq += 1;
        self.submit(Op::Append { session: self.id, seq: d.seq, delivery: d.clone() });
    }

    /// Offers `d` to the session: to disk only while offline, else to disk and `queue`.
    pub fn enqueue(&mut self, mut d: Delivery, queue: &mut Queue, online: bool) -> Enqueued {
        use Enqueued::*;
        if let (Some(id), Some(ids)) = (&d.msg.remote_id, self.remote_ids.as_mut()) {
            if !ids.first(id) {
                // By a second way while the session's move settles: queued already.
                return Queued;
            }
        }
        let (r, evicted) = match self.offline.as_mut().filter(|_| !online) {
            Some(disk) => {
                let entry = OnDisk { seq: self.next_seq, size: d.size(), qos: d.qos };
                let r = disk.push(entry, false);
                if matches!(r, Queued | QueuedOverLimit | QueuedDroppedOldest(_)) {
                    self.append(&mut d);
                }
                (r, evicted(r))
            }
            None => {
                self.append(&mut d);
                let seq = d.seq;
                let r = queue.push(d, online);
                if matches!(r, DroppedFull | SkippedOffline) {
                    self.done(seq);
                }
                (r, evicted(r))
            }
        };
        self.done(evicted);
        r
    }

    /// Delivery `seq` is finished.
    pub fn done(&mut self, seq: u64) {
        if seq != 0 {
            self.submit(Op::Done { session: self.id, seq });
        }
    }

    /// Delivery `seq`, waiting in the store for the client, went to someone else: it is
    /// finished here.
    pub fn hand_off(&mut self, seq: u64) {
        if let Some(disk) = self.offline.as_mut() {
            if let Some(i) = disk.position(|d| d.seq == seq) {
                disk.remove(i);
            }
        }
        self.done(seq);
    }

    /// Delivery `seq` moved to `stage`.
    pub fn stage(&mut self, seq: u64, stage: Stage) {
        if seq != 0 {
            self.submit(Op::Stage { session: self.id, seq, stage });
        }
    }

    /// Inbound QoS 2 packet id received (`pending`) or released.
    pub fn incoming_qos2(&mut self, packet_id: u16, pending: bool) {
        self.submit(Op::IncomingQos2 { session: self.id, packet_id, pending });
    }

    /// Writes the session's metadata.
    pub fn save(&mut self, mut record: SessionRecord) {
        record.id = self.id;
        record.client_id = self.client_id.clone();
        self.submit(Op::Session(record));
    }

    /// The session ended: its data goes.
    pub fn end(&mut self) {
        self.submit(Op::EndSession(self.id));
    }

    /// Moves the deliveries in memory to the disk index (the client went offline).
    pub fn spill(&mut self, items: impl Iterator<Item = Delivery>, limits: Arc<QueueLimits>) {
        let mut items: Vec<OnDisk> =
            items.filter(|d| d.seq != 0).map(|d| OnDisk { seq: d.seq, size: d.size(), qos: d.qos }).collect();
        items.sort_unstable_by_key(|d| d.seq);
        let disk = self.offline.get_or_insert_with(|| Queue::new(limits));
        for item in items {
            disk.push_back(item);
        }
    }

    /// Asks the store for the deliveries on disk, if any wait there.
    pub fn load(&mut self) -> Option<Restore> {
        self.offline.as_ref()?;
        let (reply, rx) = oneshot::channel();
        self.submit(Op::Load { session: self.id, reply });
        Some(rx)
    }
}

/// The persisted delivery a push dropped to make room (0: none).
fn evicted(r: Enqueued) -> u64 {
    match r {
        Enqueued::QueuedDroppedOldest(seq) => seq,
        _ => 0,
    }
}
