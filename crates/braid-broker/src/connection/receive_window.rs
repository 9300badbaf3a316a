//! The Receive Maximum the broker advertises in CONNACK, counted over the whole connection:
//! the QoS 1/2 PUBLISHes a client has sent that the broker has not yet answered with PUBACK
//! (held by backpressure or waiting for the group commit) or whose QoS 2 exchange awaits
//! PUBREL. The session counts the control stream's (and a TCP connection's) unreleased QoS 2
//! ids, which outlive the connection; this counts the rest. The streams of one QUIC connection
//! share one count, so several data streams do not get a window each (`docs/quic.md`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The part of its connection's count one reader (a TCP connection, or one QUIC stream) holds.
/// Dropping it gives that part back.
#[derive(Debug, Default)]
pub(crate) struct WindowShare {
    /// The count of the whole QUIC connection, shared by its streams; `None`: this reader is
    /// the whole connection.
    connection: Option<Arc<AtomicUsize>>,
    /// What this reader holds of it.
    mine: usize,
}

impl WindowShare {
    /// A reader's share of `connection`, the count its QUIC connection's streams share.
    pub(crate) fn of(connection: Arc<AtomicUsize>) -> WindowShare {
        WindowShare { connection: Some(connection), mine: 0 }
    }

    /// Publishes counted on the connection.
    pub(crate) fn used(&self) -> usize {
        self.connection.as_ref().map_or(self.mine, |c| c.load(Ordering::Acquire))
    }

    /// Counts one more publish.
    pub(crate) fn take(&mut self) {
        self.mine += 1;
        if let Some(c) = &self.connection {
            c.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Counts one publish less (one this reader took).
    pub(crate) fn give(&mut self) {
        if self.mine == 0 {
            return;
        }
        self.mine -= 1;
        if let Some(c) = &self.connection {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for WindowShare {
    fn drop(&mut self) {
        if let Some(c) = &self.connection {
            c.fetch_sub(self.mine, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_of_a_connection_count_together_and_a_closed_stream_gives_its_part_back() {
        let count = Arc::new(AtomicUsize::new(0));
        let mut a = WindowShare::of(count.clone());
        let mut b = WindowShare::of(count.clone());
        a.take();
        a.take();
        b.take();
        assert_eq!((a.used(), b.used()), (3, 3));
        b.give();
        b.give();
        assert_eq!(a.used(), 2, "a stream gives back only what it took");
        drop(a);
        assert_eq!(b.used(), 0);
        let mut alone = WindowShare::default();
        alone.take();
        assert_eq!(alone.used(), 1);
    }
}
