//! Where a takeover's request to a connection stands (see [`crate::connection::handover`]).

use std::sync::atomic::{AtomicU8, Ordering};

/// No request, or the last one answered.
const NONE: u8 = 0;
/// A new connection of this client waits for this one to read what arrived.
const ASKED: u8 = 1;
/// The connection has handled what had arrived when it was asked, or its session is done with
/// it (disconnect handled, or taken over).
const DONE: u8 = 2;

/// A connection's handover state: none -> asked -> done (or none -> done).
#[derive(Debug, Default)]
pub(super) struct Handover(AtomicU8);

impl Handover {
    /// Asks; a connection already done stays done.
    pub(super) fn ask(&self) {
        let _ = self.0.compare_exchange(NONE, ASKED, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// True while asked and not answered.
    pub(super) fn is_asked(&self) -> bool {
        self.0.load(Ordering::SeqCst) == ASKED
    }

    /// Answered, or the broker is done with the connection.
    pub(super) fn done(&self) {
        self.0.store(DONE, Ordering::SeqCst);
    }

    /// True once [`Handover::done`].
    pub(super) fn is_done(&self) -> bool {
        self.0.load(Ordering::SeqCst) == DONE
    }
}
