//! The listeners besides plain TCP: MQTT over TLS, over WebSocket and over WebSocket on TLS.
//! Each accepted socket goes through its handshakes here and is then served by
//! [`crate::connection::serve_verified`] like a TCP client: the transport is only a byte stream.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::task::TaskTracker;
use tracing::info;

use braid_proto::{ByteString, WriteThrough};

use crate::broker::Broker;
use crate::config::Config;
use crate::connection;
use crate::transport::admission::Admission;
use crate::transport::tls::{self, Reloadable};
use crate::transport::{ws, Transport};

/// Where the optional listeners are bound (`None`: not configured).
#[derive(Debug, Clone, Copy, Default)]
pub struct Addrs {
    /// MQTT over TLS.
    pub tls: Option<SocketAddr>,
    /// MQTT over WebSocket.
    pub ws: Option<SocketAddr>,
    /// MQTT over WebSocket over TLS.
    pub wss: Option<SocketAddr>,
}

/// The bound TLS, WebSocket and WSS listeners, with the TLS config they share.
#[derive(Debug)]
pub struct Listeners {
    bound: Vec<(Transport, TcpListener)>,
    tls: Option<Arc<Reloadable>>,
}

impl Listeners {
    /// Loads the TLS files (if a TLS-based listener is configured) and binds every configured
    /// listener. Bad TLS files are an `InvalidInput` error naming the key and the file.
    pub async fn bind(config: &Config) -> io::Result<Listeners> {
        let l = &config.listeners;
        let wanted = [(Transport::Tls, l.tls), (Transport::Ws, l.ws), (Transport::Wss, l.wss)];
        let tls = match l.tls.is_some() || l.wss.is_some() {
            true => Some(Reloadable::load(&config.tls)?),
            false => None,
        };
        let mut bound = Vec::new();
        for (kind, addr) in wanted {
            let Some(addr) = addr else { continue };
            let listener = TcpListener::bind(addr).await.map_err(|e| {
                io::Error::new(e.kind(), format!("listeners.{}: cannot listen on {addr}: {e}", kind.name()))
            })?;
            bound.push((kind, listener));
        }
        Ok(Listeners { bound, tls })
    }

    /// Where each listener is bound.
    pub fn addrs(&self) -> Addrs {
        let mut addrs = Addrs::default();
        for (kind, listener) in &self.bound {
            let addr = listener.local_addr().ok();
            match kind {
                Transport::Tls => addrs.tls = addr,
                Transport::Ws => addrs.ws = addr,
                Transport::Wss => addrs.wss = addr,
                // Bound elsewhere (the handshake thread, the QUIC endpoint).
                Transport::Tcp | Transport::Quic => {}
            }
        }
        addrs
    }

    /// Starts the accept loops (and the TLS reload watcher); connections are spawned on
    /// `connections`. Everything stops when the broker shuts down.
    pub fn spawn(self, broker: &Arc<Broker>, connections: &TaskTracker, admission: &Arc<Admission>) {
        if let Some(tls) = &self.tls {
            tokio::spawn(tls.clone().watch(broker.shutdown().clone()));
        }
        for (kind, listener) in self.bound {
            let accept =
                Accept { kind, broker: broker.clone(), tls: self.tls.clone(), admission: admission.clone() };
            tokio::spawn(accept.run(listener, connections.clone()));
        }
    }
}

/// One listener's accept loop.
struct Accept {
    kind: Transport,
    broker: Arc<Broker>,
    tls: Option<Arc<Reloadable>>,
    admission: Arc<Admission>,
}

impl Accept {
    async fn run(self, listener: TcpListener, connections: TaskTracker) {
        if let Ok(addr) = listener.local_addr() {
            info!(transport = self.kind.name(), %addr, "listening for MQTT");
        }
        let transport = self.kind.name();
        self.admission
            .accept_each(&listener, transport, |stream, peer| {
                let acceptor = self.tls.as_ref().map(|t| TlsAcceptor::from(t.current()));
                connections.spawn(serve(self.kind, self.broker.clone(), stream, peer, acceptor));
            })
            .await;
    }
}

/// Runs a handshake bounded by `mqtt.connect_timeout_secs` and the broker's shutdown; `None`
/// (logged) if it failed.
pub(crate) async fn handshake<T, E: std::fmt::Display>(
    broker: &Broker,
    peer: SocketAddr,
    what: &str,
    f: impl Future<Output = Result<T, E>>,
) -> Option<T> {
    let timeout = Duration::from_secs(broker.config().mqtt.connect_timeout_secs);
    tokio::select! {
        done = tokio::time::timeout(timeout, f) => match done {
            Ok(Ok(t)) => Some(t),
            Ok(Err(e)) => {
                info!(%peer, "{what} handshake failed: {e}");
                None
            }
            Err(_) => {
                info!(%peer, "{what} handshake not done within {}s", timeout.as_secs());
                None
            }
        },
        _ = broker.shutdown().cancelled() => None,
    }
}

/// The user name for a TLS client: the certificate's name when `tls.use_cn_as_username` is on
/// and a certificate was presented. `Err` when the certificate has no usable name.
fn tls_username(broker: &Broker, stream: &TlsStream<TcpStream>) -> Result<Option<ByteString>, ()> {
    if !broker.config().tls.use_cn_as_username {
        return Ok(None);
    }
    let Some(cert) = stream.get_ref().1.peer_certificates().and_then(|c| c.first()) else {
        return Ok(None);
    };
    tls::certificate_username(cert).map(|name| Some(ByteString::from(name))).ok_or(())
}

/// Handshakes, then serves the MQTT connection.
async fn serve(
    kind: Transport,
    broker: Arc<Broker>,
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
) {
    let broker = &broker;
    if kind == Transport::Ws {
        if let Some(ws) = handshake(broker, peer, "WebSocket", ws::accept(stream, broker.config())).await {
            serve_stream(broker, ws, peer, kind, None).await;
        }
        return;
    }
    let Some(acceptor) = tls else { return };
    let Some(stream) = handshake(broker, peer, "TLS", acceptor.accept(stream)).await else { return };
    let Ok(username) = tls_username(broker, &stream) else {
        info!(%peer, "closing connection: the client certificate has no CN or SAN to use as user name");
        return;
    };
    if let Some(name) = &username {
        info!(%peer, username = %name, "TLS client certificate accepted");
    }
    if kind == Transport::Wss {
        if let Some(ws) = handshake(broker, peer, "WebSocket", ws::accept(stream, broker.config())).await {
            serve_stream(broker, ws, peer, kind, username).await;
        }
    } else {
        serve_stream(broker, stream, peer, kind, username).await;
    }
}

/// Serves MQTT on a TLS or WebSocket stream. Such streams hold back what they were given
/// until flushed, so writes go through [`WriteThrough`].
async fn serve_stream<S>(
    broker: &Arc<Broker>,
    stream: S,
    peer: SocketAddr,
    kind: Transport,
    username: Option<ByteString>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (rd, wr) = tokio::io::split(stream);
    let verified = username.map(|name| name.to_string());
    connection::serve_verified(broker.clone(), rd, WriteThrough::new(wr), peer, kind, verified).await;
}
