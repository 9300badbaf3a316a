//! What the subscription table holds: a subscription and who it delivers to. A subscriber is a
//! session of this broker, or something that is not local — another node of a cluster, a
//! bridge — reached through one interface, [`RemoteSink`]. The core knows nothing of what is
//! behind it: a cluster or bridge crate implements it and subscribes with
//! [`crate::broker::remote::Remotes::subscribe_remote`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use braid_proto::{ReasonCode, SubscriptionOptions};

use crate::message::{Message, StreamTag};
use crate::session::{Enqueued, Session};
use crate::store::Ticket;

/// Which of a remote's subscriptions a forwarded message is for: another node delivers it to
/// its normal subscriptions if `plain`, and to one member of each shared group in `groups`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// A normal (non-shared) subscription matched.
    pub plain: bool,
    /// The shared groups that picked this remote.
    pub groups: Vec<Box<str>>,
}

/// A message for a remote sink: once per message, however many of its subscriptions match.
#[derive(Debug, Clone)]
pub struct Forward {
    /// The message, at the QoS it was published with.
    pub msg: Arc<Message>,
    /// The subscriptions it matched.
    pub scope: Scope,
    /// Its number at this broker (from the counter of session ids), the same for every remote
    /// it goes to: a receiver that gets it twice (by two ways) knows.
    pub id: u64,
}

/// The other side's word on a message a remote subscriber took (a bridge that acknowledges a
/// publisher only once the system it bridges to has the message): resolves to the reason code
/// of the publisher's acknowledgement, Success or, for a v5 publisher, why it failed.
pub struct Confirm(Pin<Box<dyn Future<Output = ReasonCode> + Send>>);

impl Confirm {
    /// A confirmation that `word` gives.
    pub fn new(word: impl Future<Output = ReasonCode> + Send + 'static) -> Confirm {
        Confirm(Box::pin(word))
    }
}

impl Future for Confirm {
    type Output = ReasonCode;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ReasonCode> {
        self.0.as_mut().poll(cx)
    }
}

impl fmt::Debug for Confirm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Confirm")
    }
}

/// What a remote subscriber did with a message.
#[derive(Debug)]
pub struct Delivered {
    /// Queued (taken) or dropped (counted by the broker), as a session's queue would say.
    pub enqueued: Enqueued,
    /// The store ticket the publisher's acknowledgement waits for under sync durability (0:
    /// none), so that nothing is acknowledged before it is durable.
    pub ticket: Ticket,
    /// What the publisher's acknowledgement waits for besides (None for most).
    pub confirm: Option<Confirm>,
}

impl Delivered {
    /// Taken, its acknowledgement waiting for `ticket` only.
    pub fn queued(ticket: Ticket) -> Delivered {
        Delivered { enqueued: Enqueued::Queued, ticket, confirm: None }
    }
}

/// A subscriber that is not a session of this broker.
pub trait RemoteSink: Send + Sync + std::fmt::Debug {
    /// Takes `fwd`, routed at `now`, and says what became of it as a session's queue would:
    /// queued (taken), or dropped (counted by the broker); and what the publisher's
    /// acknowledgement waits for. Holding the publisher back is a session's way only; a remote
    /// sink that cannot take more must queue (an outbox), drop, or make the acknowledgement
    /// wait (a [`Confirm`]).
    fn deliver(&self, fwd: Forward, now: Instant) -> Delivered;

    /// True if it can take a delivery now: a shared group passes a member that cannot over
    /// for one that can.
    fn can_accept(&self) -> bool {
        true
    }

    /// True if it also takes messages another node forwarded here (a relay to the node a
    /// session moved to); others get only what is published here.
    fn relays(&self) -> bool {
        false
    }
}

/// A remote sink with the id the broker gave it ([`crate::broker::remote::Remotes::remote_sink`]),
/// unique among sessions and sinks.
#[derive(Debug, Clone)]
pub struct RemoteRef {
    /// Its id.
    pub id: u64,
    /// The sink.
    pub sink: Arc<dyn RemoteSink>,
}

/// Who a subscription delivers to.
#[derive(Debug, Clone)]
pub enum Subscriber {
    /// A session of this broker.
    Session(Arc<Session>),
    /// Something that is not local (see [`RemoteSink`]). Shared by all its subscriptions: a
    /// cluster node holds one for every other node's filters, so each costs a pointer.
    Remote(Arc<RemoteRef>),
}

impl Subscriber {
    /// Its id: the session's, or the remote sink's.
    pub fn id(&self) -> u64 {
        match self {
            Subscriber::Session(s) => s.id,
            Subscriber::Remote(r) => r.id,
        }
    }

    /// The session, if it is one.
    pub fn session(&self) -> Option<&Arc<Session>> {
        match self {
            Subscriber::Session(s) => Some(s),
            Subscriber::Remote(_) => None,
        }
    }

    /// True if messages another node forwarded here go to it: a session (but for an
    /// in-process client's, see [`Session::node_local`]), or a relay (see
    /// [`RemoteSink::relays`]). Its filters are the ones announced to the other nodes.
    pub fn takes_forwarded(&self) -> bool {
        match self {
            Subscriber::Session(s) => !s.node_local(),
            Subscriber::Remote(r) => r.sink.relays(),
        }
    }

    /// True if it can take a delivery now (see [`RemoteSink::can_accept`]).
    pub fn can_accept(&self) -> bool {
        match self {
            Subscriber::Session(s) => s.lock().can_accept(),
            Subscriber::Remote(r) => r.sink.can_accept(),
        }
    }
}

/// One subscription in the trie.
#[derive(Debug, Clone)]
pub struct SubEntry {
    /// Who it delivers to.
    pub to: Subscriber,
    /// Subscription options.
    pub options: SubscriptionOptions,
    /// v5 Subscription Identifier.
    pub sub_id: Option<u32>,
    /// Merge with the session's other matching subscriptions into one delivery at the highest
    /// QoS: set by the caller for 3.1.x subscriptions, by the router for non-shared ones under
    /// `mqtt.overlapping = "single"`.
    pub merge_overlaps: bool,
    /// How many of the session's other subscriptions some topic matches together with this
    /// one, kept by the router (callers give 0; once at `u16::MAX` it stays there): while 0
    /// it has nothing to merge with.
    pub overlaps: u16,
    /// The stream the subscription was made on (QUIC multi-stream).
    pub stream: StreamTag,
}

impl SubEntry {
    /// A subscription of remote subscriber `to` (never merged, on no stream).
    pub fn remote(to: Arc<RemoteRef>, options: SubscriptionOptions) -> SubEntry {
        SubEntry {
            to: Subscriber::Remote(to),
            options,
            sub_id: None,
            merge_overlaps: false,
            overlaps: 0,
            stream: StreamTag::default(),
        }
    }
}
