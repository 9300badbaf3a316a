//! Plain TCP connections, which can park while idle (see [`crate::transport::tcp::park`]).

pub mod accept;
pub mod park;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::BoxFuture;
use rustix::net::RecvFlags;
use tokio::net::tcp::ReadHalf;
use tokio::net::TcpStream;
use tracing::warn;

use braid_proto::{ByteString, BytesMut, ProtocolVersion, ReadBuffer};

use crate::auth::AclSeed;
use crate::broker::{Accepted, Broker, Ending};
use crate::connection::{handshake, Connection, Stop, Via};
use crate::transport::tcp::park::{Parked, ParkingLot};
use crate::transport::Transport;

/// Serves one TCP client; with a `lot`, the connection parks there while idle.
pub async fn serve(
    broker: Arc<Broker>,
    mut stream: TcpStream,
    peer: SocketAddr,
    lot: Option<Arc<ParkingLot>>,
) {
    let start = {
        let (mut rd, mut wr) = stream.split();
        let via = Via::Listener { transport: Transport::Tcp, verified_username: None };
        handshake(&broker, &mut rd, &mut wr, peer, via).await
    };
    let Some(start) = start else { return };
    if let Some(lot) = &lot {
        start.accepted.ctl.allow_parking(lot.clone());
    }
    let kept = (HashMap::new(), start.acl);
    drive(broker, lot, stream, peer, start.accepted, start.version, start.out, start.rbuf, kept).await;
}

/// Carries on with a connection that was parked in `lot` (the lot's [`crate::transport::tcp::park::Resume`]).
pub(crate) fn resume(broker: Arc<Broker>, lot: Arc<ParkingLot>, parked: Parked) -> BoxFuture<'static, ()> {
    Box::pin(resume_parked(broker, lot, parked))
}

async fn resume_parked(broker: Arc<Broker>, lot: Arc<ParkingLot>, parked: Parked) {
    let Parked { stream, accepted, version, aliases, acl } = parked;
    let stream = match TcpStream::from_std(stream) {
        Ok(s) => s,
        Err(e) => {
            warn!(client_id = %accepted.session.client_id, "closing connection: cannot resume it after parking: {e}");
            broker.disconnected(&accepted.session, accepted.generation, Ending::WithWill, Instant::now());
            return;
        }
    };
    let peer = stream.peer_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let kept = (aliases.map(|a| *a).unwrap_or_default(), acl);
    drive(broker, Some(lot), stream, peer, accepted, version, BytesMut::new(), ReadBuffer::default(), kept)
        .await;
}

/// What a connection keeps across parking: its client's topic aliases and its authorization.
type Kept = (HashMap<u16, ByteString>, Option<Box<AclSeed>>);

/// Runs the connection until it ends (then closes it) or parks in `lot`.
#[allow(clippy::too_many_arguments)]
async fn drive(
    broker: Arc<Broker>,
    lot: Option<Arc<ParkingLot>>,
    mut stream: TcpStream,
    peer: SocketAddr,
    accepted: Accepted,
    version: ProtocolVersion,
    out: BytesMut,
    rbuf: ReadBuffer,
    (aliases, acl): Kept,
) {
    let mut conn = Connection::new(&broker, &accepted, version, peer, out);
    let stop = {
        let (mut rd, mut wr) = stream.split();
        let acl = broker.security().resume_acl(acl, &accepted.session.client_id);
        conn.run(&mut rd, &mut wr, rbuf, aliases, acl, unread).await
    };
    let ending = match stop {
        Stop::End(ending) => ending,
        Stop::Park(aliases, acl) => {
            drop(conn);
            let parked = match lot {
                Some(lot) => lot.park(stream, accepted, version, aliases, acl),
                None => Err((accepted, io::Error::other("parking is not enabled"))),
            };
            if let Err((accepted, e)) = parked {
                warn!(%peer, client_id = %accepted.session.client_id, "closing connection: cannot park it: {e}");
                broker.disconnected(&accepted.session, accepted.generation, Ending::WithWill, Instant::now());
            }
            return;
        }
    };
    let (mut rd, mut wr) = stream.split();
    conn.finish(&mut rd, &mut wr, ending).await;
}

/// True if bytes from the client (or its end of stream) wait in the socket's kernel buffer, not
/// yet read: asked of the socket itself, not of the runtime's readiness, which may lag behind.
fn unread(rd: &ReadHalf<'_>) -> bool {
    let mut byte = [0u8];
    let peeked = rustix::net::recv(rd.as_ref(), &mut byte, RecvFlags::PEEK | RecvFlags::DONTWAIT);
    !matches!(peeked, Err(rustix::io::Errno::AGAIN))
}
