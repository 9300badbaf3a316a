//! [`WsStream`]: a WebSocket connection seen as a byte stream, so MQTT over WebSocket runs
//! through the same connection code as MQTT over TCP.
//!
//! MQTT over WebSocket (MQTT 5.0 §6) sends MQTT bytes in binary messages; message boundaries
//! mean nothing: one packet may span several messages and one message may hold several packets.
//! tungstenite does the HTTP upgrade; the frames are Braid's own ([`frame`]): reading yields the
//! payload of binary frames as it arrives, unmasked in place, so a reader sees the bytes of a
//! large message while they trickle in, exactly as on TCP. Each write becomes one binary frame
//! (of at most 64 KiB). Pings are answered with pongs, a close frame with a close frame and then end of stream, and
//! a text frame or any other protocol violation is an error after which the connection is
//! closed with the matching status code (MQTT-6.0.0-1 for text).

mod frame;
mod upgrade;

#[doc(hidden)]
pub use frame::fuzz_ws_decode;

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::client::Response;
use tokio_tungstenite::tungstenite::handshake::server::Callback;
use tokio_tungstenite::tungstenite::Error as WsError;

use frame::{Decoder, Role, Violation};
use upgrade::Upgrading;

/// Largest frame a write becomes; a longer write is taken in parts.
const MAX_WRITE_FRAME: usize = 64 * 1024;
/// A send buffer that grew beyond this is released once written.
const KEEP_OUT: usize = 4 * 1024;

/// A WebSocket connection read and written as a stream of MQTT bytes.
#[derive(Debug)]
pub struct WsStream<S> {
    inner: S,
    role: Role,
    decoder: Decoder,
    /// Bytes that arrived with the end of the HTTP upgrade, decoded before reading more.
    early: Vec<u8>,
    /// Encoded frames; the first `sent` bytes have been written to `inner`.
    out: Vec<u8>,
    sent: usize,
    /// Bytes were written to `inner` and not yet flushed.
    unflushed: bool,
    /// A close frame is queued or sent: no frame may follow it.
    closing: bool,
    /// Why reading ended: a close frame or the end of the stream (`Ok`), or a violation.
    read_end: Option<Result<(), Violation>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    /// Runs the server side of the HTTP upgrade on `stream`. `callback` sees the request and
    /// returns the response (or refuses). Messages from the client may be up to `max_message`
    /// bytes.
    pub async fn accept<C: Callback + Unpin>(
        stream: S,
        callback: C,
        max_message: usize,
    ) -> Result<Self, WsError> {
        let mut upgrading = Upgrading::new(stream);
        tokio_tungstenite::accept_hdr_async(&mut upgrading, callback).await?;
        Ok(WsStream::upgraded(upgrading, Role::Server, max_message))
    }

    /// Runs the client side of the HTTP upgrade on `stream` with `request`, and returns the
    /// server's response too. Messages from the server may be up to `max_message` bytes.
    pub async fn connect<R: IntoClientRequest + Unpin>(
        request: R,
        stream: S,
        max_message: usize,
    ) -> Result<(Self, Response), WsError> {
        let mut upgrading = Upgrading::new(stream);
        let (_, response) = tokio_tungstenite::client_async(request, &mut upgrading).await?;
        Ok((WsStream::upgraded(upgrading, Role::Client, max_message), response))
    }
}

impl<S> WsStream<S> {
    fn upgraded(upgrading: Upgrading<S>, role: Role, max_message: usize) -> Self {
        WsStream {
            inner: upgrading.inner,
            role,
            decoder: Decoder::new(role, max_message as u64),
            early: upgrading.early,
            out: Vec::new(),
            sent: 0,
            unflushed: false,
            closing: false,
            read_end: None,
        }
    }

    /// Queues a frame (nothing after a close frame).
    fn queue(&mut self, opcode: u8, payload: &[u8]) {
        if !self.closing {
            frame::encode(&mut self.out, self.role, opcode, payload);
            self.closing = opcode == frame::CLOSE;
        }
    }

    /// Queues a close frame with `code` and `reason`.
    fn queue_close(&mut self, code: u16, reason: &str) {
        let payload = [&code.to_be_bytes()[..], reason.as_bytes()].concat();
        self.queue(frame::CLOSE, &payload);
    }
}

fn violation_error(v: Violation) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("WebSocket: {} (closed with {})", v.reason, v.code))
}

impl<S: AsyncWrite + Unpin> WsStream<S> {
    /// Writes the queued frames to `inner`.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
            self.unflushed = true;
        }
        self.sent = 0;
        self.out.clear();
        if self.out.capacity() > KEEP_OUT {
            self.out = Vec::new();
        }
        Poll::Ready(Ok(()))
    }

    /// Writes the queued frames and flushes `inner`.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        if self.unflushed {
            ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A pong or close frame still to send goes out on the reader's turn as well: the peer
        // may be waiting for it while the writer has nothing to say. (A write error shows on
        // the next write.)
        if this.sent < this.out.len() || this.unflushed {
            let _ = this.poll_send(cx);
        }
        let entry = buf.filled().len();
        loop {
            let decoded = buf.filled().len() > entry;
            match this.read_end {
                // What was decoded goes first; the end shows on the next read.
                Some(_) if decoded => return Poll::Ready(Ok(())),
                Some(Ok(())) => return Poll::Ready(Ok(())),
                Some(Err(v)) => return Poll::Ready(Err(violation_error(v))),
                None if buf.remaining() == 0 => return Poll::Ready(Ok(())),
                None => {}
            }
            let (start, room) = (buf.filled().len(), buf.remaining());
            if this.early.is_empty() {
                match Pin::new(&mut this.inner).poll_read(cx, buf) {
                    Poll::Ready(Ok(())) if buf.filled().len() == start => {
                        this.read_end = Some(Ok(()));
                        continue;
                    }
                    Poll::Ready(Ok(())) => {}
                    // An error shows on the next read, after what was decoded.
                    Poll::Ready(Err(_)) | Poll::Pending if decoded => return Poll::Ready(Ok(())),
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            } else {
                let n = this.early.len().min(room);
                buf.put_slice(&this.early[..n]);
                this.early.drain(..n);
            }
            let read = buf.filled().len() - start;
            match this.decoder.decode(&mut buf.filled_mut()[start..]) {
                Ok(n) => buf.set_filled(start + n),
                Err(v) => {
                    buf.set_filled(start);
                    this.read_end = Some(Err(v));
                    this.queue_close(v.code, v.reason);
                }
            }
            if let Some(payload) = this.decoder.take_pong() {
                this.queue(frame::PONG, &payload);
            }
            if let Some(payload) = this.decoder.take_close_reply() {
                this.queue(frame::CLOSE, &payload);
                this.read_end = Some(Ok(()));
            }
            if this.sent < this.out.len() {
                let _ = this.poll_send(cx);
            }
            // A read that filled all the room offered may have left more behind: read on into
            // the room the frame headers freed, so the caller sees reads as full as on TCP.
            if buf.filled().len() > entry && read < room {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    /// Sends up to 64 KiB of `buf` as one binary frame. The frame is complete in the send
    /// buffer when this returns; it reaches the peer by the next write or flush at the latest.
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(this.poll_drain(cx))?;
        if this.closing {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "WebSocket closed")));
        }
        let n = buf.len().min(MAX_WRITE_FRAME);
        this.queue(frame::BINARY, &buf[..n]);
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_send(cx)
    }

    /// Sends a close frame (unless one was sent already) and shuts the stream down.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.closing {
            this.queue_close(frame::NORMAL_CLOSURE, "");
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio_tungstenite::tungstenite::handshake::server::NoCallback;

    const UPGRADE: &[u8] =
        b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    /// A server and a client WebSocket connected to each other.
    async fn pair() -> (WsStream<DuplexStream>, WsStream<DuplexStream>) {
        let (a, b) = tokio::io::duplex(16 * 1024);
        let (server, client) = tokio::join!(
            WsStream::accept(a, NoCallback, 1 << 20),
            WsStream::connect("ws://localhost/mqtt", b, 1 << 20)
        );
        (server.unwrap(), client.unwrap().0)
    }

    /// Frames as a client sends them, written past the client's `WsStream`.
    async fn send_raw(client: &mut WsStream<DuplexStream>, frames: &[(u8, &[u8])]) {
        let mut wire = Vec::new();
        for (opcode, payload) in frames {
            frame::encode(&mut wire, Role::Client, *opcode, payload);
        }
        client.inner.write_all(&wire).await.unwrap();
    }

    /// The next `n` raw bytes the server sent to `client`.
    async fn recv_raw(client: &mut WsStream<DuplexStream>, n: usize) -> Vec<u8> {
        let mut got = vec![0; n];
        client.inner.read_exact(&mut got).await.unwrap();
        got
    }

    /// Writes `data` on `from` and reads it on `to`.
    async fn cross(from: &mut WsStream<DuplexStream>, to: &mut WsStream<DuplexStream>, data: &[u8]) {
        let mut got = vec![0; data.len()];
        let (sent, read) = tokio::join!(
            async {
                from.write_all(data).await?;
                from.flush().await
            },
            to.read_exact(&mut got)
        );
        sent.unwrap();
        read.unwrap();
        assert!(got == data);
    }

    #[tokio::test]
    async fn bytes_cross_both_ways() {
        let (mut server, mut client) = pair().await;
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        cross(&mut client, &mut server, &data).await;
        cross(&mut server, &mut client, &data).await;
    }

    #[tokio::test]
    async fn a_ping_is_answered_and_a_close_ends_the_stream() {
        let (mut server, mut client) = pair().await;
        send_raw(&mut client, &[(frame::PING, b"hi"), (frame::BINARY, b"x")]).await;
        let mut got = [0u8; 8];
        assert_eq!(server.read(&mut got).await.unwrap(), 1);
        assert_eq!(recv_raw(&mut client, 4).await, [0x8A, 2, b'h', b'i'], "pong");
        client.shutdown().await.unwrap();
        assert_eq!(server.read(&mut got).await.unwrap(), 0, "end of stream");
        assert_eq!(recv_raw(&mut client, 4).await, [0x88, 2, 0x03, 0xE8], "close 1000 echoed");
        assert_eq!(server.write(b"late").await.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn a_text_frame_is_an_error_and_closes_with_1003() {
        let (mut server, mut client) = pair().await;
        send_raw(&mut client, &[(frame::TEXT, b"\xc0\x00")]).await;
        let err = server.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("text frame"), "{err}");
        assert_eq!(recv_raw(&mut client, 4).await[..4], [0x88, 53, 0x03, 0xEB], "close 1003 and a reason");
    }

    #[tokio::test]
    async fn frames_sent_with_the_upgrade_request_are_read() {
        let (a, mut b) = tokio::io::duplex(16 * 1024);
        let mut wire = UPGRADE.to_vec();
        frame::encode(&mut wire, Role::Client, frame::BINARY, b"early");
        b.write_all(&wire).await.unwrap();
        let mut server = WsStream::accept(a, NoCallback, 1 << 20).await.unwrap();
        let mut got = [0u8; 5];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"early");
    }
}
