//! [`WsStream`]: a WebSocket connection seen as a byte stream, so MQTT over WebSocket runs
//! through the same connection code as MQTT over TCP.
//!
//! MQTT over WebSocket (MQTT 5.0 §6) sends MQTT bytes in binary messages; message boundaries
//! mean nothing: one packet may span several messages and one message may hold several packets.
//! Reading yields the payloads of binary messages one after the other; each write becomes one
//! binary message. Pings are answered by the WebSocket layer, a Close ends the stream, and a text
//! message is an error (MQTT-6.0.0-1: the connection must be closed).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

/// A WebSocket connection read and written as a stream of MQTT bytes.
#[derive(Debug)]
pub struct WsStream<S> {
    ws: WebSocketStream<S>,
    /// What is left of the last binary message read.
    pending: Bytes,
}

impl<S> WsStream<S> {
    /// Wraps an open (handshaken) WebSocket.
    pub fn new(ws: WebSocketStream<S>) -> Self {
        WsStream { ws, pending: Bytes::new() }
    }

    /// The WebSocket settings for MQTT: frames and messages up to `max_message` bytes, a small
    /// read buffer (tungstenite's default of 128 KiB per connection would make an idle MQTT
    /// connection cost 60 times more) and no write batching (each write is one message and is
    /// flushed by the caller).
    pub fn config(max_message: usize) -> WebSocketConfig {
        WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER)
            .write_buffer_size(0)
            .max_message_size(Some(max_message))
            .max_frame_size(Some(max_message))
    }
}

/// Bytes tungstenite reads from the socket at a time.
const READ_BUFFER: usize = 4 * 1024;

fn io_error(e: WsError) -> io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::ConnectionClosed | WsError::AlreadyClosed => io::ErrorKind::NotConnected.into(),
        other => io::Error::new(io::ErrorKind::InvalidData, other),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.pending.is_empty() {
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => this.pending = data,
                // Answered by tungstenite on the next read or write.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "text WebSocket message (MQTT must use binary messages)",
                    )))
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(WsError::ConnectionClosed)) => {
                    return Poll::Ready(Ok(()))
                }
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
            }
        }
        let n = this.pending.len().min(buf.remaining());
        buf.put_slice(&this.pending[..n]);
        this.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let ws = &mut self.get_mut().ws;
        ready!(Pin::new(&mut *ws).poll_ready(cx)).map_err(io_error)?;
        Pin::new(ws).start_send(Message::Binary(Bytes::copy_from_slice(buf))).map_err(io_error)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().ws).poll_flush(cx).map_err(io_error)
    }

    /// Sends a Close frame.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(Pin::new(&mut self.get_mut().ws).poll_close(cx)) {
            Ok(()) | Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }
}
