//! Payload stamping: the publisher writes a send timestamp, its publisher id and a per-publisher
//! sequence number into the first bytes of each payload; the subscriber reads them back to compute
//! end-to-end latency and to count lost, duplicated and out-of-order messages.
//!
//! Two layouts, chosen by payload size (the rest of the payload is filler `a`s, like emqtt_bench):
//!
//! | size | layout (big endian) |
//! | --- | --- |
//! | >= 18 B | `B5 01` publisher u32, sequence u32, send time u64 (ns since the Unix epoch) |
//! | 10..17 B | `B5 02` publisher u16, sequence u16, send time u32 (µs since the epoch, mod 2^32) |
//! | < 10 B | not stamped (counted, no latency) |
//!
//! Short sequence numbers and times are extended by the reader (nearest value to the last one seen;
//! times modulo 2^32 µs = 71 minutes), so a 10-byte payload still measures everything, with 1 µs
//! latency resolution instead of 1 ns. JSON payloads from a topic spec carry no binary stamp; a
//! `"timestamp":"<digits>"` field (ms, µs or ns since the epoch, told apart by magnitude) still
//! gives latency.
//!
//! Times come from one [`Clock`]: a monotonic `Instant` anchored once to the system clock, so every
//! client of the process shares it, and two processes on one machine agree to within the
//! resolution of their anchoring.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};

/// First byte of a stamped payload.
pub(crate) const MAGIC: u8 = 0xB5;
/// Layout tag of the 18-byte stamp.
pub(crate) const LONG: u8 = 0x01;
/// Layout tag of the 10-byte stamp.
pub(crate) const SHORT: u8 = 0x02;
/// Bytes of the long stamp.
pub(crate) const LONG_LEN: usize = 18;
/// Bytes of the short stamp.
pub(crate) const SHORT_LEN: usize = 10;

/// A monotonic clock in nanoseconds since the Unix epoch, shared by the whole process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    base: Instant,
    base_epoch_ns: u64,
}

impl Clock {
    /// The process-wide clock.
    pub(crate) fn global() -> Clock {
        static CLOCK: OnceLock<Clock> = OnceLock::new();
        *CLOCK.get_or_init(|| {
            let base = Instant::now();
            let epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            Clock { base, base_epoch_ns: epoch.as_nanos() as u64 }
        })
    }

    /// Nanoseconds since the Unix epoch.
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.base_epoch_ns + self.base.elapsed().as_nanos() as u64
    }
}

/// What a stamped payload says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// Publisher id (unique within one `braid bench pub` process, from `-n`).
    pub publisher: u32,
    /// Sequence number, truncated to `seq_bits`.
    pub seq: u64,
    /// Width of `seq` on the wire (16 or 32).
    pub seq_bits: u32,
    /// Send time: ns since the epoch (long), or µs since the epoch mod 2^32 (short).
    pub sent: u64,
    /// True for the short layout.
    pub short: bool,
}

impl Stamp {
    /// Latency in ns, given the receive time in ns since the epoch. `None` for a send time in
    /// the future (clock anchoring of another process).
    pub(crate) fn latency_ns(&self, now_ns: u64) -> Option<u64> {
        if self.short {
            let now_us = (now_ns / 1_000) as u32;
            let d = now_us.wrapping_sub(self.sent as u32);
            // More than half the window "in the past" means the stamp is from the future.
            if d > u32::MAX / 2 {
                None
            } else {
                Some(d as u64 * 1_000)
            }
        } else {
            now_ns.checked_sub(self.sent)
        }
    }
}

/// Reads the stamp of a payload, if it has one.
#[inline]
pub(crate) fn parse(payload: &[u8]) -> Option<Stamp> {
    if payload.len() < SHORT_LEN || payload[0] != MAGIC {
        return None;
    }
    match payload[1] {
        LONG if payload.len() >= LONG_LEN => Some(Stamp {
            publisher: u32::from_be_bytes(payload[2..6].try_into().ok()?),
            seq: u32::from_be_bytes(payload[6..10].try_into().ok()?) as u64,
            seq_bits: 32,
            sent: u64::from_be_bytes(payload[10..18].try_into().ok()?),
            short: false,
        }),
        SHORT => Some(Stamp {
            publisher: u16::from_be_bytes(payload[2..4].try_into().ok()?) as u32,
            seq: u16::from_be_bytes(payload[4..6].try_into().ok()?) as u64,
            seq_bits: 16,
            sent: u32::from_be_bytes(payload[6..10].try_into().ok()?) as u64,
            short: true,
        }),
        _ => None,
    }
}

/// Finds `"timestamp":"<digits>"` (or a bare number) in a JSON payload and returns it in ns
/// since the epoch, telling s/ms/µs/ns apart by magnitude.
pub(crate) fn parse_json_timestamp(payload: &[u8]) -> Option<u64> {
    if payload.first() != Some(&b'{') {
        return None;
    }
    const KEY: &[u8] = b"\"timestamp\":";
    let pos = payload.windows(KEY.len()).position(|w| w == KEY)?;
    let mut rest = &payload[pos + KEY.len()..];
    while let Some((b' ' | b'"', tail)) = rest.split_first() {
        rest = tail;
    }
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 20 {
        return None;
    }
    let v: u64 = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    Some(match v {
        0..=99_999_999_999 => v.saturating_mul(1_000_000_000), // seconds (until year 5138)
        100_000_000_000..=99_999_999_999_999 => v * 1_000_000, // ms
        100_000_000_000_000..=99_999_999_999_999_999 => v * 1_000, // µs
        _ => v,                                                // ns
    })
}

/// Appends a payload of `filler.len()` bytes to `buf`: the stamp of message `seq` of `publisher`
/// sent at `now_ns` (when the size allows one), then the rest of `filler`.
pub(crate) fn write_stamped(buf: &mut BytesMut, filler: &[u8], publisher: u32, seq: u64, now_ns: u64) {
    let size = filler.len();
    if size >= LONG_LEN {
        buf.put_u8(MAGIC);
        buf.put_u8(LONG);
        buf.put_u32(publisher);
        buf.put_u32(seq as u32);
        buf.put_u64(now_ns);
        buf.extend_from_slice(&filler[LONG_LEN..]);
    } else if size >= SHORT_LEN {
        buf.put_u8(MAGIC);
        buf.put_u8(SHORT);
        buf.put_u16(publisher as u16);
        buf.put_u16(seq as u16);
        buf.put_u32((now_ns / 1_000) as u32);
        buf.extend_from_slice(&filler[SHORT_LEN..]);
    } else {
        buf.extend_from_slice(filler);
    }
}

/// Builds the payloads of one publisher: `size` bytes, stamped when `size` allows, carved out of
/// a shared buffer so that sending costs no allocation per message (one per 64 KiB of payload).
pub(crate) struct PayloadBuilder {
    buf: BytesMut,
    filler: Bytes,
    publisher: u32,
    seq: u64,
}

/// Bytes reserved at a time for payloads.
const CHUNK: usize = 64 * 1024;

impl PayloadBuilder {
    /// A builder for payloads of `size` bytes from `publisher`.
    pub(crate) fn new(size: usize, publisher: u32) -> PayloadBuilder {
        PayloadBuilder { buf: BytesMut::new(), filler: Bytes::from(vec![b'a'; size]), publisher, seq: 0 }
    }

    /// The next payload, stamped with `now_ns`.
    pub(crate) fn next(&mut self, now_ns: u64) -> Bytes {
        let size = self.filler.len();
        if self.buf.capacity() < size {
            self.buf.reserve(size.max(CHUNK));
        }
        let seq = self.seq;
        self.seq += 1;
        write_stamped(&mut self.buf, &self.filler, self.publisher, seq, now_ns);
        self.buf.split().freeze()
    }

    /// A payload written by `write` (topic-spec payloads), carved from the same buffer.
    pub(crate) fn custom(&mut self, approx_len: usize, write: impl FnOnce(&mut BytesMut)) -> Bytes {
        if self.buf.capacity() < approx_len {
            self.buf.reserve(approx_len.max(CHUNK));
        }
        write(&mut self.buf);
        self.buf.split().freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_stamp_round_trip() {
        let mut b = PayloadBuilder::new(1024, 77);
        let p0 = b.next(1_700_000_000_000_000_000);
        let p1 = b.next(1_700_000_000_000_000_500);
        assert_eq!(p0.len(), 1024);
        assert!(p0[LONG_LEN..].iter().all(|&c| c == b'a'));
        let s0 = parse(&p0).unwrap();
        assert_eq!(
            s0,
            Stamp { publisher: 77, seq: 0, seq_bits: 32, sent: 1_700_000_000_000_000_000, short: false }
        );
        let s1 = parse(&p1).unwrap();
        assert_eq!(s1.seq, 1);
        assert_eq!(s1.latency_ns(1_700_000_000_000_010_500), Some(10_000));
        assert_eq!(s1.latency_ns(1), None);
        assert_eq!(b.seq, 2);
    }

    #[test]
    fn short_stamp_in_ten_bytes() {
        let mut b = PayloadBuilder::new(10, 70_001);
        let p = b.next(5_000_123_456);
        assert_eq!(p.len(), 10);
        let s = parse(&p).unwrap();
        assert!(s.short);
        assert_eq!(s.publisher, 70_001 & 0xFFFF);
        assert_eq!(s.seq_bits, 16);
        assert_eq!(s.latency_ns(5_000_123_456 + 42_000), Some(42_000));
        // Across the 2^32 µs wrap.
        let wrap_ns = (1u64 << 32) * 1_000;
        let mut b = PayloadBuilder::new(12, 1);
        let p = b.next(wrap_ns - 3_000);
        assert_eq!(parse(&p).unwrap().latency_ns(wrap_ns + 4_000), Some(7_000));
        assert_eq!(parse(&p).unwrap().latency_ns(wrap_ns - 10_000), None);
    }

    #[test]
    fn tiny_and_foreign_payloads_are_not_stamped() {
        let mut b = PayloadBuilder::new(9, 1);
        let p = b.next(1);
        assert_eq!(&p[..], b"aaaaaaaaa");
        assert_eq!(parse(&p), None);
        assert_eq!(parse(b"hello world, not stamped"), None);
        assert_eq!(parse(&[MAGIC, LONG, 0, 0, 0, 0, 0, 0, 0, 0, 0]), None, "long tag but too short");
        let empty = PayloadBuilder::new(0, 1).next(1);
        assert!(empty.is_empty());
    }

    #[test]
    fn builder_reuses_its_chunk() {
        let mut b = PayloadBuilder::new(100, 1);
        let a = b.next(1);
        let c = b.next(2);
        // Both carved from one allocation: adjacent in memory.
        assert_eq!(a.as_ptr() as usize + 100, c.as_ptr() as usize);
        let j = b.custom(5, |buf| buf.extend_from_slice(b"{\"a\"}"));
        assert_eq!(&j[..], b"{\"a\"}");
    }

    #[test]
    fn json_timestamps_by_magnitude() {
        let ns = 1_700_000_000_123_456_789u64;
        let f = |s: &str| parse_json_timestamp(s.as_bytes());
        assert_eq!(f(&format!("{{\"a\":1,\"timestamp\":\"{ns}\"}}")), Some(ns));
        assert_eq!(f(&format!("{{\"timestamp\": \"{}\"}}", ns / 1_000)), Some(ns / 1_000 * 1_000));
        assert_eq!(f(&format!("{{\"timestamp\":{}}}", ns / 1_000_000)), Some(ns / 1_000_000 * 1_000_000));
        assert_eq!(f("{\"timestamp\":\"1700000000\"}"), Some(1_700_000_000_000_000_000));
        assert_eq!(f("{\"timestamp\":\"x\"}"), None);
        assert_eq!(f("[\"timestamp\":1]"), None);
        assert_eq!(f("{\"other\":1}"), None);
    }

    #[test]
    fn clock_is_monotonic_and_near_system_time() {
        let c = Clock::global();
        let a = c.now_ns();
        let b = c.now_ns();
        assert!(b >= a);
        let sys = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        assert!(sys.abs_diff(b) < 1_000_000_000);
    }
}
