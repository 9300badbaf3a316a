//! The handle through which anything outside a connection's task reaches it. Five small state
//! machines make it up, four of them in their own files:
//!
//! - `signal.rs`: the task's wake-up (deliveries ready, a close, a park or handover request);
//! - the close request (here): the first reason given wins;
//! - `liveness.rs`: the clocks and flags the broker's sweep reads (keep alive, idleness,
//!   parking, closing), in a slot of the broker's [`LivenessTable`] rather than here, so that
//!   the sweep scans them without reaching each connection;
//! - `parking.rs`: the parking state of an idle connection (see [`crate::transport::tcp::park`]);
//! - `handover.rs`: a takeover's request to read what already arrived first (see
//!   `connection/handover.rs`).
//!
//! One small struct, so an idle connection waits on a single notification, or on nothing at
//! all once parked.

mod handover;
mod liveness;
mod parking;
mod signal;

use std::borrow::Cow;
use std::sync::Arc;

use once_cell::race::OnceBox;

use braid_proto::{ByteString, ReasonCode};

pub use liveness::{Due, LivenessTable};
pub use parking::Unpark;

use handover::Handover;
use liveness::{Entry, CAN_PARK, CLOSED, HELD, PARKED, PARK_REQUESTED};
use parking::Parking;
use signal::Signal;

/// Why a connection closes: the reason code and a human-readable detail, sent to v5 clients as
/// DISCONNECT's Reason String.
pub type CloseReason = (ReasonCode, Cow<'static, str>);

/// A close request: its reason and, when the client should connect elsewhere, where (the v5
/// DISCONNECT's Server Reference).
#[derive(Debug)]
struct Close {
    reason: CloseReason,
    server_reference: Option<ByteString>,
}

/// Control block of one connection. The first close reason given wins; the connection sends it
/// in a v5 DISCONNECT before closing the socket.
#[derive(Debug)]
pub struct ConnControl {
    signal: Signal,
    reason: OnceBox<Close>,
    live: Entry<ConnControl>,
    parking: Parking,
    handover: Handover,
}

impl ConnControl {
    /// A control for a connection with keep alive `keep_alive_secs` (0 = none), active at
    /// `now_ms` (the broker's clock), watched through a slot of `table` (released when the
    /// control is dropped).
    pub fn new(table: &LivenessTable<ConnControl>, keep_alive_secs: u16, now_ms: u64) -> Arc<ConnControl> {
        Arc::new_cyclic(|this| ConnControl {
            signal: Signal::default(),
            reason: OnceBox::new(),
            live: table.insert(this.clone(), keep_alive_secs, now_ms),
            parking: Parking::default(),
            handover: Handover::default(),
        })
    }

    /// Wakes the connection: deliveries are ready (a wake before it waits is not lost). A
    /// parked connection gets its task back.
    pub fn wake(&self) {
        self.parking.woken();
        self.signal.notify();
        self.unpark();
    }

    /// Waits for [`ConnControl::wake`] or a close.
    pub async fn woken(&self) {
        self.signal.notified().await
    }

    /// Clears the wake flag before the task looks for work, so that a wake arriving after the
    /// look is seen by [`ConnControl::unpark_if_woken`].
    pub fn clear_woken(&self) {
        self.parking.clear_woken();
    }

    // ---- close ----

    /// Asks the connection to close with `reason`, explained by the code's own description.
    pub fn close(&self, reason: ReasonCode) {
        self.close_because(reason, reason.description());
    }

    /// Asks the connection to close with `reason`, explained by `detail`.
    pub fn close_because(&self, reason: ReasonCode, detail: impl Into<Cow<'static, str>>) {
        self.close_to(reason, detail, None);
    }

    /// Asks the connection to close with `reason`, explained by `detail`, telling a v5 client to
    /// connect to `server_reference` instead (DISCONNECT's Server Reference), if given.
    pub fn close_to(
        &self,
        reason: ReasonCode,
        detail: impl Into<Cow<'static, str>>,
        server_reference: Option<ByteString>,
    ) {
        let _ = self.reason.set(Box::new(Close { reason: (reason, detail.into()), server_reference }));
        self.live.set(CLOSED);
        self.wake();
    }

    /// True once a close was asked for.
    pub fn is_closed(&self) -> bool {
        self.live.is(CLOSED)
    }

    /// Why the connection closes (server shutdown when no one said).
    pub fn reason(&self) -> ReasonCode {
        self.reason.get().map_or(ReasonCode::ServerShuttingDown, |c| c.reason.0)
    }

    /// Why the connection closes, with its detail.
    pub fn reason_with_detail(&self) -> CloseReason {
        self.reason
            .get()
            .map(|c| c.reason.clone())
            .unwrap_or((ReasonCode::ServerShuttingDown, Cow::Borrowed("server shutting down")))
    }

    /// Where the client should connect instead, if the close named a server.
    pub fn server_reference(&self) -> Option<ByteString> {
        self.reason.get().and_then(|c| c.server_reference.clone())
    }

    // ---- activity ----

    /// Bytes arrived at `now_ms`.
    pub fn touch(&self, now_ms: u64) {
        self.live.read(now_ms);
    }

    /// Bytes were written at `now_ms`.
    pub fn wrote(&self, now_ms: u64) {
        self.live.wrote(now_ms);
    }

    /// Marks the connection as held by backpressure (or no longer, at `now_ms`).
    pub fn set_held(&self, held: bool, now_ms: u64) {
        if held {
            self.live.set(HELD);
        } else {
            self.live.clear(HELD);
        }
        self.live.read(now_ms);
    }

    /// Closes the connection (0x8D) if nothing arrived for 1.5 times its keep alive (and it is
    /// not held by backpressure or closing already).
    pub fn expire_if_silent(&self, now_ms: u64) {
        if let Some(detail) = self.live.keep_alive_expired(now_ms) {
            self.close_because(ReasonCode::KeepAliveTimeout, detail);
        }
    }

    // ---- parking ----

    /// Lets this connection park in `lot` when idle.
    pub fn allow_parking(&self, lot: Arc<dyn Unpark>) {
        self.parking.allow(lot);
        self.live.set(CAN_PARK);
    }

    /// Asks an idle connection's task to park: it has been silent both ways for `after_ms`
    /// (and is not held, closing or parked already).
    pub fn request_park_if_idle(&self, now_ms: u64, after_ms: u64) {
        if self.live.idle_for(now_ms, after_ms) && self.live.set(PARK_REQUESTED) {
            self.signal.notify();
        }
    }

    /// True (once) if the sweeper asked this connection to park.
    pub fn take_park_request(&self) -> bool {
        self.live.clear(PARK_REQUESTED)
    }

    /// Records that the connection is parked under `key`.
    pub fn set_parked(&self, key: u32) {
        // Flagged before the key is set, so an unpark (which needs the key) clears it after.
        self.live.set(PARKED);
        self.parking.set(key);
    }

    /// Takes back a park that failed; false if a waker already claimed it.
    pub fn clear_parked(&self, key: u32) -> bool {
        let cleared = self.parking.clear(key);
        if cleared {
            self.live.clear(PARKED);
        }
        cleared
    }

    /// Unparks the connection if a wake came since the task last looked for work.
    pub fn unpark_if_woken(&self) {
        if self.parking.was_woken() {
            self.unpark();
        }
    }

    /// Gives a parked connection its task back (once, whoever calls).
    pub fn unpark(&self) {
        if let Some(key) = self.parking.take() {
            self.live.clear(PARKED);
            self.parking.resume(key);
        }
    }

    // ---- handover ----

    /// Asks the connection to handle what its client already sent before a new connection
    /// takes its session over; [`ConnControl::handed_over`] says when it has.
    pub fn ask_handover(&self) {
        self.handover.ask();
        self.wake();
    }

    /// True while a takeover waits for this connection (see [`ConnControl::ask_handover`]).
    pub fn handover_asked(&self) -> bool {
        self.handover.is_asked()
    }

    /// The connection has handled what its client sent before it was asked to hand over, or
    /// the broker has finished with it (its disconnect handled, session ended or kept, or it
    /// was taken over): a CONNECT waiting in `connection/handover.rs` may go on.
    pub fn hand_over(&self) {
        self.handover.done();
    }

    /// True once the connection answered [`ConnControl::ask_handover`] or the broker finished
    /// with it.
    pub fn handed_over(&self) -> bool {
        self.handover.is_done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_closes_with_0x8d_once_and_the_first_reason_wins() {
        let ctl = ConnControl::new(&LivenessTable::default(), 1, 5 << 32);
        ctl.expire_if_silent((5 << 32) + 1499);
        assert!(!ctl.is_closed());
        ctl.expire_if_silent((5 << 32) + 1500);
        assert_eq!(ctl.reason(), ReasonCode::KeepAliveTimeout);
        ctl.close(ReasonCode::SessionTakenOver);
        assert_eq!(ctl.reason(), ReasonCode::KeepAliveTimeout, "the first reason wins");
        assert_eq!(ctl.server_reference(), None);
    }

    #[test]
    fn a_close_can_name_another_server_and_the_first_close_still_wins() {
        let ctl = ConnControl::new(&LivenessTable::default(), 0, 0);
        ctl.close_to(ReasonCode::UseAnotherServer, "draining", Some("10.0.0.6:1883".into()));
        ctl.close_to(ReasonCode::AdministrativeAction, "kicked", Some("elsewhere:1".into()));
        assert_eq!(ctl.reason_with_detail(), (ReasonCode::UseAnotherServer, Cow::Borrowed("draining")));
        assert_eq!(ctl.server_reference().as_deref(), Some("10.0.0.6:1883"));
    }
}
