//! The broker's pacing of what it sends to each QUIC client (`quic.pacing`): the pacing
//! braid-client uses for its own sending (crate braid-pacing), per connection. The endpoint's
//! one UDP socket keeps a bucket per client address; each accepted connection registers its
//! bucket for its life and, when adaptive, gets its own governor as congestion controller, so
//! a subscriber behind a policer is paced at what its link delivers while every other client
//! is sent to at full speed.

use std::net::SocketAddr;
use std::sync::Arc;

use braid_pacing::{PacedSocket, Pacing, PeerPace};

/// Accepts QUIC connections with their pacing.
#[derive(Debug)]
pub(crate) struct Pacer {
    pacing: Pacing,
    /// The endpoint's socket, when pacing is not off.
    socket: Option<Arc<PacedSocket>>,
    /// The server configuration every connection starts from.
    server: quinn::ServerConfig,
    idle: quinn::IdleTimeout,
}

impl Pacer {
    /// Wraps the endpoint's `socket` for `pacing` (unchanged when off); `server` and `idle` are
    /// the endpoint's configuration, which each paced connection gets a copy of.
    pub(crate) fn new(
        pacing: Pacing,
        socket: Arc<dyn quinn::AsyncUdpSocket>,
        server: quinn::ServerConfig,
        idle: quinn::IdleTimeout,
    ) -> (Pacer, Arc<dyn quinn::AsyncUdpSocket>) {
        if pacing == Pacing::Off {
            return (Pacer { pacing, socket: None, server, idle }, socket);
        }
        let paced = Arc::new(PacedSocket::per_peer(socket));
        (Pacer { pacing, socket: Some(paced.clone()), server, idle }, paced)
    }

    /// Accepts `incoming` with a bucket of its own; the returned guard keeps the client's
    /// address paced until it is dropped, at the end of the connection.
    pub(crate) fn accept(
        &self,
        incoming: quinn::Incoming,
    ) -> Result<(quinn::Connecting, Option<PeerPace>), quinn::ConnectionError> {
        let Some(socket) = &self.socket else { return Ok((incoming.accept()?, None)) };
        let mut transport = transport_config(self.idle);
        let Some(pace) = self.pacing.configure(&mut transport) else {
            return Ok((incoming.accept()?, None));
        };
        let peer: SocketAddr = incoming.remote_address();
        let guard = socket.pace_peer(peer, pace);
        let mut server = self.server.clone();
        server.transport_config(Arc::new(transport));
        Ok((incoming.accept_with(Arc::new(server))?, Some(guard)))
    }
}

/// Transport settings of every connection: the idle timeout (and, per connection, the
/// pacing governor that [`Pacer`] adds).
pub(super) fn transport_config(idle: quinn::IdleTimeout) -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(idle));
    transport
}
