//! [`WriteThrough`]: a writer whose writes complete only once they are flushed.
//!
//! Braid's connection loops write their buffer with `write` and never call `flush`: on a TCP
//! socket a completed write is on its way. A TLS or WebSocket stream instead buffers what it
//! accepted (records, frames) and sends it on the next write or flush, so the last bytes
//! before an idle period would wait forever. Wrapped in [`WriteThrough`], such a stream
//! reports a write complete only when it has reached the socket.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::AsyncWrite;

/// Completes each write after flushing it.
///
/// A write that returned `Pending` while flushing has already handed its bytes to the inner
/// stream; the caller must retry with a buffer that starts with the same bytes (as `write_all`
/// and Braid's connection loops do), and then gets their count.
#[derive(Debug)]
pub struct WriteThrough<W> {
    inner: W,
    /// Bytes the inner stream accepted whose flush has not completed.
    accepted: usize,
}

impl<W> WriteThrough<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        WriteThrough { inner, accepted: 0 }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for WriteThrough<W> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.accepted == 0 {
            this.accepted = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
            if this.accepted == 0 {
                return Poll::Ready(Ok(0));
            }
        }
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        Poll::Ready(Ok(std::mem::take(&mut this.accepted).min(buf.len())))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};

    #[tokio::test]
    async fn a_completed_write_has_reached_the_peer() {
        let (a, mut b) = tokio::io::duplex(1024);
        // BufWriter holds small writes until flushed, like a TLS or WebSocket stream.
        let mut w = WriteThrough::new(BufWriter::new(a));
        assert_eq!(w.write(b"hello").await.unwrap(), 5);
        let mut got = [0u8; 5];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
    }
}
