//! The HTTP upgrade that opens a WebSocket, done by tungstenite on a stream lent to it.
//!
//! tungstenite reads the peer's HTTP head in chunks, so a chunk may carry the peer's first
//! frames too; tungstenite would keep them in its own buffer. [`Upgrading`] ends each read at
//! the end of the HTTP head (the empty line) and keeps what followed for the frame decoder.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream during the HTTP upgrade.
#[derive(Debug)]
pub(super) struct Upgrading<S> {
    pub(super) inner: S,
    /// How much of `\r\n\r\n` the bytes read so far end with.
    matched: u8,
    /// True once the HTTP head is complete: reads end there.
    done: bool,
    /// Bytes read after the HTTP head.
    pub(super) early: Vec<u8>,
}

impl<S> Upgrading<S> {
    pub(super) fn new(inner: S) -> Self {
        Upgrading { inner, matched: 0, done: false, early: Vec::new() }
    }

    /// Where in `bytes` (read after everything seen so far) the HTTP head ends, if it does.
    fn head_end(&mut self, bytes: &[u8]) -> Option<usize> {
        for (i, &b) in bytes.iter().enumerate() {
            self.matched = match (self.matched, b) {
                (0 | 2, b'\r') => self.matched + 1,
                (1 | 3, b'\n') => self.matched + 1,
                (_, b'\r') => 1,
                _ => 0,
            };
            if self.matched == 4 {
                return Some(i + 1);
            }
        }
        None
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Upgrading<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.done {
            // tungstenite has the whole head; what follows is not for it.
            return Poll::Ready(Ok(()));
        }
        let start = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Some(end) = this.head_end(&buf.filled()[start..]) {
            this.early.extend_from_slice(&buf.filled()[start + end..]);
            this.done = true;
            buf.set_filled(start + end);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Upgrading<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
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

    #[test]
    fn the_head_ends_at_the_first_empty_line_across_reads() {
        let mut u = Upgrading::new(());
        assert_eq!(u.head_end(b"GET / HTTP/1.1\r\nHost: x\r"), None);
        assert_eq!(u.head_end(b"\n\r"), None);
        assert_eq!(u.head_end(b"\n\x82\x80"), Some(1));
        let mut u = Upgrading::new(());
        assert_eq!(u.head_end(b"a\r\r\n\r\nb"), Some(6));
    }
}
