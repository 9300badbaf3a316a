//! The bounded per-session queue of deliveries waiting for the in-flight window or for the
//! client to come back.

use std::collections::VecDeque;

use braid_proto::QoS;

use crate::config::OverflowPolicy;
use crate::message::Delivery;

/// Limits of one session's queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    /// Maximum queued deliveries.
    pub max_messages: usize,
    /// Queue QoS 0 messages while the client is offline.
    pub queue_qos0: bool,
    /// What to drop when full.
    pub overflow: OverflowPolicy,
}

/// What happened to a delivery offered to a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Queued.
    Queued,
    /// Queued, and the oldest queued delivery was dropped to make room.
    QueuedDroppedOldest,
    /// Not queued: the queue is full.
    DroppedFull,
    /// Not queued: QoS 0 for an offline session that does not queue QoS 0.
    SkippedOffline,
}

/// A FIFO of deliveries with a length bound and an overflow policy.
#[derive(Debug)]
pub struct Queue {
    items: VecDeque<Delivery>,
    limits: QueueLimits,
}

impl Queue {
    /// An empty queue.
    pub fn new(limits: QueueLimits) -> Queue {
        Queue { items: VecDeque::new(), limits }
    }

    /// Offers a delivery; `online` tells whether a client is connected.
    pub fn push(&mut self, d: Delivery, online: bool) -> Enqueued {
        if !online && d.qos == QoS::AtMostOnce && !self.limits.queue_qos0 {
            return Enqueued::SkippedOffline;
        }
        if self.items.len() < self.limits.max_messages {
            self.items.push_back(d);
            return Enqueued::Queued;
        }
        match self.limits.overflow {
            OverflowPolicy::DropNewest => Enqueued::DroppedFull,
            OverflowPolicy::DropOldest if self.limits.max_messages == 0 => Enqueued::DroppedFull,
            OverflowPolicy::DropOldest => {
                self.items.pop_front();
                self.items.push_back(d);
                Enqueued::QueuedDroppedOldest
            }
        }
    }

    /// True when another push would overflow.
    pub fn is_full(&self) -> bool {
        self.items.len() >= self.limits.max_messages
    }

    /// The oldest delivery, if any.
    pub fn front(&self) -> Option<&Delivery> {
        self.items.front()
    }

    /// Removes the oldest delivery.
    pub fn pop(&mut self) -> Option<Delivery> {
        self.items.pop_front()
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
    pub fn drop_qos0(&mut self) -> usize {
        let before = self.items.len();
        if !self.limits.queue_qos0 {
            self.items.retain(|d| d.qos != QoS::AtMostOnce);
        }
        before - self.items.len()
    }
}
