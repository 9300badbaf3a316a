//! Byte streams to the server: TCP, TLS, WebSocket, WebSocket over TLS and in-memory. The connection task
//! reads from a [`ReadHalf`] and writes to a [`WriteHalf`] in one select loop, whatever the
//! transport.

use std::fmt::Debug;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use braid_proto::tokio_tungstenite::tungstenite::client::IntoClientRequest;
use braid_proto::tokio_tungstenite::tungstenite::http::HeaderValue;
use braid_proto::{ProtocolVersion, WriteThrough, WsStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::quic::QuicConn;
use crate::{tls, ClientOptions, Transport};

/// Largest WebSocket message accepted without a `max_packet_size`: the largest MQTT packet.
const MQTT_MAX_MESSAGE: usize = 268_435_455 + 5;

/// A stream that is neither plain TCP nor split natively (TLS, WebSocket).
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin + Debug {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + Debug> Io for T {}

pub(crate) type Boxed = Box<dyn Io>;

/// The reading side of a connection.
#[derive(Debug)]
pub(crate) enum ReadHalf {
    Tcp(OwnedReadHalf),
    Boxed(tokio::io::ReadHalf<Boxed>),
    Quic(quinn::RecvStream),
}

/// The writing side of a connection. TLS and WebSocket streams hold back what they were given
/// until flushed, so their writes go through [`WriteThrough`].
#[derive(Debug)]
pub(crate) enum WriteHalf {
    Tcp(OwnedWriteHalf),
    Boxed(WriteThrough<tokio::io::WriteHalf<Boxed>>),
    Quic(quinn::SendStream),
}

fn split(stream: Boxed) -> (ReadHalf, WriteHalf, Option<QuicConn>) {
    let (rd, wr) = tokio::io::split(stream);
    (ReadHalf::Boxed(rd), WriteHalf::Boxed(WriteThrough::new(wr)), None)
}

/// Opens the transport `opts` asks for; over QUIC, also the connection (for data streams).
pub(crate) async fn open(opts: &ClientOptions) -> io::Result<(ReadHalf, WriteHalf, Option<QuicConn>)> {
    match &opts.transport {
        Transport::Tcp => {
            let (rd, wr) = tcp(opts).await?.into_split();
            Ok((ReadHalf::Tcp(rd), WriteHalf::Tcp(wr), None))
        }
        Transport::Quic(q) => {
            let o = crate::quic::open(&opts.host, opts.port, q).await?;
            Ok((ReadHalf::Quic(o.recv), WriteHalf::Quic(o.send), Some(o.conn)))
        }
        Transport::Tls(tls_opts) => {
            Ok(split(Box::new(tls::connect(tcp(opts).await?, &opts.host, tls_opts).await?)))
        }
        Transport::WebSocket { path, tls: None } => {
            Ok(split(Box::new(websocket(tcp(opts).await?, "ws", path, opts).await?)))
        }
        Transport::WebSocket { path, tls: Some(tls_opts) } => {
            let stream = tls::connect(tcp(opts).await?, &opts.host, tls_opts).await?;
            Ok(split(Box::new(websocket(stream, "wss", path, opts).await?)))
        }
        Transport::InMemory(open) => Ok(split(Box::new(open.open()?))),
    }
}

/// A TCP connection to the server, Nagle off (packets are coalesced in the write buffer
/// already; Nagle would only add latency).
async fn tcp(opts: &ClientOptions) -> io::Result<TcpStream> {
    let stream = TcpStream::connect((opts.host.as_str(), opts.port)).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// The WebSocket handshake for MQTT at `path`, offering subprotocol `mqtt` (`mqttv3.1` for
/// MQTT 3.1).
async fn websocket<S>(stream: S, scheme: &str, path: &str, opts: &ClientOptions) -> io::Result<WsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let host = match opts.host.contains(':') {
        true => format!("[{}]", opts.host),
        false => opts.host.clone(),
    };
    let path = if path.starts_with('/') { path.to_string() } else { format!("/{path}") };
    let url = format!("{scheme}://{host}:{}{path}", opts.port);
    let bad = |e: &dyn std::fmt::Display| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {e}"));
    let mut request = url.as_str().into_client_request().map_err(|e| bad(&e))?;
    let subprotocol = if opts.version == ProtocolVersion::V3_1 { "mqttv3.1" } else { "mqtt" };
    request.headers_mut().insert("sec-websocket-protocol", HeaderValue::from_static(subprotocol));
    let max_message = opts.max_packet_size.map_or(MQTT_MAX_MESSAGE, |m| (m as usize).max(16 << 20));
    let (ws, _) = WsStream::connect(request, stream, max_message).await.map_err(|e| {
        io::Error::new(io::ErrorKind::ConnectionRefused, format!("WebSocket handshake with {url}: {e}"))
    })?;
    Ok(ws)
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            ReadHalf::Boxed(s) => Pin::new(s).poll_read(cx, buf),
            ReadHalf::Quic(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            WriteHalf::Boxed(s) => Pin::new(s).poll_write(cx, buf),
            WriteHalf::Quic(s) => Pin::new(s).poll_write(cx, buf).map_err(io::Error::from),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(s) => Pin::new(s).poll_flush(cx),
            WriteHalf::Boxed(s) => Pin::new(s).poll_flush(cx),
            WriteHalf::Quic(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            WriteHalf::Boxed(s) => Pin::new(s).poll_shutdown(cx),
            WriteHalf::Quic(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
