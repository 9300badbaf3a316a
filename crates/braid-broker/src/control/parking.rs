//! The parking state of an idle connection (see [`crate::transport::tcp::park`]): whether a
//! wake came, its key in the parking lot while parked, and the hook that gives it a task back.
//! The lot installs the hook, so this low layer does not know the lot. (Whether the sweep asked
//! it to park, and whether it is parked, are flags of its liveness slot, which the sweep reads.)

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// `key` when the connection has a task.
const NOT_PARKED: u32 = u32::MAX;

/// Gives a parked connection its task back.
pub trait Unpark: Send + Sync + std::fmt::Debug {
    /// Resumes the connection parked under `key`.
    fn unpark(&self, key: u32);
}

/// Parking state.
#[derive(Debug)]
pub(super) struct Parking {
    /// Set by every wake; cleared by the task when it looks for work.
    woken: AtomicBool,
    /// The parking lot's key while parked, else `NOT_PARKED`. 32 bits, which keeps the
    /// connection's control block in a smaller allocation size class.
    key: AtomicU32,
    /// Where the connection parks; set once its transport can park.
    lot: OnceLock<Arc<dyn Unpark>>,
}

impl Default for Parking {
    fn default() -> Self {
        Parking { woken: AtomicBool::new(false), key: AtomicU32::new(NOT_PARKED), lot: OnceLock::new() }
    }
}

impl Parking {
    /// Records a wake (before the task is notified).
    pub(super) fn woken(&self) {
        self.woken.store(true, Ordering::SeqCst);
    }

    /// Clears the wake flag before the task looks for work.
    pub(super) fn clear_woken(&self) {
        self.woken.store(false, Ordering::SeqCst);
    }

    /// True if a wake came since [`Parking::clear_woken`].
    pub(super) fn was_woken(&self) -> bool {
        self.woken.load(Ordering::SeqCst)
    }

    /// Lets the connection park in `lot`.
    pub(super) fn allow(&self, lot: Arc<dyn Unpark>) {
        let _ = self.lot.set(lot);
    }

    /// Records that the connection is parked under `key`.
    pub(super) fn set(&self, key: u32) {
        self.key.store(key, Ordering::SeqCst);
    }

    /// Takes back the park under `key`; false if someone else already did.
    pub(super) fn clear(&self, key: u32) -> bool {
        self.key.compare_exchange(key, NOT_PARKED, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// Takes the park back (once, whoever calls): its key, for [`Parking::resume`].
    pub(super) fn take(&self) -> Option<u32> {
        let key = self.key.load(Ordering::SeqCst);
        (key != NOT_PARKED && self.clear(key)).then_some(key)
    }

    /// Gives the connection that was parked under `key` its task back.
    pub(super) fn resume(&self, key: u32) {
        if let Some(lot) = self.lot.get() {
            lot.unpark(key);
        }
    }
}
