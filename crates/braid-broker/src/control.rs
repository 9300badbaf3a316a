//! How one connection is told to close, from its own tasks or from elsewhere (takeover,
//! shutdown).

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use braid_proto::ReasonCode;

/// Close signal of one connection. The first reason given wins; the writer sends it in a v5
/// DISCONNECT before closing the socket.
#[derive(Debug)]
pub struct ConnControl {
    token: CancellationToken,
    reason: Mutex<Option<ReasonCode>>,
}

impl ConnControl {
    /// A control that is also cancelled when `parent` (the server's shutdown token) is.
    pub fn new(parent: &CancellationToken) -> ConnControl {
        ConnControl { token: parent.child_token(), reason: Mutex::new(None) }
    }

    /// Asks the connection to close with `reason`.
    pub fn close(&self, reason: ReasonCode) {
        self.reason.lock().get_or_insert(reason);
        self.token.cancel();
    }

    /// Resolves once a close was asked for.
    pub async fn closed(&self) {
        self.token.cancelled().await
    }

    /// True once a close was asked for.
    pub fn is_closed(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Why the connection closes (server shutdown when no one said).
    pub fn reason(&self) -> ReasonCode {
        self.reason.lock().unwrap_or(ReasonCode::ServerShuttingDown)
    }
}
