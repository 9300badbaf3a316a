//! Sessions: the state a client keeps across connections, shared between the connection that
//! serves it and every publisher that delivers to it.

mod alias;
mod inflight;
mod queue;
mod state;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;

use braid_proto::ByteString;

pub use alias::OutboundAliases;
pub use queue::{Enqueued, QueueLimits};
pub use state::{Link, SessionState, SubscriptionRecord, Transmit};

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
    wake: Notify,
}

impl Session {
    /// A new offline session.
    pub fn new(id: u64, client_id: ByteString, limits: QueueLimits) -> Session {
        Session { id, client_id, state: Mutex::new(SessionState::new(limits)), wake: Notify::new() }
    }

    /// Locks the state.
    pub fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock()
    }

    /// Wakes the attached connection's writer.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Waits until [`Session::wake`] is called (a call made before waiting is not lost).
    pub async fn woken(&self) {
        self.wake.notified().await
    }

    /// Offers a delivery and wakes the writer if the client is online.
    pub fn deliver(&self, d: Delivery) -> Enqueued {
        let mut st = self.state.lock();
        let r = st.enqueue(d);
        let online = st.is_online();
        drop(st);
        if online && matches!(r, Enqueued::Queued | Enqueued::QueuedDroppedOldest) {
            self.wake.notify_one();
        }
        r
    }
}
