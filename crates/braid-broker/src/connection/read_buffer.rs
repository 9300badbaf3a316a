//! The read buffer of a connection, sized to its traffic: small while the client is idle (an
//! idle connection should cost little memory), growing while reads fill it.

use tokio::io::{AsyncRead, AsyncReadExt};

use braid_proto::BytesMut;

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
    /// The bytes read and not yet decoded.
    pub fn bytes(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Reads once from `rd`. Cancel-safe: a read that did not complete consumed nothing.
    pub async fn read_from<R: AsyncRead + Unpin>(&mut self, rd: &mut R) -> std::io::Result<usize> {
        if self.buf.is_empty() && self.buf.capacity() > 4 * self.next_read {
            // Idle again after a burst: give the memory back.
            self.buf = BytesMut::new();
        }
        if self.buf.capacity() - self.buf.len() < self.next_read / 2 {
            self.buf.reserve(self.next_read);
        }
        let room = self.buf.capacity() - self.buf.len();
        let n = rd.read_buf(&mut self.buf).await?;
        if n == room {
            self.next_read = (self.next_read * 2).min(MAX_READ);
        } else if n < self.next_read / 4 {
            self.next_read = (self.next_read / 2).max(MIN_READ);
        }
        Ok(n)
    }
}
