//! The wake-up of a connection's one task: a pending flag, so a wake before the task waits is
//! not lost, and the waiting task's waker. Waiting costs an atomic swap and, when nothing is
//! pending, registering the waker (no lock, unlike a `Notify`, whose waiter list every wait
//! of every connection would lock twice).

use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::task::AtomicWaker;

/// A one-task wake-up.
#[derive(Debug, Default)]
pub(super) struct Signal {
    pending: AtomicBool,
    waker: AtomicWaker,
}

impl Signal {
    /// Sets the flag and wakes the waiting task, if any.
    pub(super) fn notify(&self) {
        self.pending.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Waits until the flag is set, and clears it. Only one task may wait at a time.
    pub(super) async fn notified(&self) {
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
