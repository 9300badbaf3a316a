//! The liveness table: the clocks and flags the broker's sweep reads for every connection
//! (keep alive, idleness, parking), kept inline in fixed-size chunks of small slots. The sweep
//! is then a linear scan over contiguous memory, and reaches a connection itself only when it
//! must act on it (its keep alive expired, or it should be asked to park); a parked connection
//! costs it one keep-alive check, a connection that cannot park one too, however long idle.
//!
//! Times are milliseconds on the broker's clock ([`crate::broker::Broker::clock_ms`]), kept
//! modulo 2^32 (4 bytes instead of 8 per clock).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// Slots per chunk. A chunk never moves or shrinks, so a connection keeps its slot by holding
/// its chunk.
const CHUNK: usize = 1024;

/// The slot belongs to a connection (free slots, and those never used, are skipped).
pub(super) const LIVE: u32 = 1;
/// The connection is held by backpressure: its silence is not the client's fault, and it
/// does not park.
pub(super) const HELD: u32 = 1 << 1;
/// The connection's transport can park (plain TCP with a parking lot).
pub(super) const CAN_PARK: u32 = 1 << 2;
/// The sweep asked the connection's task to park; cleared when the task takes the request.
pub(super) const PARK_REQUESTED: u32 = 1 << 3;
/// The connection is parked.
pub(super) const PARKED: u32 = 1 << 4;
/// A close was asked for.
pub(super) const CLOSED: u32 = 1 << 5;

/// What the sweep found due on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Nothing arrived for 1.5 times its keep alive.
    KeepAlive,
    /// Silent both ways for the parking delay: it should be asked to park.
    Idle,
}

/// One connection's clocks and flags: 16 bytes.
#[derive(Debug, Default)]
struct Slot {
    /// When bytes last arrived.
    last_read_ms: AtomicU32,
    /// When bytes last arrived or were written.
    last_io_ms: AtomicU32,
    /// Silence allowed before the keep alive expires (1.5 x keep alive); 0 = no keep alive.
    grace_ms: AtomicU32,
    /// [`LIVE`], [`HELD`], [`CAN_PARK`], [`PARK_REQUESTED`], [`PARKED`], [`CLOSED`].
    flags: AtomicU32,
}

impl Slot {
    /// How long the client has been silent at `now_ms`, if that is 1.5 times its keep alive
    /// or more and not excused (held by backpressure) or moot (closing).
    fn overdue(&self, now_ms: u64) -> Option<u64> {
        if self.flags.load(Ordering::Acquire) & (LIVE | HELD | CLOSED) != LIVE {
            return None;
        }
        let grace = self.grace_ms.load(Ordering::Relaxed);
        let silent = since(now_ms, &self.last_read_ms);
        (grace != 0 && silent >= u64::from(grace)).then_some(silent)
    }

    /// True if the connection can park, is not held, closing, parked or already asked to park,
    /// and nothing moved either way for `after_ms` at `now_ms`.
    fn idle(&self, now_ms: u64, after_ms: u64) -> bool {
        let watched = LIVE | CAN_PARK | HELD | CLOSED | PARKED | PARK_REQUESTED;
        self.flags.load(Ordering::Acquire) & watched == LIVE | CAN_PARK
            && since(now_ms, &self.last_io_ms) >= after_ms
    }
}

/// A fixed-size run of slots, with the connection each live slot belongs to.
struct Chunk<T> {
    slots: Box<[Slot]>,
    /// Reached only when the sweep must act on a slot (and by a slot's setup and release).
    conns: Mutex<Box<[Weak<T>]>>,
    /// The table number of the first slot.
    first: usize,
    /// The table, to give slots back to.
    table: Weak<Shared<T>>,
}

struct Shared<T> {
    inner: Mutex<Inner<T>>,
}

struct Inner<T> {
    chunks: Vec<Arc<Chunk<T>>>,
    /// Numbers of released slots, reused before new ones.
    free: Vec<usize>,
    /// Slots handed out so far (the next never-used number).
    used: usize,
}

/// The table of every connection's liveness slot; `T` is what a slot leads to (the
/// connection's control block).
pub struct LivenessTable<T> {
    shared: Arc<Shared<T>>,
}

impl<T> std::fmt::Debug for LivenessTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LivenessTable")
            .field("in_use", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl<T> Default for LivenessTable<T> {
    fn default() -> Self {
        let inner = Inner { chunks: Vec::new(), free: Vec::new(), used: 0 };
        LivenessTable { shared: Arc::new(Shared { inner: Mutex::new(inner) }) }
    }
}

impl<T> LivenessTable<T> {
    /// A slot for `conn`, a connection with keep alive `keep_alive_secs` (0 = none), active at
    /// `now_ms`. The slot is released when the returned entry is dropped.
    pub(super) fn insert(&self, conn: Weak<T>, keep_alive_secs: u16, now_ms: u64) -> Entry<T> {
        let (chunk, index) = {
            let mut inner = self.shared.inner.lock();
            let number = match inner.free.pop() {
                Some(number) => number,
                None => {
                    let number = inner.used;
                    inner.used += 1;
                    if number == inner.chunks.len() * CHUNK {
                        let chunk = Chunk {
                            slots: (0..CHUNK).map(|_| Slot::default()).collect(),
                            conns: Mutex::new((0..CHUNK).map(|_| Weak::new()).collect()),
                            first: number,
                            table: Arc::downgrade(&self.shared),
                        };
                        inner.chunks.push(Arc::new(chunk));
                    }
                    number
                }
            };
            (inner.chunks[number / CHUNK].clone(), number % CHUNK)
        };
        let slot = &chunk.slots[index];
        slot.last_read_ms.store(now_ms as u32, Ordering::Relaxed);
        slot.last_io_ms.store(now_ms as u32, Ordering::Relaxed);
        slot.grace_ms.store(u32::from(keep_alive_secs) * 1500, Ordering::Relaxed);
        chunk.conns.lock()[index] = conn;
        slot.flags.store(LIVE, Ordering::Release);
        Entry { chunk, index }
    }

    /// Scans every slot at `now_ms` and calls `act` on each connection found [`Due`]: keep
    /// alive expired, or (if `park_after_ms` is not 0) idle for `park_after_ms`. A connection
    /// is reached only then; `act` should check again, as it may have moved since.
    pub fn sweep(&self, now_ms: u64, park_after_ms: u64, mut act: impl FnMut(&T, Due)) {
        // The chunks as they are now; connections may come and go meanwhile.
        let chunks = self.shared.inner.lock().chunks.clone();
        for chunk in &chunks {
            for (index, slot) in chunk.slots.iter().enumerate() {
                let due = if slot.overdue(now_ms).is_some() {
                    Due::KeepAlive
                } else if park_after_ms > 0 && slot.idle(now_ms, park_after_ms) {
                    Due::Idle
                } else {
                    continue;
                };
                // Upgraded outside the lock: dropping the last reference releases the slot,
                // which takes it again.
                let conn = chunk.conns.lock()[index].upgrade();
                if let Some(conn) = conn {
                    act(&conn, due);
                }
            }
        }
    }

    /// Slots in use.
    fn len(&self) -> usize {
        let inner = self.shared.inner.lock();
        inner.used - inner.free.len()
    }

    /// Slots allocated (in use or free).
    fn capacity(&self) -> usize {
        self.shared.inner.lock().chunks.len() * CHUNK
    }
}

/// A connection's slot in the table, released when dropped.
pub(super) struct Entry<T> {
    chunk: Arc<Chunk<T>>,
    index: usize,
}

impl<T> std::fmt::Debug for Entry<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("number", &(self.chunk.first + self.index))
            .field("slot", self.slot())
            .finish()
    }
}

impl<T> Entry<T> {
    fn slot(&self) -> &Slot {
        &self.chunk.slots[self.index]
    }

    /// Bytes arrived at `now_ms`.
    pub(super) fn read(&self, now_ms: u64) {
        let slot = self.slot();
        slot.last_read_ms.store(now_ms as u32, Ordering::Relaxed);
        slot.last_io_ms.store(now_ms as u32, Ordering::Relaxed);
    }

    /// Bytes were written at `now_ms`.
    pub(super) fn wrote(&self, now_ms: u64) {
        self.slot().last_io_ms.store(now_ms as u32, Ordering::Relaxed);
    }

    /// Sets `flag`; true if it was not set.
    pub(super) fn set(&self, flag: u32) -> bool {
        self.slot().flags.fetch_or(flag, Ordering::AcqRel) & flag == 0
    }

    /// Clears `flag`; true if it was set.
    pub(super) fn clear(&self, flag: u32) -> bool {
        self.slot().flags.fetch_and(!flag, Ordering::AcqRel) & flag != 0
    }

    /// True while `flag` is set.
    pub(super) fn is(&self, flag: u32) -> bool {
        self.slot().flags.load(Ordering::Acquire) & flag != 0
    }

    /// The keep-alive verdict at `now_ms`: why the client has been silent too long, if it has
    /// (and is not held or closing).
    pub(super) fn keep_alive_expired(&self, now_ms: u64) -> Option<String> {
        let silent = self.slot().overdue(now_ms)?;
        let keep_alive = self.slot().grace_ms.load(Ordering::Relaxed) / 1500;
        Some(format!("nothing received for {silent} ms (keep alive {keep_alive} s)"))
    }

    /// True if the connection can and should be asked to park at `now_ms`: see
    /// [`LivenessTable::sweep`].
    pub(super) fn idle_for(&self, now_ms: u64, after_ms: u64) -> bool {
        self.slot().idle(now_ms, after_ms)
    }
}

impl<T> Drop for Entry<T> {
    fn drop(&mut self) {
        self.slot().flags.store(0, Ordering::Release);
        self.chunk.conns.lock()[self.index] = Weak::new();
        if let Some(table) = self.chunk.table.upgrade() {
            table.inner.lock().free.push(self.chunk.first + self.index);
        }
    }
}

/// Milliseconds from the clock reading in `then` to `now_ms`. Differences stay exact up to 24
/// days, far beyond any keep alive (at most 1.5 x 65,535 s), and a reading a moment newer than
/// `now_ms` (stored by the connection after the sweeper read the clock) counts as 0, not as 49
/// days.
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

    /// What the sweep finds at `now_ms` with parking after `after_ms`, by connection.
    fn swept(table: &LivenessTable<u32>, now_ms: u64, after_ms: u64) -> Vec<(u32, Due)> {
        let mut found = Vec::new();
        table.sweep(now_ms, after_ms, |conn, due| found.push((*conn, due)));
        found
    }

    #[test]
    fn clocks_survive_wrapping_and_races() {
        let then = AtomicU32::new(u32::MAX - 5);
        assert_eq!(since(u64::from(u32::MAX) + 10, &then), 15, "across the wrap");
        assert_eq!(since(u64::from(u32::MAX) - 6, &then), 0, "a reading newer than now");
        let table = LivenessTable::default();
        let conn = Arc::new(1);
        // Set up just before the clock's low 32 bits wrap.
        let start = (5 << 32) - 700;
        let e = table.insert(Arc::downgrade(&conn), 1, start);
        assert_eq!(e.keep_alive_expired(start + 1499), None);
        assert_eq!(swept(&table, start + 1499, 0), []);
        assert!(e.keep_alive_expired(start + 1500).is_some());
        assert_eq!(swept(&table, start + 1500, 0), [(1, Due::KeepAlive)]);
        e.set(HELD);
        assert_eq!(e.keep_alive_expired(start + 9000), None, "held: not the client's fault");
        assert_eq!(swept(&table, start + 9000, 0), []);
    }

    #[test]
    fn the_sweep_finds_expired_and_idle_connections_and_skips_parked_ones() {
        let table = LivenessTable::default();
        let conns: Vec<Arc<u32>> = (0..4).map(Arc::new).collect();
        let entries: Vec<_> = conns.iter().map(|c| table.insert(Arc::downgrade(c), 10, 0)).collect();
        // 0 cannot park; 1 can; 2 is parked; 3 was asked to park.
        for e in &entries[1..] {
            e.set(CAN_PARK);
        }
        entries[2].set(PARKED);
        entries[3].set(PARK_REQUESTED);
        assert_eq!(swept(&table, 4999, 5000), []);
        assert_eq!(swept(&table, 5000, 5000), [(1, Due::Idle)]);
        assert_eq!(swept(&table, 5000, 0), [], "parking after 0 s: never");
        entries[1].wrote(4000);
        assert_eq!(swept(&table, 8999, 5000), []);
        entries[1].read(14_000);
        assert_eq!(
            swept(&table, 15_000, 5000),
            [(0, Due::KeepAlive), (2, Due::KeepAlive), (3, Due::KeepAlive)]
        );
        entries[0].set(CLOSED);
        assert_eq!(swept(&table, 15_000, 0), [(2, Due::KeepAlive), (3, Due::KeepAlive)], "closing already");
        // A connection without keep alive never expires.
        let forever = Arc::new(9);
        let _e = table.insert(Arc::downgrade(&forever), 0, 0);
        assert!(!swept(&table, 1 << 30, 0).iter().any(|(c, _)| *c == 9));
    }

    #[test]
    fn released_slots_are_reused() {
        let table = LivenessTable::default();
        let conn = Arc::new(7);
        let mut entries: Vec<_> = (0..CHUNK + 1).map(|_| table.insert(Arc::downgrade(&conn), 1, 0)).collect();
        assert_eq!((table.len(), table.capacity()), (CHUNK + 1, 2 * CHUNK));
        drop(entries.remove(5));
        assert_eq!(table.len(), CHUNK);
        let again = table.insert(Arc::downgrade(&conn), 1, 0);
        assert_eq!((again.chunk.first, again.index), (0, 5), "a released slot first");
        drop((entries, again));
        assert_eq!(table.len(), 0);
        assert_eq!(swept(&table, 10_000, 0), [], "released slots are not swept");
        let more: Vec<_> = (0..2 * CHUNK).map(|_| table.insert(Arc::downgrade(&conn), 1, 0)).collect();
        assert_eq!((table.len(), table.capacity()), (2 * CHUNK, 2 * CHUNK), "no new chunk");
        assert_eq!(swept(&table, 10_000, 0).len(), 2 * CHUNK);
        drop(more);
        assert_eq!(table.len(), 0);
    }
}
