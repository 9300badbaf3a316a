//! Counters, latency histograms and per-publisher sequence tracking.
//!
//! Hot-path costs: one relaxed atomic add per counted event (counters sit on their own cache
//! lines), and latency samples buffered per subscriber and flushed 64 at a time into one of a few
//! sharded HDR histograms, so thousands of subscribers on two threads neither contend nor each
//! carry a histogram of their own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;

/// The per-second counters, named as emqtt_bench prints them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counter {
    /// CONNACK success.
    ConnectSucc,
    /// Connect refused, timed out or failed.
    ConnectFail,
    /// SUBACK success.
    Sub,
    /// SUBACK failure.
    SubFail,
    /// Publishes completed (QoS 0: written; QoS 1/2: acknowledged).
    Pub,
    /// Publishes that failed (connection lost, negative ack).
    PubFail,
    /// Messages received.
    Recv,
    /// Connections lost after connecting.
    Disconnected,
}

impl Counter {
    /// Every counter, in print order.
    pub(crate) const ALL: [Counter; 8] = [
        Counter::ConnectSucc,
        Counter::ConnectFail,
        Counter::Sub,
        Counter::SubFail,
        Counter::Pub,
        Counter::PubFail,
        Counter::Recv,
        Counter::Disconnected,
    ];

    /// Name in the per-second lines.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Counter::ConnectSucc => "connect_succ",
            Counter::ConnectFail => "connect_fail",
            Counter::Sub => "sub",
            Counter::SubFail => "sub_fail",
            Counter::Pub => "pub",
            Counter::PubFail => "pub_fail",
            Counter::Recv => "recv",
            Counter::Disconnected => "disconnected",
        }
    }
}

#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicU64);

/// Histogram shards for latency samples.
const SHARDS: usize = 8;

/// Everything the clients of one run count, shared by all tasks.
pub(crate) struct Stats {
    counters: [Padded; Counter::ALL.len()],
    latency: Vec<Mutex<Histogram<u64>>>,
    connect_latency: Mutex<Histogram<u64>>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant figures is valid")
}

impl Stats {
    /// Zeroed counters and empty histograms.
    pub(crate) fn new() -> Stats {
        Stats {
            counters: Default::default(),
            latency: (0..SHARDS).map(|_| Mutex::new(histogram())).collect(),
            connect_latency: Mutex::new(histogram()),
        }
    }

    /// Adds one.
    #[inline]
    pub(crate) fn inc(&self, c: Counter) {
        self.add(c, 1);
    }

    /// Adds `n`.
    #[inline]
    pub(crate) fn add(&self, c: Counter, n: u64) {
        self.counters[c as usize].0.fetch_add(n, Ordering::Relaxed);
    }

    /// Current value.
    pub(crate) fn get(&self, c: Counter) -> u64 {
        self.counters[c as usize].0.load(Ordering::Relaxed)
    }

    /// Records one CONNECT -> CONNACK time.
    pub(crate) fn record_connect(&self, ns: u64) {
        let _ = self.connect_latency.lock().unwrap_or_else(|e| e.into_inner()).record(ns);
    }

    /// The CONNECT -> CONNACK histogram so far.
    pub(crate) fn connect_latency(&self) -> Histogram<u64> {
        self.connect_latency.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// All latency samples flushed so far, merged.
    pub(crate) fn latency(&self) -> Histogram<u64> {
        let mut all = histogram();
        for shard in &self.latency {
            let h = shard.lock().unwrap_or_else(|e| e.into_inner());
            let _ = all.add(&*h);
        }
        all
    }

    /// Records one latency sample (ns) straight into shard `shard` (for clients too many, and
    /// receiving too little, to carry a [`LatencyBatch`] each).
    pub(crate) fn record_latency(&self, shard: usize, ns: u64) {
        self.flush_latency(shard, &[ns]);
    }

    fn flush_latency(&self, shard: usize, samples: &[u64]) {
        let mut h = self.latency[shard % SHARDS].lock().unwrap_or_else(|e| e.into_inner());
        for &ns in samples {
            let _ = h.record(ns);
        }
    }
}

/// A subscriber's buffer of latency samples.
pub(crate) struct LatencyBatch {
    buf: [u64; 64],
    len: usize,
    shard: usize,
}

impl LatencyBatch {
    /// A batch that flushes into shard `shard` (e.g. the subscriber's index).
    pub(crate) fn new(shard: usize) -> LatencyBatch {
        LatencyBatch { buf: [0; 64], len: 0, shard }
    }

    /// Buffers one sample (ns), flushing when full.
    #[inline]
    pub(crate) fn record(&mut self, stats: &Stats, ns: u64) {
        self.buf[self.len] = ns;
        self.len += 1;
        if self.len == self.buf.len() {
            self.flush(stats);
        }
    }

    /// Moves the buffered samples into the shared histogram.
    pub(crate) fn flush(&mut self, stats: &Stats) {
        if self.len > 0 {
            stats.flush_latency(self.shard, &self.buf[..self.len]);
            self.len = 0;
        }
    }
}

/// What one subscriber saw from one publisher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PubSeq {
    /// First sequence number seen.
    pub first: u64,
    /// Highest sequence number seen + 1.
    pub next: u64,
    /// Distinct sequence numbers received.
    pub unique: u64,
    /// Messages seen twice (within the last 64 sequence numbers).
    pub duplicates: u64,
    /// Messages older than the highest one already seen.
    pub out_of_order: u64,
    window: u64,
    seen: bool,
}

impl PubSeq {
    /// Widens a wire sequence of `bits` bits to the value nearest the last one seen.
    pub(crate) fn extend(&self, raw: u64, bits: u32) -> u64 {
        if bits >= 64 || !self.seen {
            return raw;
        }
        let m = 1u64 << bits;
        let reference = self.next;
        let mut cand = (reference & !(m - 1)) | (raw & (m - 1));
        if cand + m / 2 < reference {
            cand += m;
        } else if cand > reference + m / 2 && cand >= m {
            cand -= m;
        }
        cand
    }

    /// Accounts for sequence number `seq` (already extended).
    pub(crate) fn observe(&mut self, seq: u64) {
        if !self.seen {
            *self = PubSeq { first: seq, next: seq + 1, unique: 1, window: 1, seen: true, ..*self };
            return;
        }
        if seq >= self.next {
            let shift = seq - self.next + 1;
            self.window = if shift >= 64 { 0 } else { self.window << shift };
            self.window |= 1;
            self.next = seq + 1;
            self.unique += 1;
            return;
        }
        let back = self.next - 1 - seq;
        self.first = self.first.min(seq);
        if back >= 64 {
            // Too old to tell a duplicate from a late message: call it late.
            self.out_of_order += 1;
            self.unique += 1;
        } else if self.window & (1 << back) != 0 {
            self.duplicates += 1;
        } else {
            self.window |= 1 << back;
            self.out_of_order += 1;
            self.unique += 1;
        }
    }

    /// Gaps between the first and highest sequence seen that were never filled.
    pub(crate) fn gaps(&self) -> u64 {
        (self.next - self.first).saturating_sub(self.unique)
    }
}

/// A subscriber's sequence state for every publisher it hears from.
#[derive(Default, Debug, Clone)]
pub(crate) struct SeqTracker {
    dense: Vec<PubSeq>,
    sparse: std::collections::HashMap<u32, PubSeq>,
}

/// Publisher ids below this are kept in a vector.
const DENSE: u32 = 1 << 20;

impl SeqTracker {
    /// Accounts for one stamped message.
    #[inline]
    pub(crate) fn observe(&mut self, publisher: u32, raw_seq: u64, bits: u32) {
        let entry = if publisher < DENSE {
            let i = publisher as usize;
            if i >= self.dense.len() {
                self.dense.resize(i + 1, PubSeq::default());
            }
            &mut self.dense[i]
        } else {
            self.sparse.entry(publisher).or_default()
        };
        let seq = entry.extend(raw_seq, bits);
        entry.observe(seq);
    }

    /// Every publisher heard from, with its state.
    pub(crate) fn publishers(&self) -> impl Iterator<Item = (u32, &PubSeq)> + '_ {
        self.dense
            .iter()
            .enumerate()
            .filter(|(_, s)| s.seen)
            .map(|(i, s)| (i as u32, s))
            .chain(self.sparse.iter().map(|(k, v)| (*k, v)))
    }

    /// The state for one publisher, if heard from.
    pub(crate) fn get(&self, publisher: u32) -> Option<&PubSeq> {
        if publisher < DENSE {
            self.dense.get(publisher as usize).filter(|s| s.seen)
        } else {
            self.sparse.get(&publisher)
        }
    }
}

/// Loss accounting over all subscribers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Delivery {
    /// Distinct messages received (per subscriber, summed).
    pub unique: u64,
    /// Messages never received.
    pub lost: u64,
    /// Messages received more than once.
    pub duplicates: u64,
    /// Messages received after a later one from the same publisher.
    pub out_of_order: u64,
}

/// Sums the trackers of all subscribers, each with what it should have received. With
/// `Some(sent)` (messages each publisher id sent on topics the subscriber's filters match, known
/// when publishers run in this process), the subscriber is expected to get all of them; with
/// `None`, its loss is the gaps between the first and the last sequence it saw.
pub(crate) fn delivery<'a>(
    trackers: impl IntoIterator<Item = (&'a SeqTracker, Option<&'a [(u32, u64)]>)>,
) -> Delivery {
    let mut d = Delivery::default();
    for (t, sent) in trackers {
        for (_, s) in t.publishers() {
            d.unique += s.unique;
            d.duplicates += s.duplicates;
            d.out_of_order += s.out_of_order;
            if sent.is_none() {
                d.lost += s.gaps();
            }
        }
        if let Some(sent) = sent {
            for &(publisher, n) in sent {
                let got = t.get(publisher).map_or(0, |s| s.unique);
                d.lost += n.saturating_sub(got);
            }
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_count() {
        let s = Stats::new();
        s.inc(Counter::Pub);
        s.add(Counter::Pub, 4);
        s.inc(Counter::Recv);
        assert_eq!(s.get(Counter::Pub), 5);
        assert_eq!(s.get(Counter::Recv), 1);
        assert_eq!(s.get(Counter::PubFail), 0);
        assert_eq!(Counter::ALL.iter().map(|c| c.name()).collect::<Vec<_>>().len(), 8);
    }

    #[test]
    fn latency_batches_merge_across_shards() {
        let s = Stats::new();
        let mut a = LatencyBatch::new(0);
        let mut b = LatencyBatch::new(3);
        for i in 1..=100u64 {
            a.record(&s, i * 1_000);
            b.record(&s, i * 1_000_000);
        }
        // 64 flushed each, 36 still buffered.
        assert_eq!(s.latency().len(), 128);
        a.flush(&s);
        b.flush(&s);
        let h = s.latency();
        assert_eq!(h.len(), 200);
        assert_eq!(h.min(), 1_000);
        assert!(h.max().abs_diff(100_000_000) < 100_000);
        assert!(h.value_at_quantile(0.5).abs_diff(100_000) < 200);
        s.record_connect(5_000);
        assert_eq!(s.connect_latency().len(), 1);
    }

    #[test]
    fn in_order_stream_has_no_loss() {
        let mut t = SeqTracker::default();
        for seq in 0..1000 {
            t.observe(3, seq, 32);
        }
        let p = t.get(3).unwrap();
        assert_eq!((p.first, p.next, p.unique, p.duplicates, p.out_of_order), (0, 1000, 1000, 0, 0));
        assert_eq!(delivery([(&t, None)]), Delivery { unique: 1000, ..Default::default() });
        assert_eq!(delivery([(&t, Some(&[(3, 1000)][..]))]).lost, 0);
        assert_eq!(delivery([(&t, Some(&[(3, 1010), (4, 5)][..]))]).lost, 15);
        // Each subscriber against what its own filters let through.
        let mut other = SeqTracker::default();
        other.observe(4, 0, 32);
        assert_eq!(delivery([(&t, Some(&[(3, 1000)][..])), (&other, Some(&[(4, 2)][..]))]).lost, 1);
        assert!(t.get(4).is_none());
    }

    #[test]
    fn gaps_duplicates_and_reordering() {
        let mut t = SeqTracker::default();
        for seq in [0, 1, 2, 5, 6, 3, 6, 2, 9] {
            t.observe(0, seq, 32);
        }
        let p = *t.get(0).unwrap();
        assert_eq!(p.unique, 7, "0 1 2 5 6 3 9");
        assert_eq!(p.duplicates, 2, "6 and 2 again");
        assert_eq!(p.out_of_order, 1, "3 after 6");
        assert_eq!(p.gaps(), 3, "4 7 8 never came");
        // Far behind the window: counted late, not duplicate.
        t.observe(0, 200, 32);
        t.observe(0, 100, 32);
        assert_eq!(t.get(0).unwrap().out_of_order, 2);
    }

    #[test]
    fn short_sequences_wrap() {
        let mut t = SeqTracker::default();
        for seq in 0..200_000u64 {
            t.observe(9, seq & 0xFFFF, 16);
        }
        let p = t.get(9).unwrap();
        assert_eq!((p.next, p.unique, p.gaps(), p.duplicates), (200_000, 200_000, 0, 0));
        // A late message just before a wrap is placed before it.
        let mut t = SeqTracker::default();
        t.observe(1, 65_534, 16);
        t.observe(1, 0, 16); // 65536
        t.observe(1, 65_535, 16); // late
        let p = t.get(1).unwrap();
        assert_eq!((p.first, p.next, p.unique, p.out_of_order), (65_534, 65_537, 3, 1));
    }

    #[test]
    fn sparse_publisher_ids() {
        let mut t = SeqTracker::default();
        t.observe(u32::MAX, 0, 32);
        t.observe(u32::MAX, 1, 32);
        t.observe(2, 0, 32);
        assert_eq!(t.publishers().count(), 2);
        assert_eq!(t.get(u32::MAX).unwrap().unique, 2);
        assert_eq!(delivery([(&t, None), (&t, None)]).unique, 6);
    }
}
