//! A read buffer sized to its connection's traffic: small while the peer is idle (thousands of
//! idle connections should cost little memory), doubling while reads fill it. The sizing is
//! sans-IO; with the `tokio` feature, [`ReadBuffer::read_from`] does the read as well.

use bytes::BytesMut;

const MIN_READ: usize = 128;
const MAX_READ: usize = 64 * 1024;

/// A `BytesMut` plus the size of the next read.
#[derive(Debug)]
pub struct ReadBuffer {
    buf: BytesMut,
    next_read: usize,
}

impl Default for ReadBuffer {
    fn default() -> Self {
        ReadBuffer { buf: BytesMut::new(), next_read: MIN_READ }
    }
}

impl ReadBuffer {
    /// The bytes read and not yet decoded (pass this to [`crate::decode`]).
    pub fn bytes(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Makes room for the next read and returns how many bytes it may add. Idempotent until
    /// [`ReadBuffer::filled`] is called.
    pub fn prepare(&mut self) -> usize {
        if self.buf.is_empty() && self.buf.capacity() > 4 * self.next_read {
            // Idle again after a burst: give the memory back.
            self.buf = BytesMut::new();
        }
        // Room for a whole read: a packet split over two reads costs a second system call.
        if self.buf.capacity() - self.buf.len() < self.next_read {
            self.buf.reserve(self.next_read);
        }
        self.buf.capacity() - self.buf.len()
    }

    /// Records that a read added `n` (now at the end of [`ReadBuffer::bytes`]) of the `room`
    /// bytes [`ReadBuffer::prepare`] offered. A short read that only finished a packet (bytes
    /// were buffered before it) says nothing of the traffic, so it never shrinks the next read
    /// (otherwise packets a little larger than a read would keep it oscillating, each one split
    /// in two).
    pub fn filled(&mut self, n: usize, room: usize) {
        let continued = self.buf.len() > n;
        if n == room {
            self.next_read = (self.next_read * 2).min(MAX_READ);
        } else if n < self.next_read / 4 && !continued {
            self.next_read = (self.next_read / 2).max(MIN_READ);
        }
    }

    /// Reads once from `rd`. Cancel-safe: a read that did not complete consumed nothing.
    #[cfg(feature = "tokio")]
    pub async fn read_from<R: tokio::io::AsyncRead + Unpin>(&mut self, rd: &mut R) -> std::io::Result<usize> {
        let room = self.prepare();
        let n = tokio::io::AsyncReadExt::read_buf(rd, &mut self.buf).await?;
        self.filled(n, room);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_while_reads_fill_it_and_shrinks_when_idle() {
        let mut rb = ReadBuffer::default();
        let room = rb.prepare();
        assert!(room >= MIN_READ);
        rb.filled(room, room);
        assert_eq!(rb.next_read, 2 * MIN_READ);
        for _ in 0..20 {
            let room = rb.prepare();
            rb.bytes().extend_from_slice(&vec![0; room]);
            rb.filled(room, room);
        }
        assert_eq!(rb.next_read, MAX_READ);
        rb.bytes().clear();
        for _ in 0..20 {
            let room = rb.prepare();
            rb.filled(2, room);
        }
        assert_eq!(rb.next_read, MIN_READ);
        assert!(rb.bytes().capacity() <= 4 * MIN_READ, "memory given back");
    }

    /// Reads `packet` bytes as a peer would send them, one packet per read, taking each read
    /// out of the buffer as the decoder does; returns how many reads it took.
    fn read_packet(rb: &mut ReadBuffer, packet: usize) -> usize {
        let (mut left, mut reads) = (packet, 0);
        while left > 0 {
            let room = rb.prepare();
            let n = room.min(left);
            rb.bytes().extend_from_slice(&vec![0; n]);
            rb.filled(n, room);
            left -= n;
            reads += 1;
        }
        let _ = rb.bytes().split_to(packet);
        reads
    }

    #[test]
    fn packets_a_little_larger_than_a_read_settle_on_one_read_each() {
        for packet in [1041, 2100, 8233, 16_500] {
            let mut rb = ReadBuffer::default();
            for _ in 0..20 {
                read_packet(&mut rb, packet);
            }
            let reads: usize = (0..100).map(|_| read_packet(&mut rb, packet)).sum();
            assert_eq!(reads, 100, "{packet}-byte packets");
        }
    }
}
