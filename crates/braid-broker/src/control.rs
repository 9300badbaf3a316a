//! The handle through which anything outside a connection's task reaches it: a wake-up when
//! deliveries are ready, a close request (takeover, shutdown, eviction, keep-alive expiry), the
//! activity clocks the broker's sweeper reads, the parking state of an idle connection
//! (see [`crate::park`]) and a takeover's request to read what already arrived first (see
//! [`crate::handover`]). One small struct, so an idle connection waits on a single
//! notification, or on nothing at all once parked.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use futures_util::task::AtomicWaker;
use once_cell::race::OnceBox;

use braid_proto::ReasonCode;

use crate::park::ParkingLot;

/// `parked` when the connection has a task.
const NOT_PARKED: usize = usize::MAX;

/// `handover`: no request, or the last one answered.
const HANDOVER_NONE: u8 = 0;
/// `handover`: a new connection of this client waits for this one to read what arrived.
const HANDOVER_ASKED: u8 = 1;
/// `handover`: the connection has handled what had arrived when it was asked, or its session
/// is done with it (disconnect handled, or taken over).
const HANDOVER_DONE: u8 = 2;

/// Why a connection closes: the reason code and a human-readable detail, sent to v5 clients as
/// DISCONNECT's Reason String.
pub type CloseReason = (ReasonCode, Cow<'static, str>);

/// Control block of one connection. The first close reason given wins; the connection sends it
/// in a v5 DISCONNECT before closing the socket.
#[derive(Debug)]
pub struct ConnControl {
    signal: Signal,
    closed: AtomicBool,
    reason: OnceBox<CloseReason>,
    /// Milliseconds (on the broker's clock, kept modulo 2^32: see [`since`]) when bytes last
    /// arrived.
    last_activity_ms: AtomicU32,
    /// Milliseconds when bytes last arrived or were written.
    last_io_ms: AtomicU32,
    /// Silence allowed before the keep alive expires (1.5 x keep alive); 0 = no keep alive.
    grace_ms: u32,
    /// The connection is held by backpressure: its silence is not the client's fault.
    held: AtomicBool,
    /// Set by every [`ConnControl::wake`]; cleared by the task when it looks for work.
    woken: AtomicBool,
    /// The sweeper asked the task to park if it is idle.
    park_requested: AtomicBool,
    /// The parking lot's key while parked, else `NOT_PARKED`.
    parked: AtomicUsize,
    /// Where a takeover's request stands (`HANDOVER_*`).
    handover: AtomicU8,
    /// Where the connection parks; set once its transport can park.
    lot: OnceLock<Arc<ParkingLot>>,
}

/// The wake-up of a connection's one task: a pending flag, so a wake before the task waits is
/// not lost, and the waiting task's waker. Waiting costs an atomic swap and, when nothing is
/// pending, registering the waker (no lock, unlike a `Notify`, whose waiter list every wait
/// of every connection would lock twice).
#[derive(Debug, Default)]
struct Signal {
    pending: AtomicBool,
    waker: AtomicWaker,
}

impl Signal {
    /// Sets the flag and wakes the waiting task, if any.
    fn notify(&self) {
        self.pending.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Waits until the flag is set, and clears it. Only one task may wait at a time.
    async fn notified(&self) {
        std::future::poll_fn(|cx| {
            if self.pending.swap(false, Ordering::Acquire) {
                return std::task::Poll::Ready(());
            }
            self.waker.register(cx.waker());
            // A notify between the first look and the registration would be missed otherwise.
            if self.pending.swap(false, Ordering::AcqRel) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await
    }
}

impl ConnControl {
    /// A control for a connection with keep alive `keep_alive_secs` (0 = none), active at
    /// `now_ms`.
    pub fn new(keep_alive_secs: u16, now_ms: u64) -> ConnControl {
        ConnControl {
            signal: Signal::default(),
            closed: AtomicBool::new(false),
            reason: OnceBox::new(),
            last_activity_ms: AtomicU32::new(now_ms as u32),
            last_io_ms: AtomicU32::new(now_ms as u32),
            grace_ms: u32::from(keep_alive_secs) * 1500,
            held: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            park_requested: AtomicBool::new(false),
            parked: AtomicUsize::new(NOT_PARKED),
            handover: AtomicU8::new(HANDOVER_NONE),
            lot: OnceLock::new(),
        }
    }

    /// Wakes the connection: deliveries are ready (a wake before it waits is not lost). A
    /// parked connection gets its task back.
    pub fn wake(&self) {
        self.woken.store(true, Ordering::SeqCst);
        self.signal.notify();
        self.unpark();
    }

    /// Clears the wake flag before the task looks for work, so that a wake arriving after the
    /// look is seen by [`ConnControl::parked_at`].
    pub fn clear_woken(&self) {
        self.woken.store(false, Ordering::SeqCst);
    }

    /// Lets this connection park in `lot` when idle.
    pub fn allow_parking(&self, lot: &Arc<ParkingLot>) {
        let _ = self.lot.set(lot.clone());
    }

    /// The lot this connection parks in, if its transport can park.
    pub fn lot(&self) -> Option<&Arc<ParkingLot>> {
        self.lot.get()
    }

    /// Asks an idle connection's task to park: it has been silent both ways for
    /// `after_ms` (and is not held, closing or parked already).
    pub fn request_park_if_idle(&self, now_ms: u64, after_ms: u64) {
        if self.lot.get().is_none()
            || self.parked.load(Ordering::Relaxed) != NOT_PARKED
            || self.held.load(Ordering::Relaxed)
            || self.is_closed()
            || since(now_ms, &self.last_io_ms) < after_ms
        {
            return;
        }
        if !self.park_requested.swap(true, Ordering::Relaxed) {
            self.signal.notify();
        }
    }

    /// True (once) if the sweeper asked this connection to park.
    pub fn take_park_request(&self) -> bool {
        self.park_requested.swap(false, Ordering::Relaxed)
    }

    /// Records that the connection is parked under `key`.
    pub fn set_parked(&self, key: usize) {
        self.parked.store(key, Ordering::SeqCst);
    }

    /// Takes back a park that failed; false if a waker already claimed it.
    pub fn clear_parked(&self, key: usize) -> bool {
        self.parked.compare_exchange(key, NOT_PARKED, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// Unparks the connection if a wake came since the task last looked for work.
    pub fn unpark_if_woken(&self) {
        if self.woken.load(Ordering::SeqCst) {
            self.unpark();
        }
    }

    /// Gives a parked connection its task back (once, whoever calls).
    pub fn unpark(&self) {
        let key = self.parked.load(Ordering::SeqCst);
        if key == NOT_PARKED {
            return;
        }
        if self.clear_parked(key) {
            if let Some(lot) = self.lot.get() {
                lot.unpark(key);
            }
        }
    }

    /// Waits for [`ConnControl::wake`] or a close.
    pub async fn woken(&self) {
        self.signal.notified().await
    }

    /// Asks the connection to close with `reason`, explained by the code's own description.
    pub fn close(&self, reason: ReasonCode) {
        self.close_because(reason, reason.description());
    }

    /// Asks the connection to close with `reason`, explained by `detail`.
    pub fn close_because(&self, reason: ReasonCode, detail: impl Into<Cow<'static, str>>) {
        let _ = self.reason.set(Box::new((reason, detail.into())));
        self.closed.store(true, Ordering::Release);
        self.wake();
    }

    /// True once a close was asked for.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Why the connection closes (server shutdown when no one said).
    pub fn reason(&self) -> ReasonCode {
        self.reason.get().map_or(ReasonCode::ServerShuttingDown, |r| r.0)
    }

    /// Why the connection closes, with its detail.
    pub fn reason_with_detail(&self) -> CloseReason {
        self.reason
            .get()
            .cloned()
            .unwrap_or((ReasonCode::ServerShuttingDown, Cow::Borrowed("server shutting down")))
    }

    /// Asks the connection to handle what its client already sent before a new connection
    /// takes its session over; [`ConnControl::handed_over`] says when it has.
    pub fn ask_handover(&self) {
        // A connection already done with stays done.
        let _ =
            self.handover.compare_exchange(HANDOVER_NONE, HANDOVER_ASKED, Ordering::SeqCst, Ordering::SeqCst);
        self.wake();
    }

    /// True while a takeover waits for this connection (see [`ConnControl::ask_handover`]).
    pub fn handover_asked(&self) -> bool {
        self.handover.load(Ordering::SeqCst) == HANDOVER_ASKED
    }

    /// The connection has handled what its client sent before it was asked to hand over, or
    /// the broker has finished with it (its disconnect handled, session ended or kept, or it
    /// was taken over): a CONNECT waiting in [`crate::handover`] may go on.
    pub fn hand_over(&self) {
        self.handover.store(HANDOVER_DONE, Ordering::SeqCst);
    }

    /// True once the connection answered [`ConnControl::ask_handover`] or the broker finished
    /// with it.
    pub fn handed_over(&self) -> bool {
        self.handover.load(Ordering::SeqCst) == HANDOVER_DONE
    }

    /// Bytes arrived at `now_ms`.
    pub fn touch(&self, now_ms: u64) {
        self.last_activity_ms.store(now_ms as u32, Ordering::Relaxed);
        self.last_io_ms.store(now_ms as u32, Ordering::Relaxed);
    }

    /// Bytes were written at `now_ms`.
    pub fn wrote(&self, now_ms: u64) {
        self.last_io_ms.store(now_ms as u32, Ordering::Relaxed);
    }

    /// Marks the connection as held by backpressure (or no longer, at `now_ms`).
    pub fn set_held(&self, held: bool, now_ms: u64) {
        self.held.store(held, Ordering::Relaxed);
        self.touch(now_ms);
    }

    /// Closes the connection (0x8D) if nothing arrived for 1.5 times its keep alive.
    pub fn expire_if_silent(&self, now_ms: u64) {
        if self.grace_ms == 0 || self.held.load(Ordering::Relaxed) || self.is_closed() {
            return;
        }
        let silent = since(now_ms, &self.last_activity_ms);
        if silent >= u64::from(self.grace_ms) {
            self.close_because(
                ReasonCode::KeepAliveTimeout,
                format!("nothing received for {silent} ms (keep alive {} s)", self.grace_ms / 1500),
            );
        }
    }
}

/// Milliseconds from the clock reading in `then` to `now_ms`. Readings are kept modulo 2^32
/// (4 bytes instead of 8 per clock): differences stay exact up to 24 days, far beyond any keep
/// alive (at most 1.5 x 65,535 s), and a reading a moment newer than `now_ms` (stored by the
/// connection after the sweeper read the clock) counts as 0, not as 49 days.
fn since(now_ms: u64, then: &AtomicU32) -> u64 {
    let d = (now_ms as u32).wrapping_sub(then.load(Ordering::Relaxed));
    if d > u32::MAX / 2 {
        0
    } else {
        u64::from(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_survive_wrapping_and_races() {
        let then = AtomicU32::new(u32::MAX - 5);
        assert_eq!(since(u64::from(u32::MAX) + 10, &then), 15, "across the wrap");
        assert_eq!(since(u64::from(u32::MAX) - 6, &then), 0, "a reading newer than now");
        let ctl = ConnControl::new(1, 5 << 32);
        ctl.expire_if_silent((5 << 32) + 1499);
        assert!(!ctl.is_closed());
        ctl.expire_if_silent((5 << 32) + 1500);
        assert_eq!(ctl.reason(), ReasonCode::KeepAliveTimeout);
    }
}
