//! How one connection is told to close, from its own tasks or from elsewhere (takeover,
//! shutdown).

use std::borrow::Cow;

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

use braid_proto::ReasonCode;

/// Why a connection closes: the reason code and a human-readable detail, sent to v5 clients as
/// DISCONNECT's Reason String.
pub type CloseReason = (ReasonCode, Cow<'static, str>);

/// Close signal of one connection. The first reason given wins; the connection sends it in a v5
/// DISCONNECT before closing the socket.
#[derive(Debug, Default)]
pub struct ConnControl {
    closed: AtomicBool,
    notify: Notify,
    reason: Mutex<Option<CloseReason>>,
}

impl ConnControl {
    /// A control for a new connection.
    pub fn new() -> ConnControl {
        ConnControl::default()
    }

    /// Asks the connection to close with `reason`, explained by the code's own description.
    pub fn close(&self, reason: ReasonCode) {
        self.close_because(reason, reason.description());
    }

    /// Asks the connection to close with `reason`, explained by `detail`.
    pub fn close_because(&self, reason: ReasonCode, detail: impl Into<Cow<'static, str>>) {
        self.reason.lock().get_or_insert_with(|| (reason, detail.into()));
        self.closed.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Resolves once a close was asked for.
    pub async fn closed(&self) {
        loop {
            // A `Notified` sees every notify_waiters() from its creation on, so checking the
            // flag after creating it cannot miss a close.
            let notified = self.notify.notified();
            if self.is_closed() {
                return;
            }
            notified.await;
        }
    }

    /// True once a close was asked for.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Why the connection closes (server shutdown when no one said).
    pub fn reason(&self) -> ReasonCode {
        self.reason.lock().as_ref().map_or(ReasonCode::ServerShuttingDown, |r| r.0)
    }

    /// Why the connection closes, with its detail.
    pub fn reason_with_detail(&self) -> CloseReason {
        let r = self.reason.lock();
        r.clone().unwrap_or((ReasonCode::ServerShuttingDown, Cow::Borrowed("server shutting down")))
    }
}
