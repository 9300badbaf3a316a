//! Byte streams to the server. One variant per transport; the connection task reads from a
//! [`ReadHalf`] and writes to a [`WriteHalf`] in one select loop.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::quic::QuicConn;
use crate::{ClientOptions, Transport};

/// The reading side of a connection.
#[derive(Debug)]
pub(crate) enum ReadHalf {
    Tcp(OwnedReadHalf),
    Quic(quinn::RecvStream),
}

/// The writing side of a connection.
#[derive(Debug)]
pub(crate) enum WriteHalf {
    Tcp(OwnedWriteHalf),
    Quic(quinn::SendStream),
}

/// Opens the transport `opts` asks for; over QUIC, also the connection (for data streams).
pub(crate) async fn open(opts: &ClientOptions) -> io::Result<(ReadHalf, WriteHalf, Option<QuicConn>)> {
    match &opts.transport {
        Transport::Tcp => {
            let stream = TcpStream::connect((opts.host.as_str(), opts.port)).await?;
            // Packets are coalesced in the write buffer already; Nagle would only add latency.
            stream.set_nodelay(true)?;
            let (rd, wr) = stream.into_split();
            Ok((ReadHalf::Tcp(rd), WriteHalf::Tcp(wr), None))
        }
        Transport::Quic(q) => {
            let o = crate::quic::open(&opts.host, opts.port, q).await?;
            Ok((ReadHalf::Quic(o.recv), WriteHalf::Quic(o.send), Some(o.conn)))
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            ReadHalf::Quic(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            WriteHalf::Quic(s) => Pin::new(s).poll_write(cx, buf).map_err(io::Error::from),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(s) => Pin::new(s).poll_flush(cx),
            WriteHalf::Quic(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            WriteHalf::Quic(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
