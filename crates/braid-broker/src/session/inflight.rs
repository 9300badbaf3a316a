//! Outbound QoS 1/2 deliveries sent and not yet acknowledged, with packet id allocation.

use std::collections::VecDeque;
use std::time::Instant;

use super::adaptive::{micros, AdaptiveWindow};
use crate::message::Delivery;

/// Where an outbound QoS 1/2 delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// PUBLISH sent; waiting for PUBACK (QoS 1) or PUBREC (QoS 2).
    Published,
    /// PUBREL sent; waiting for PUBCOMP.
    Released,
}

/// One unacknowledged delivery.
#[derive(Debug)]
pub struct Entry {
    /// Packet identifier.
    pub packet_id: u16,
    /// What was sent.
    pub delivery: Delivery,
    /// Where it stands.
    pub stage: Stage,
    /// Must be (re)sent on the current connection: new, or carried over from an earlier one.
    pub unsent: bool,
    /// When it was last sent: microseconds since its window's epoch ([`super::adaptive::micros`]).
    pub sent_at: u32,
}

/// The window of unacknowledged deliveries, in send order. Entries still to be resent on the
/// current connection always follow the ones already sent: a resume marks every entry, resends
/// go front to back, and new entries are only added once nothing is left to resend.
///
/// Made at the first delivery: a session that never gets a QoS 1/2 message (most idle devices)
/// carries one pointer for it.
#[derive(Debug, Default)]
pub struct Inflight(Option<Box<Window>>);

#[derive(Debug, Default)]
struct Window {
    entries: VecDeque<Entry>,
    next_id: u16,
    /// Entries at the back still to be resent (at most 65,535: one per packet id).
    unsent: u16,
    /// Packet ids in use, one bit each, once the window is large enough that scanning the
    /// entries for a free id would cost more than the 8 KiB this takes.
    in_use: Option<Box<[u64; 1024]>>,
    /// How many deliveries the current connection's acknowledgement delays say to send ahead.
    adaptive: AdaptiveWindow,
    /// What the entries' and the adaptive window's times count from: the first `now` the window
    /// was given (none yet: only restored entries, not sent).
    epoch: Option<Instant>,
}

/// Entries up to which finding a free packet id by scanning is cheaper than a bitmap.
const SCAN_LIMIT: usize = 64;

impl Inflight {
    /// Number of unacknowledged deliveries.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |w| w.entries.len())
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of entries sent on the current connection (what counts against its window).
    pub fn sent(&self) -> usize {
        self.0.as_ref().map_or(0, |w| w.entries.len() - usize::from(w.unsent))
    }

    /// Adds a delivery, sent at `now`, with a fresh packet id (one not in use) and returns
    /// that id.
    pub fn push(&mut self, delivery: Delivery, now: Instant) -> u16 {
        let w = self.window();
        w.track_ids();
        let id = w.free_id();
        let at = w.micros(now);
        w.push_with_id(delivery, id, Stage::Published, false, at);
        id
    }

    /// Adds a delivery with packet id `id` (which must be free), sent at `now`.
    pub fn push_with_id(&mut self, delivery: Delivery, id: u16, stage: Stage, now: Instant) {
        let w = self.window();
        let at = w.micros(now);
        w.push_with_id(delivery, id, stage, false, at);
    }

    /// Adds a delivery with packet id `id` (which must be free) restored from the store, to be
    /// resent.
    pub fn push_unsent(&mut self, delivery: Delivery, id: u16, stage: Stage) {
        self.window().push_with_id(delivery, id, stage, true, 0);
    }

    /// The entry added last.
    pub fn last(&self) -> Option<&Entry> {
        self.0.as_ref()?.entries.back()
    }

    /// True if packet id `id` is in use.
    pub fn in_use(&self, id: u16) -> bool {
        self.0.as_ref().is_some_and(|w| w.in_use(id))
    }

    /// Takes every entry out (the session goes to disk).
    pub fn drain(&mut self) -> impl Iterator<Item = Entry> {
        self.0.take().map(|w| w.entries).unwrap_or_default().into_iter()
    }

    /// Takes out the entries `pred` picks (their packet ids become free), oldest first.
    pub fn take_where(&mut self, mut pred: impl FnMut(&Entry) -> bool) -> Vec<Delivery> {
        let Some(w) = self.0.as_deref_mut() else { return Vec::new() };
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(w.entries.len());
        for e in w.entries.drain(..) {
            if !pred(&e) {
                kept.push_back(e);
                continue;
            }
            w.unsent -= u16::from(e.unsent);
            if let Some(bits) = w.in_use.as_mut() {
                set_bit(bits, e.packet_id, false);
            }
            taken.push(e.delivery);
        }
        w.entries = kept;
        taken
    }

    /// Store sequence number of the delivery with packet id `id` at `stage`.
    pub fn seq_of(&self, id: u16, stage: Stage) -> Option<u64> {
        self.delivery_of(id, stage).map(|d| d.seq)
    }

    /// The delivery with packet id `id` at `stage`.
    pub fn delivery_of(&self, id: u16, stage: Stage) -> Option<&Delivery> {
        let w = self.0.as_ref()?;
        w.position(id, stage).map(|i| &w.entries[i].delivery)
    }

    /// PUBACK (or a failed PUBREC) for `id`: the delivery is done. Returns its store
    /// sequence number and when it was sent (for [`Inflight::acknowledged`]), or None if `id`
    /// is unknown.
    pub fn complete(&mut self, id: u16, stage: Stage) -> Option<(u64, u32)> {
        let w = self.0.as_deref_mut()?;
        let e = w.entries.remove(w.position(id, stage)?)?;
        if e.unsent {
            w.unsent -= 1;
        }
        if let Some(bits) = w.in_use.as_mut() {
            set_bit(bits, id, false);
        }
        Some((e.delivery.seq, e.sent_at))
    }

    /// PUBREC for `id`: move it to the PUBREL stage. Returns when its PUBLISH was sent if this
    /// is its first PUBREC, `Some(None)` for a repeated one, None if `id` is unknown.
    pub fn release(&mut self, id: u16) -> Option<Option<u32>> {
        let w = self.0.as_deref_mut()?;
        match w.position(id, Stage::Published) {
            Some(i) => {
                w.entries[i].stage = Stage::Released;
                Some(Some(w.entries[i].sent_at))
            }
            None => w.position(id, Stage::Released).map(|_| None),
        }
    }

    /// How far ahead the current connection's acknowledgement delays say to send (its
    /// Receive Maximum caps it further).
    pub fn adaptive(&self) -> &AdaptiveWindow {
        self.0.as_ref().map_or(&AdaptiveWindow::FRESH, |w| &w.adaptive)
    }

    /// An acknowledgement of a delivery sent at `sent` (as [`Inflight::complete`] or
    /// [`Inflight::release`] returned it) arrived at `now` ([`AdaptiveWindow::on_ack`]).
    pub fn acknowledged(&mut self, sent: u32, now: Instant, full: bool) {
        if let Some(w) = self.0.as_deref_mut() {
            let now = w.micros(now);
            w.adaptive.on_ack(sent, now, full);
        }
    }

    /// Marks every entry to be sent again (a client reconnected to the session), whose
    /// window starts afresh.
    pub fn mark_all_unsent(&mut self) {
        if let Some(w) = self.0.as_deref_mut() {
            w.adaptive = AdaptiveWindow::default();
            for e in &mut w.entries {
                e.unsent = true;
            }
            w.unsent = w.entries.len() as u16;
        }
    }

    /// The oldest entry still to be resent on this connection, now marked sent at `now`.
    pub fn next_unsent(&mut self, now: Instant) -> Option<&Entry> {
        let w = self.0.as_deref_mut()?;
        if w.unsent == 0 {
            return None;
        }
        let now = w.micros(now);
        let i = w.entries.len() - usize::from(w.unsent);
        w.unsent -= 1;
        let e = &mut w.entries[i];
        debug_assert!(e.unsent);
        e.unsent = false;
        e.sent_at = now;
        Some(e)
    }

    fn window(&mut self) -> &mut Window {
        self.0.get_or_insert_with(Box::default)
    }
}

impl Window {
    /// `now` in microseconds since the window's epoch (`now`, if it has none yet).
    fn micros(&mut self, now: Instant) -> u32 {
        micros(now, *self.epoch.get_or_insert(now))
    }

    fn push_with_id(&mut self, delivery: Delivery, id: u16, stage: Stage, unsent: bool, now: u32) {
        debug_assert!(unsent || self.unsent == 0, "resends go first");
        self.track_ids();
        if let Some(bits) = self.in_use.as_mut() {
            set_bit(bits, id, true);
        }
        self.unsent += u16::from(unsent);
        self.entries.push_back(Entry { packet_id: id, delivery, stage, unsent, sent_at: now });
    }

    fn in_use(&self, id: u16) -> bool {
        match &self.in_use {
            Some(bits) => bits[usize::from(id) / 64] & (1 << (id % 64)) != 0,
            None => self.entries.iter().any(|e| e.packet_id == id),
        }
    }

    /// Switches to the id bitmap once the window is large.
    fn track_ids(&mut self) {
        if self.in_use.is_none() && self.entries.len() >= SCAN_LIMIT {
            let mut bits = Box::new([0u64; 1024]);
            for e in &self.entries {
                set_bit(&mut bits, e.packet_id, true);
            }
            self.in_use = Some(bits);
        }
    }

    fn free_id(&mut self) -> u16 {
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            if self.next_id == 0 {
                continue;
            }
            if !self.in_use(self.next_id) {
                return self.next_id;
            }
        }
    }

    fn position(&self, id: u16, stage: Stage) -> Option<usize> {
        self.entries.iter().position(|e| e.packet_id == id && e.stage == stage)
    }
}

fn set_bit(bits: &mut [u64; 1024], id: u16, on: bool) {
    let (word, bit) = (usize::from(id) / 64, id % 64);
    if on {
        bits[word] |= 1 << bit;
    } else {
        bits[word] &= !(1 << bit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use braid_proto::{ByteString, Bytes, QoS};

    fn delivery() -> Delivery {
        Delivery::of(Message::internal(ByteString::from_static("t"), Bytes::new(), false), QoS::AtLeastOnce)
    }

    #[test]
    fn ids_skip_zero_and_ids_in_use() {
        let (mut w, now) = (Inflight::default(), Instant::now());
        w.window().next_id = u16::MAX - 1;
        assert_eq!(w.push(delivery(), now), u16::MAX);
        assert_eq!(w.push(delivery(), now), 1);
        w.window().next_id = 0;
        assert_eq!(w.push(delivery(), now), 2, "1 is in use");
    }

    #[test]
    fn large_windows_never_reuse_an_id_in_use() {
        let (mut w, now) = (Inflight::default(), Instant::now());
        let ids: Vec<u16> = (0..1000).map(|_| w.push(delivery(), now)).collect();
        assert!(w.window().in_use.is_some(), "switched to the bitmap");
        let mut seen = std::collections::HashSet::new();
        assert!(ids.iter().all(|id| seen.insert(*id)));
        // Free every other id, wrap around, and check new ids skip the ones still in use.
        for id in ids.iter().step_by(2) {
            assert!(w.complete(*id, Stage::Published).is_some());
        }
        w.window().next_id = 0;
        for _ in 0..500 {
            let id = w.push(delivery(), now);
            assert!(seen.insert(id) || ids.iter().step_by(2).any(|f| *f == id), "id {id} was in use");
        }
        assert_eq!(w.len(), 1000);
    }

    #[test]
    fn qos2_moves_through_release_to_complete() {
        let (mut w, now) = (Inflight::default(), Instant::now());
        let id = w.push(delivery(), now);
        assert!(w.complete(id, Stage::Released).is_none(), "PUBCOMP before PUBREC is unknown");
        assert_eq!(w.release(id), Some(Some(0)), "sent at the window's epoch");
        assert_eq!(w.release(id), Some(None), "a repeated PUBREC is harmless");
        assert!(w.complete(id, Stage::Released).is_some());
        assert!(w.is_empty());
    }

    #[test]
    fn taking_entries_out_frees_their_ids_and_keeps_the_resend_count() {
        let (mut w, now) = (Inflight::default(), Instant::now());
        let ids: Vec<u16> = (0..100).map(|_| w.push(delivery(), now)).collect();
        w.mark_all_unsent();
        assert!(w.next_unsent(now).is_some());
        let taken = w.take_where(|e| e.packet_id % 2 == 0);
        assert_eq!(taken.len(), 50);
        assert_eq!(w.len(), 50);
        assert!(ids.iter().all(|id| w.in_use(*id) == (id % 2 == 1)), "taken ids are free again");
        // The first entry (id 1, resent already) stays sent; the other 49 still wait.
        assert_eq!(w.sent(), 1);
        assert_eq!((0..60).filter_map(|_| w.next_unsent(now).map(|e| e.packet_id)).count(), 49);
    }

    #[test]
    fn times_count_from_the_window_s_own_epoch() {
        let (mut w, start) = (Inflight::default(), Instant::now());
        let later = start + std::time::Duration::from_micros(1_500);
        let first = w.push(delivery(), later);
        let second = w.push(delivery(), later + std::time::Duration::from_micros(250));
        assert_eq!(
            w.complete(first, Stage::Published).map(|(_, sent)| sent),
            Some(0),
            "the first now is the epoch"
        );
        assert_eq!(w.release(second), Some(Some(250)));
        // A window that only holds restored entries takes its epoch from the first resend.
        let mut restored = Inflight::default();
        restored.push_unsent(delivery(), 9, Stage::Published);
        assert_eq!(restored.next_unsent(later).map(|e| (e.packet_id, e.sent_at)), Some((9, 0)));
    }

    #[test]
    fn resume_resends_everything_once() {
        let (mut w, now) = (Inflight::default(), Instant::now());
        w.push(delivery(), now);
        w.push(delivery(), now);
        w.mark_all_unsent();
        assert_eq!(w.sent(), 0);
        assert!(w.next_unsent(now).is_some());
        assert_eq!(w.sent(), 1);
        let second = w.next_unsent(now).unwrap().packet_id;
        assert!(w.next_unsent(now).is_none());
        w.mark_all_unsent();
        assert!(w.complete(second, Stage::Published).is_some(), "acked before it was resent");
        assert!(w.next_unsent(now).is_some());
        assert!(w.next_unsent(now).is_none());
    }
}
