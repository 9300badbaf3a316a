//! What the subscription table holds: a subscription and who it delivers to. A subscriber is a
//! session of this broker, or something that is not local — another node of a cluster, a
//! bridge — reached through one interface, [`RemoteSink`]. The core knows nothing of what is
//! behind it: a cluster or bridge crate implements it and subscribes with
//! [`crate::broker::remote::Remotes::subscribe_remote`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use braid_proto::{ReasonCode, SubscriptionOptions};
use parking_lot::Mutex;

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
pub struct Confirm(Word);

/// Where a [`Confirm`]'s word comes from.
enum Word {
    /// A future of its own.
    Future(Pin<Box<dyn Future<Output = ReasonCode> + Send>>),
    /// A [`Watermark`] passing a number.
    Passing(Arc<Watermark>, u64),
}

impl Confirm {
    /// A confirmation that `word` gives.
    pub fn new(word: impl Future<Output = ReasonCode> + Send + 'static) -> Confirm {
        Confirm(Word::Future(Box::pin(word)))
    }

    /// A confirmation given once `mark` passes `n`: Success, or UnspecifiedError if the mark
    /// is closed first. Costs no allocation: what a remote that confirms many messages in
    /// order (a cluster link) hands out per message.
    pub fn passing(mark: Arc<Watermark>, n: u64) -> Confirm {
        Confirm(Word::Passing(mark, n))
    }
}

impl Future for Confirm {
    type Output = ReasonCode;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ReasonCode> {
        match &mut self.0 {
            Word::Future(f) => f.as_mut().poll(cx),
            Word::Passing(mark, n) => mark.poll_passed(*n, cx),
        }
    }
}

impl fmt::Debug for Confirm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Confirm")
    }
}

/// A count that only rises, and the tasks that wait for it to pass their number: one per
/// sequence of messages confirmed in order (a cluster link's), so that a confirmation is a
/// number, not a channel.
#[derive(Debug, Default)]
pub struct Watermark {
    /// Every number below this one is confirmed.
    reached: AtomicU64,
    /// No number is confirmed any more.
    closed: AtomicBool,
    waiting: Mutex<Vec<Waker>>,
}

impl Watermark {
    /// Confirms every number below `to`, and wakes those that wait.
    pub fn raise(&self, to: u64) {
        if self.reached.fetch_max(to, Ordering::AcqRel) < to {
            self.wake_all();
        }
    }

    /// Confirms nothing more: those waiting for a number not reached get UnspecifiedError.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake_all();
    }

    fn wake_all(&self) {
        for waker in std::mem::take(&mut *self.waiting.lock()) {
            waker.wake();
        }
    }

    fn poll_passed(&self, n: u64, cx: &mut Context<'_>) -> Poll<ReasonCode> {
        let word = || match () {
            _ if self.reached.load(Ordering::Acquire) > n => Some(ReasonCode::Success),
            _ if self.closed.load(Ordering::Acquire) => Some(ReasonCode::UnspecifiedError),
            _ => None,
        };
        if let Some(reason) = word() {
            return Poll::Ready(reason);
        }
        {
            let mut waiting = self.waiting.lock();
            if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                waiting.push(cx.waker().clone());
            }
        }
        // Raised (or closed) between the first look and the registration: its wake-up may
        // have missed the waker.
        word().map_or(Poll::Pending, Poll::Ready)
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
    /// The remote's worker, to be woken for this message once the publisher's read is done
    /// and the router's lock released (see [`crate::session::Wakes`]); None if it needs no
    /// wake-up (it is awake, or works otherwise).
    pub wake: Option<Waker>,
}

impl Delivered {
    /// Taken, its acknowledgement waiting for `ticket` only.
    pub fn queued(ticket: Ticket) -> Delivered {
        Delivered { enqueued: Enqueued::Queued, ticket, confirm: None, wake: None }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Counter(AtomicU64);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn poll(confirm: &mut Confirm, waker: &Waker) -> Poll<ReasonCode> {
        Pin::new(confirm).poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn a_confirmation_comes_once_the_watermark_passes_its_number() {
        let mark = Arc::new(Watermark::default());
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(counter.clone());
        let mut third = Confirm::passing(mark.clone(), 2);
        assert_eq!(poll(&mut third, &waker), Poll::Pending);
        mark.raise(2);
        assert_eq!(counter.0.load(Ordering::Relaxed), 1, "woken when the mark rose");
        assert_eq!(poll(&mut third, &waker), Poll::Pending, "2 is not passed before 3");
        mark.raise(1);
        assert_eq!(counter.0.load(Ordering::Relaxed), 1, "a lower mark neither lowers it nor wakes");
        mark.raise(3);
        assert_eq!(poll(&mut third, &waker), Poll::Ready(ReasonCode::Success));
        let mut first = Confirm::passing(mark.clone(), 0);
        assert_eq!(poll(&mut first, &waker), Poll::Ready(ReasonCode::Success));
    }

    #[test]
    fn a_closed_watermark_fails_what_it_did_not_reach() {
        let mark = Arc::new(Watermark::default());
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(counter.clone());
        let (mut reached, mut not) = (Confirm::passing(mark.clone(), 4), Confirm::passing(mark.clone(), 5));
        assert_eq!(poll(&mut not, &waker), Poll::Pending);
        mark.raise(5);
        mark.close();
        assert!(counter.0.load(Ordering::Relaxed) >= 1);
        assert_eq!(poll(&mut reached, &waker), Poll::Ready(ReasonCode::Success));
        assert_eq!(poll(&mut not, &waker), Poll::Ready(ReasonCode::UnspecifiedError));
    }
}
