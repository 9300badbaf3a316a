//! The bounded per-session queue of deliveries waiting for the in-flight window or for the
//! client to come back, bounded in messages and in bytes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_proto::QoS;

use crate::config::{OverflowPolicy, QueuePolicy, SessionConfig};
use crate::message::Delivery;

/// Limits of one session's queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    /// Maximum queued deliveries.
    pub max_messages: usize,
    /// Maximum queued bytes (topic plus payload of each delivery).
    pub max_bytes: usize,
    /// Queue QoS 0 messages while the client is offline.
    pub queue_qos0: bool,
    /// What to do with a QoS 1/2 delivery when full.
    pub overflow: OverflowPolicy,
    /// What to do with a QoS 0 delivery when full (never `Backpressure`).
    pub overflow_qos0: OverflowPolicy,
    /// How long a connected client that falls behind may pace QoS 0 publishers (zero: never).
    pub qos0_pacing: Duration,
    /// The delivery window adapts to how fast the client acknowledges, and a backlog beyond it
    /// holds publishers back, so that a slow client's messages wait in its queue rather than
    /// in front of it (docs/flow-control.md). False for an outbox (a bridge's session), whose
    /// client acknowledges at the pace of another system: its window is its Receive Maximum,
    /// and its queue fills up to its limits before anything holds publishers.
    pub adaptive: bool,
}

impl QueueLimits {
    /// The limits `[session]` configures.
    pub fn from_config(s: &SessionConfig) -> QueueLimits {
        QueueLimits::with_policy(s, &QueuePolicy::default())
    }

    /// The limits `[session]` configures, with `policy`'s overrides.
    pub fn with_policy(s: &SessionConfig, policy: &QueuePolicy) -> QueueLimits {
        QueueLimits {
            max_messages: s.max_queued_messages,
            max_bytes: s.max_queued_bytes,
            queue_qos0: s.queue_qos0,
            overflow: policy.queue_overflow.unwrap_or(s.queue_overflow),
            overflow_qos0: policy.queue_overflow_qos0.unwrap_or(s.queue_overflow_qos0),
            qos0_pacing: Duration::from_millis(policy.qos0_pacing_ms.unwrap_or(s.qos0_pacing_ms)),
            adaptive: true,
        }
    }
}

/// What happened to a delivery offered to a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Queued.
    Queued,
    /// Queued beyond the limit: the publisher must wait until the queue drains (backpressure).
    QueuedOverLimit,
    /// Queued (QoS 0) for a connected client that is behind: the publisher is paced, waiting
    /// until the queue drains but no later than this.
    Paced(Instant),
    /// Queued, and the oldest queued delivery was dropped to make room (the sequence number of
    /// the dropped delivery if it was persisted, else 0).
    QueuedDroppedOldest(u64),
    /// Not queued: the queue is full.
    DroppedFull,
    /// Not queued: QoS 0 for an offline session that does not queue QoS 0.
    SkippedOffline,
}

/// What a queue holds: a delivery in memory, or the index entry of one on disk.
pub trait Item {
    /// Bytes it counts against the byte limit.
    fn size(&self) -> usize;
    /// Its QoS.
    fn qos(&self) -> QoS;
    /// Its store sequence number (0 when not persisted).
    fn seq(&self) -> u64;
}

impl Item for Delivery {
    fn size(&self) -> usize {
        self.msg.topic.len() + self.msg.payload.len()
    }
    fn qos(&self) -> QoS {
        self.qos
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// A delivery of an offline persistent session that lives on disk: only this stays in memory.
#[derive(Debug, Clone, Copy)]
pub struct OnDisk {
    /// Store sequence number.
    pub seq: u64,
    /// Bytes of topic and payload.
    pub size: usize,
    /// QoS.
    pub qos: QoS,
}

impl Item for OnDisk {
    fn size(&self) -> usize {
        self.size
    }
    fn qos(&self) -> QoS {
        self.qos
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// A FIFO of deliveries with length and byte bounds and an overflow policy.
#[derive(Debug)]
pub struct Queue<T = Delivery> {
    items: VecDeque<T>,
    bytes: usize,
    limits: Arc<QueueLimits>,
}

fn size<T: Item>(d: &T) -> usize {
    d.size()
}

impl<T: Item> Queue<T> {
    /// An empty queue.
    pub fn new(limits: Arc<QueueLimits>) -> Queue<T> {
        Queue { items: VecDeque::new(), bytes: 0, limits }
    }

    /// The limits.
    pub fn limits(&self) -> &Arc<QueueLimits> {
        &self.limits
    }

    /// Applies other limits from now on (what is queued stays).
    pub fn set_limits(&mut self, limits: Arc<QueueLimits>) {
        self.limits = limits;
    }

    /// Offers a delivery; `online` tells whether a client is connected. Backpressure needs a
    /// client that drains the queue, so an offline session drops the newest instead.
    pub fn push(&mut self, d: T, online: bool) -> Enqueued {
        let qos0 = d.qos() == QoS::AtMostOnce;
        if !online && qos0 && !self.limits.queue_qos0 {
            return Enqueued::SkippedOffline;
        }
        if !self.is_full() {
            self.push_back(d);
            return Enqueued::Queued;
        }
        let policy = if qos0 { self.limits.overflow_qos0 } else { self.limits.overflow };
        match policy {
            OverflowPolicy::Backpressure if online => {
                self.push_back(d);
                Enqueued::QueuedOverLimit
            }
            OverflowPolicy::Backpressure | OverflowPolicy::DropNewest => Enqueued::DroppedFull,
            OverflowPolicy::DropOldest => match self.pop() {
                Some(old) => {
                    self.push_back(d);
                    Enqueued::QueuedDroppedOldest(old.seq())
                }
                None => Enqueued::DroppedFull,
            },
        }
    }

    /// Appends without looking at the limits.
    pub fn push_back(&mut self, d: T) {
        self.bytes += size(&d);
        self.items.push_back(d);
    }

    /// Puts `items`, older than everything queued, in front.
    pub fn push_front_all(&mut self, items: Vec<T>) {
        self.bytes += items.iter().map(size).sum::<usize>();
        let rest = std::mem::take(&mut self.items);
        self.items = items.into_iter().chain(rest).collect();
    }

    /// Gives back the room that more items needed before: what a burst of deliveries left
    /// allocated in a queue that is now idle.
    pub fn shrink_to_fit(&mut self) {
        self.items.shrink_to_fit();
    }

    /// Takes every item out.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.bytes = 0;
        self.items.drain(..)
    }

    /// True when the queue is at or over either limit.
    pub fn is_full(&self) -> bool {
        self.items.len() >= self.limits.max_messages || self.bytes >= self.limits.max_bytes
    }

    /// True once the queue has drained to three quarters of both limits: publishers held by
    /// backpressure may go on (the gap keeps them from being woken for every single message).
    pub fn is_drained(&self) -> bool {
        let low = |max: usize| max - max / 4;
        self.items.len() < low(self.limits.max_messages).max(1)
            && self.bytes < low(self.limits.max_bytes).max(1)
    }

    /// The oldest delivery, if any.
    pub fn front(&self) -> Option<&T> {
        self.items.front()
    }

    /// Index of the oldest delivery that satisfies `pred`.
    pub fn position(&self, pred: impl FnMut(&T) -> bool) -> Option<usize> {
        self.items.iter().position(pred)
    }

    /// The delivery at `index` (0 is the oldest).
    pub fn get(&self, index: usize) -> Option<&T> {
        self.items.get(index)
    }

    /// Removes the delivery at `index` (0 is the oldest).
    pub fn remove(&mut self, index: usize) -> Option<T> {
        let d = self.items.remove(index)?;
        self.bytes -= size(&d);
        Some(d)
    }

    /// Takes out the deliveries `pred` picks, oldest first.
    pub fn take_where(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let (taken, kept): (Vec<T>, Vec<T>) = self.items.drain(..).partition(|d| pred(d));
        self.items = kept.into();
        self.bytes = self.items.iter().map(size).sum();
        taken
    }

    /// Removes the oldest delivery.
    pub fn pop(&mut self) -> Option<T> {
        let d = self.items.pop_front()?;
        self.bytes -= size(&d);
        Some(d)
    }

    /// Number of queued deliveries.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Drops every queued QoS 0 delivery (a client went offline and QoS 0 is not kept).
    pub fn drop_qos0(&mut self) {
        if !self.limits.queue_qos0 {
            self.items.retain(|d| d.qos() != QoS::AtMostOnce);
            self.bytes = self.items.iter().map(size).sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use braid_proto::{ByteString, Bytes};

    fn limits(overflow: OverflowPolicy) -> Arc<QueueLimits> {
        let config = SessionConfig {
            max_queued_messages: 4,
            max_queued_bytes: 1000,
            queue_overflow: overflow,
            ..Default::default()
        };
        Arc::new(QueueLimits::from_config(&config))
    }

    fn d(qos: QoS, payload: usize) -> Delivery {
        let msg = Message::internal(ByteString::from_static("t"), Bytes::from(vec![0; payload]), false);
        Delivery::of(msg, qos)
    }

    #[test]
    fn an_emptied_queue_gives_back_its_room() {
        let mut q = Queue::new(limits(OverflowPolicy::DropNewest));
        for _ in 0..3 {
            q.push(d(QoS::AtLeastOnce, 1), true);
        }
        while q.pop().is_some() {}
        assert!(q.items.capacity() >= 3, "popping keeps the room");
        q.shrink_to_fit();
        assert_eq!(q.items.capacity(), 0);
    }

    #[test]
    fn backpressure_queues_over_the_limit_while_online_and_drops_while_offline() {
        let mut q = Queue::new(limits(OverflowPolicy::Backpressure));
        for _ in 0..4 {
            assert_eq!(q.push(d(QoS::AtLeastOnce, 9), true), Enqueued::Queued);
        }
        assert_eq!(q.push(d(QoS::AtLeastOnce, 9), true), Enqueued::QueuedOverLimit);
        assert_eq!(q.push(d(QoS::AtMostOnce, 9), true), Enqueued::DroppedFull, "QoS 0 never blocks");
        assert_eq!(q.push(d(QoS::AtLeastOnce, 9), false), Enqueued::DroppedFull);
        assert_eq!(q.len(), 5);
    }

    #[test]
    fn byte_limit_counts_topic_and_payload() {
        let mut q = Queue::new(limits(OverflowPolicy::DropNewest));
        assert_eq!(q.push(d(QoS::AtLeastOnce, 998), true), Enqueued::Queued);
        assert!(!q.is_full(), "999 of 1000 bytes");
        assert_eq!(q.push(d(QoS::AtLeastOnce, 0), true), Enqueued::Queued);
        assert!(q.is_full());
        assert_eq!(q.push(d(QoS::AtLeastOnce, 0), true), Enqueued::DroppedFull);
        q.pop();
        assert!(!q.is_full());
    }

    #[test]
    fn drained_has_hysteresis() {
        let mut q = Queue::new(limits(OverflowPolicy::Backpressure));
        for _ in 0..5 {
            q.push(d(QoS::AtLeastOnce, 1), true);
        }
        q.pop();
        q.pop();
        assert!(!q.is_full() && !q.is_drained(), "3 of 4: room, but not drained to 3/4 yet");
        q.pop();
        assert!(q.is_drained());
    }

    #[test]
    fn drop_oldest_makes_room() {
        let mut q = Queue::new(limits(OverflowPolicy::DropOldest));
        for i in 0..6 {
            q.push(d(QoS::AtLeastOnce, i), false);
        }
        assert_eq!(q.len(), 4);
        assert_eq!(q.front().unwrap().msg.payload.len(), 2);
    }
}
