//! Takeover in the order the client sent things. A client that sends DISCONNECT on one
//! connection and at once CONNECTs on another must find its DISCONNECT honoured (no will, the
//! session ended or kept as its expiry says), whichever thread happens to read which socket
//! first. So before a CONNECT takes over a session whose connection is still attached, the old
//! connection is asked to handle what its client already sent: it reads what waits on its
//! socket without waiting for more and handles the complete packets (a DISCONNECT there ends
//! it normally), then answers. Only then does the takeover go ahead, if there is still a
//! connection to take over.
//!
//! A plain TCP connection looks at the socket's kernel buffer itself, so nothing it was sent
//! before the new CONNECT arrived is missed. A TLS or WebSocket connection handles what its
//! stream layer has handed up; a QUIC connection answers at once (its streams are read by tasks
//! of their own). A connection that cannot read (held by backpressure) answers at once too.

use std::time::Duration;

use tracing::debug;

use crate::broker::Broker;
use crate::control::ConnControl;

/// How long a CONNECT waits for the old connection's answer; after that the takeover goes
/// ahead (an old connection's task that does not run for this long is not serving anyone).
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// Waits until the connection attached to `client_id`'s session, if there is one, has handled
/// what its client sent so far (or has ended).
pub(crate) async fn wait(broker: &Broker, client_id: &str) {
    let Some(ctl) = broker.attached(client_id) else { return };
    ctl.ask_handover();
    let deadline = tokio::time::sleep(ANSWER_WITHIN);
    tokio::pin!(deadline);
    loop {
        let answered = broker.handovers().notified();
        tokio::pin!(answered);
        // Registered before the look, so an answer between the look and the wait is not lost.
        answered.as_mut().enable();
        // Not "no longer attached": the broker detaches before it ends the session, and a
        // CONNECT between the two would find the session it was about to end.
        if ctl.handed_over() {
            return;
        }
        tokio::select! {
            _ = answered => {}
            _ = &mut deadline => {
                debug!(%client_id, "the connection being taken over did not answer within {ANSWER_WITHIN:?}");
                return;
            }
        }
    }
}

/// A connection asked to hand over has handled what had arrived: the waiting CONNECT goes on.
pub(crate) fn answer(broker: &Broker, ctl: &ConnControl) {
    ctl.hand_over();
    broker.handovers().notify_waiters();
}
