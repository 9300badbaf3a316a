//! Sessions: the state a client keeps across connections, shared between the connection that
//! serves it and every publisher that delivers to it.

mod adaptive;
mod alias;
mod inflight;
mod persist;
mod qos2;
mod queue;
mod small;
mod state;
mod subscriptions;

use std::sync::Arc;
use std::task::Waker;

use once_cell::race::OnceBox;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;

use braid_proto::ByteString;

pub use alias::OutboundAliases;
pub use persist::{Persist, RemoteIds, Restore};
pub use qos2::Qos2Ids;
pub use queue::{Enqueued, Item, OnDisk, Queue, QueueLimits};
pub use state::{Link, Origin, OtherMembers, Outbox, Release, SessionState, Transmit};
pub use subscriptions::Subscriptions;

use crate::message::Delivery;

/// One session. Publishers lock it briefly to enqueue; the connection's writer locks it to
/// encode what is ready. There is no lock above sessions on the publish path.
#[derive(Debug)]
pub struct Session {
    /// Process-unique id (0 is never used; it marks broker-made messages).
    pub id: u64,
    /// Client identifier.
    pub client_id: ByteString,
    state: Mutex<SessionState>,
    /// Publishers held back by this session wait here (made by the first one; one pointer in
    /// every session).
    space: OnceBox<Notify>,
}

/// Sessions whose connections are to be woken for deliveries, gathered on the publish path
/// and woken once its locks are released ([`Wakes::wake_all`], or when dropped). Gathered
/// over a whole read of a publisher's packets, they wake each subscriber's connection once for
/// all the read brought it: it then writes those deliveries together, rather than one at a
/// time as another worker would pick each wake up. A session is in at most one `Wakes` at a
/// time. Remote subscribers' workers (a cluster link's task) are gathered and woken alike.
#[derive(Debug, Default)]
pub struct Wakes {
    sessions: Vec<Arc<Session>>,
    remotes: Vec<Waker>,
}

impl Wakes {
    /// Takes over the sessions and workers of `other`.
    pub fn append(&mut self, other: &mut Wakes) {
        self.sessions.append(&mut other.sessions);
        for waker in other.remotes.drain(..) {
            self.push_remote(waker);
        }
    }

    /// Adds a remote subscriber's worker (once, however often it is added).
    pub fn push_remote(&mut self, waker: Waker) {
        if !self.remotes.iter().any(|w| w.will_wake(&waker)) {
            self.remotes.push(waker);
        }
    }

    /// Wakes the connections of every session, and every worker, gathered so far.
    pub fn wake_all(&mut self) {
        for session in self.sessions.drain(..) {
            session.wake_owed();
        }
        for waker in self.remotes.drain(..) {
            waker.wake();
        }
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        self.wake_all();
    }
}

/// The prefix of the client ids of in-process clients (see
/// [`crate::connection::in_process`]); no client from the network may use it.
pub const IN_PROCESS: &str = "$internal/";

impl Session {
    /// True for the session of an in-process client: it is this node's own in a cluster (its
    /// filters are not announced to the other nodes, and what they forward does not reach it).
    pub fn node_local(&self) -> bool {
        self.client_id.starts_with(IN_PROCESS)
    }

    /// A new offline session.
    pub fn new(id: u64, client_id: ByteString, limits: Arc<QueueLimits>) -> Session {
        Session { id, client_id, state: Mutex::new(SessionState::new(limits)), space: OnceBox::new() }
    }

    /// Locks the state.
    pub fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock()
    }

    /// Offers a delivery at `now`; the attached connection, if any, is to be woken: the
    /// session goes into `wakes` unless it waits in one already. Returns what became of the
    /// delivery and the ticket of the session's latest store change (see [`crate::store`]).
    pub fn deliver(
        self: &Arc<Self>,
        d: Delivery,
        now: std::time::Instant,
        wakes: &mut Wakes,
    ) -> (Enqueued, crate::store::Ticket) {
        let mut st = self.state.lock();
        let r = st.enqueue(d, now);
        let queued = matches!(
            r,
            Enqueued::Queued
                | Enqueued::QueuedOverLimit
                | Enqueued::Paced(_)
                | Enqueued::QueuedDroppedOldest(_)
        );
        if let Some(link) = st.link.as_mut().filter(|_| queued) {
            if !std::mem::replace(&mut link.wake_owed, true) {
                wakes.sessions.push(self.clone());
            }
        }
        (r, st.ticket())
    }

    /// Wakes the attached connection, if any, for the wake it is owed.
    fn wake_owed(&self) {
        let ctl = self.state.lock().link.as_mut().map(|l| {
            l.wake_owed = false;
            l.ctl.clone()
        });
        if let Some(ctl) = ctl {
            ctl.wake();
        }
    }

    /// Waits until this session lets the caller, a publisher it holds back, go on: in turn
    /// as its queue drains, or at once when its client goes away (see
    /// [`SessionState::take_drained`]). Waiting publishers go in the order they began to wait.
    pub async fn wait_for_space(&self) {
        let notified = self.space.get_or_init(Box::default).notified();
        tokio::pin!(notified);
        // In the queue of waiters before it is counted, so a release finds it there.
        notified.as_mut().enable();
        if self.lock().blocks_publishers() {
            notified.await;
        }
    }

    /// Lets publishers waiting in [`Session::wait_for_space`] go on.
    pub fn release_publishers(&self, release: Release) {
        let Some(space) = self.space.get() else { return };
        match release {
            Release::None => {}
            Release::First(n) => (0..n).for_each(|_| space.notify_one()),
            Release::All => space.notify_waiters(),
        }
    }

    /// Disconnects the attached client (0x97 Quota exceeded) if its queue still holds
    /// publishers back: it has not drained for `waited` seconds.
    pub fn evict_slow_consumer(&self, waited: u64) {
        let ctl = {
            let st = self.lock();
            st.link.as_ref().filter(|_| st.blocks_publishers_now()).map(|l| l.ctl.clone())
        };
        // Closed outside the lock: a parked connection's close unparks it.
        if let Some(ctl) = ctl {
            ctl.close_because(
                braid_proto::ReasonCode::QuotaExceeded,
                format!("slow consumer: queue full for {waited} s"),
            );
        }
    }
}
