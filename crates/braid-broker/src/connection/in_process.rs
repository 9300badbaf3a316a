//! In-process clients: parts of Braid that use the broker as MQTT clients do (the bridges: an
//! outbox is a persistent session, a message from outside is a PUBLISH), over an in-memory
//! byte stream instead of a socket. Such a client is not authenticated and no ACL restricts
//! it (its configuration is the operator's), its session's queue follows limits of its own,
//! its client id is under [`RESERVED`], which clients from the network may not use, and in a
//! cluster its session is its node's own ([`crate::session::Session::node_local`]).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::DuplexStream;

use super::{serve, Via};
use crate::broker::Broker;
use crate::session::QueueLimits;

/// The prefix of in-process clients' ids; a CONNECT from a listener with such an id is
/// refused (0x85 Client Identifier not valid).
pub const RESERVED: &str = crate::session::IN_PROCESS;

/// Bytes the in-memory stream buffers each way.
const BUFFER: usize = 256 * 1024;

/// Opens a connection for an in-process client named `name` (for the logs), its session's
/// queue under `limits`: returns the client's end of the stream (it sends CONNECT first, with
/// a client id under [`RESERVED`]); the broker serves the other end in a task of its own.
pub fn connect(broker: &Arc<Broker>, name: &str, limits: Arc<QueueLimits>) -> DuplexStream {
    let (client, server) = tokio::io::duplex(BUFFER);
    let (rd, wr) = tokio::io::split(server);
    let via = Via::InProcess { name: name.to_string(), limits };
    tokio::spawn(serve(broker.clone(), rd, wr, SocketAddr::from(([127, 0, 0, 1], 0)), via));
    client
}
