//! A published message as the broker holds it: one allocation shared by every subscriber.

use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_proto::{ByteString, Bytes, Properties, Publish, QoS};

/// A message on its way through the broker. Topic and payload are zero-copy slices of the
/// publisher's read buffer; every queue holds an `Arc` to the same message.
#[derive(Debug, Clone)]
pub struct Message {
    /// Topic name.
    pub topic: ByteString,
    /// Payload.
    pub payload: Bytes,
    /// QoS the publisher used.
    pub qos: QoS,
    /// RETAIN flag as published.
    pub retain: bool,
    /// Properties forwarded to subscribers (Topic Alias, Subscription Identifiers and Message
    /// Expiry Interval removed; expiry is kept as `expires_at`).
    pub properties: Properties,
    /// When the message expires (v5 Message Expiry Interval).
    pub expires_at: Option<Instant>,
    /// Session id of the publisher (for No Local); 0 for messages the broker makes itself.
    pub origin: u64,
    /// Client id of the publisher (for the `hash_clientid` shared strategy); empty for the broker.
    pub origin_client: ByteString,
    /// For a message another node of a cluster forwarded: who sent it and its number there,
    /// kept when it is passed on again, so that a node that gets it twice knows.
    pub remote_id: Option<RemoteId>,
}

/// A message's identity across the nodes of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RemoteId {
    /// The node (and its incarnation) that first forwarded it.
    pub sender: Arc<str>,
    /// Its number among the messages that node forwarded.
    pub number: u64,
}

impl Message {
    /// Builds a message from an inbound PUBLISH (topic already resolved from any alias).
    pub fn from_publish(p: Publish, now: Instant, origin: u64, origin_client: ByteString) -> Arc<Message> {
        let mut properties = p.properties;
        // Only write when there is something to change: writing boxes empty properties.
        let expires_at = match properties.message_expiry_interval {
            Some(secs) => {
                properties.message_expiry_interval = None;
                Some(now + Duration::from_secs(u64::from(secs)))
            }
            None => None,
        };
        if properties.topic_alias.is_some() {
            properties.topic_alias = None;
        }
        if !properties.subscription_identifiers.is_empty() {
            properties.subscription_identifiers.clear();
        }
        Arc::new(Message {
            topic: p.topic,
            payload: p.payload,
            qos: p.qos,
            retain: p.retain,
            properties,
            expires_at,
            origin,
            origin_client,
            remote_id: None,
        })
    }

    /// A message the broker publishes itself (`$SYS`).
    pub fn internal(topic: ByteString, payload: Bytes, retain: bool) -> Arc<Message> {
        Arc::new(Message {
            topic,
            payload,
            qos: QoS::AtMostOnce,
            retain,
            properties: Properties::default(),
            expires_at: None,
            origin: 0,
            origin_client: ByteString::new(),
            remote_id: None,
        })
    }

    /// True once the Message Expiry Interval has passed.
    pub fn is_expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// Seconds left before expiry, rounded up, for the forwarded Message Expiry Interval.
    pub fn remaining_expiry(&self, now: Instant) -> Option<u32> {
        self.expires_at.map(|at| {
            let left = at.saturating_duration_since(now);
            let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            u32::try_from(secs).unwrap_or(u32::MAX)
        })
    }
}

/// The stream a subscription was made on (MQTT over QUIC multi-stream): the connection's
/// attachment generation and the QUIC stream index. Deliveries go out on that stream while that
/// connection has it open; otherwise (TCP, the control stream, a closed stream, a later
/// connection of the session) on the connection's only or control stream. The default is the
/// control stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StreamTag {
    /// Attachment generation of the connection the stream belongs to (0: none).
    pub generation: u64,
    /// QUIC stream index among the client's bidirectional streams (0: control stream).
    pub stream: u64,
}

/// One message bound for one subscription of one session.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The shared message.
    pub msg: Arc<Message>,
    /// QoS of this delivery: the lower of the message's and the subscription's.
    pub qos: QoS,
    /// RETAIN flag to send.
    pub retain: bool,
    /// Subscription Identifiers of the matching subscriptions (v5).
    pub sub_ids: SubIds,
    /// Sequence number in the store, for a delivery to a persistent session (else 0).
    pub seq: u64,
    /// The stream of the subscription that matched.
    pub stream: StreamTag,
    /// The shared group it was picked from, if it came through a shared subscription: if its
    /// client goes away before acknowledging it, another member may get it instead.
    pub group: Option<Arc<str>>,
}

impl Delivery {
    /// A delivery of `msg` at `qos`, nothing else set (for tests, here and in the crates
    /// built on this one).
    pub fn of(msg: Arc<Message>, qos: QoS) -> Delivery {
        Delivery {
            msg,
            qos,
            retain: false,
            sub_ids: SubIds::default(),
            seq: 0,
            stream: StreamTag::default(),
            group: None,
        }
    }
}

/// The Subscription Identifiers a delivery carries (v5): none or one without an allocation,
/// several (ascending, each once) when overlapping subscriptions were merged into one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubIds(Ids);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ids {
    /// One id, or none as 0 (never a Subscription Identifier).
    One(u32),
    /// Two or more.
    Many(Box<[u32]>),
}

impl SubIds {
    /// The ids.
    pub fn as_slice(&self) -> &[u32] {
        match &self.0 {
            Ids::One(0) => &[],
            Ids::One(id) => std::slice::from_ref(id),
            Ids::Many(ids) => ids,
        }
    }

    /// Adds the ids of `other`.
    pub fn merge(&mut self, other: &SubIds) {
        let mut ids = [self.as_slice(), other.as_slice()].concat();
        ids.sort_unstable();
        ids.dedup();
        *self = ids.into_iter().collect();
    }
}

impl Default for SubIds {
    fn default() -> SubIds {
        SubIds(Ids::One(0))
    }
}

impl From<Option<u32>> for SubIds {
    fn from(id: Option<u32>) -> SubIds {
        SubIds(Ids::One(id.unwrap_or(0)))
    }
}

impl FromIterator<u32> for SubIds {
    /// Collects ids (zeros skipped), allocating only for two or more.
    fn from_iter<I: IntoIterator<Item = u32>>(ids: I) -> SubIds {
        let mut ids = ids.into_iter().filter(|&id| id != 0);
        let Some(first) = ids.next() else { return SubIds::default() };
        match ids.next() {
            None => SubIds(Ids::One(first)),
            Some(second) => SubIds(Ids::Many([first, second].into_iter().chain(ids).collect())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_ids_merge_sorted_without_repeats() {
        assert_eq!(std::mem::size_of::<SubIds>(), 16);
        let mut ids = SubIds::from(Some(7));
        assert_eq!(ids.as_slice(), [7]);
        ids.merge(&SubIds::default());
        assert_eq!(ids, SubIds::from(Some(7)), "no allocation for one id");
        ids.merge(&SubIds::from(Some(2)));
        ids.merge(&[7, 5].into_iter().collect());
        assert_eq!(ids.as_slice(), [2, 5, 7]);
        assert!(SubIds::from(None).as_slice().is_empty());
        assert_eq!([0, 3].into_iter().collect::<SubIds>(), SubIds::from(Some(3)));
    }
}
