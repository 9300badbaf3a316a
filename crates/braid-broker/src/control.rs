//! How one connection is told to close, from its own tasks or from elsewhere (takeover,
//! shutdown).

use std::borrow::Cow;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use braid_proto::ReasonCode;

/// Why a connection closes: the reason code and a human-readable detail, sent to v5 clients as
/// DISCONNECT's Reason String.
pub type CloseReason = (ReasonCode, Cow<'static, str>);

/// Close signal of one connection. The first reason given wins; the connection sends it in a v5
/// DISCONNECT before closing the socket.
#[derive(Debug)]
pub struct ConnControl {
    token: CancellationToken,
    reason: Mutex<Option<CloseReason>>,
}

impl ConnControl {
    /// A control that is also cancelled when `parent` (the server's shutdown token) is.
    pub fn new(parent: &CancellationToken) -> ConnControl {
        ConnControl { token: parent.child_token(), reason: Mutex::new(None) }
    }

    /// Asks the connection to close with `reason`, explained by the code's own description.
    pub fn close(&self, reason: ReasonCode) {
        self.close_because(reason, reason.description());
    }

    /// Asks the connection to close with `reason`, explained by `detail`.
    pub fn close_because(&self, reason: ReasonCode, detail: impl Into<Cow<'static, str>>) {
        self.reason.lock().get_or_insert_with(|| (reason, detail.into()));
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
        self.reason.lock().as_ref().map_or(ReasonCode::ServerShuttingDown, |r| r.0)
    }

    /// Why the connection closes, with its detail.
    pub fn reason_with_detail(&self) -> CloseReason {
        let r = self.reason.lock();
        r.clone().unwrap_or((ReasonCode::ServerShuttingDown, Cow::Borrowed("server shutting down")))
    }
}
