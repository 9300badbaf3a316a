//! The plain TCP listener's own thread: connections are accepted, paced by
//! `limits.max_connection_rate` and wait there (a current-thread runtime) until their first
//! packet, the CONNECT, has arrived; only then does a connection move to the broker's runtime,
//! which reads the CONNECT and admits the client. What hostile sockets do before their first
//! packet (slow-loris bytes, silent sockets waiting out the connect timeout) then costs that
//! thread, not the workers that serve established clients. The thread runs at the lowest
//! scheduling priority (nice 19), so a connection flood cannot take CPU from those workers
//! either: new connections wait while established clients keep the cores busy.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use rustix::net::RecvFlags;
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;
use tracing::{error, warn};

use crate::broker::Broker;
use crate::transport::admission::Admission;
use crate::transport::listener;
use crate::transport::tcp::park::ParkingLot;

/// The thread's nice value: the lowest priority, which an unprivileged process may set.
const NICE: i32 = 19;

/// How many connections whose first packet arrived may wait for the broker's runtime to take
/// them; beyond that the thread waits too (and accepts no more meanwhile).
const HANDOVER_QUEUE: usize = 1024;

/// A connection whose first packet has arrived, on its way to the broker's runtime, with the
/// token that counts it among the broker's connections until its task there has started.
type Arrival = (std::net::TcpStream, SocketAddr, TaskTrackerToken);

/// Runs the accept loop for `listener` on a thread of its own until the broker shuts down, and
/// runs the connections it hands over as tasks of `connections` on the current runtime. Returns
/// once the thread has stopped (connections still waiting for their first packet are closed).
/// If the thread cannot start, the broker shuts down.
pub async fn run(
    listener: TcpListener,
    broker: Arc<Broker>,
    connections: TaskTracker,
    admission: Arc<Admission>,
    lot: Option<Arc<ParkingLot>>,
) {
    let shutdown = broker.shutdown().clone();
    let (arrived, mut arrivals) = mpsc::channel::<Arrival>(HANDOVER_QUEUE);
    let thread = listener.into_std().and_then(|listener| {
        let (broker, tracker) = (broker.clone(), connections.clone());
        std::thread::Builder::new().name("braid-handshake".into()).spawn(move || {
            let stop = broker.shutdown().clone();
            lower_priority();
            let started = tokio::runtime::Builder::new_current_thread().enable_all().build().and_then(|rt| {
                let listener = rt.block_on(async { TcpListener::from_std(listener) })?;
                // Dropping the runtime then closes the connections still waiting.
                rt.block_on(accept_loop(listener, broker, tracker, admission, arrived));
                Ok(())
            });
            if let Err(e) = started {
                error!("cannot accept TCP connections: {e}");
                stop.cancel();
            }
        })
    });
    let thread = match thread {
        Ok(thread) => thread,
        Err(e) => {
            error!("cannot start the TCP listener's thread: {e}");
            return shutdown.cancel();
        }
    };
    // Registered with the runtime and spawned here (`braid serve` runs the server on the
    // runtime's main thread, not a worker), the connection's reactor registration is allocated
    // from this thread's jemalloc arena, not the workers': there it would be freed (when the
    // connection parks) among the sessions' long-lived allocations of its size and leave their
    // slabs fragmented (measured: ~870 instead of ~660 B per idle connection).
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some((stream, peer, _token)) = arrivals.recv() => match TcpStream::from_std(stream) {
                Ok(stream) => drop(connections.spawn(super::serve(broker.clone(), stream, peer, lot.clone()))),
                Err(e) => warn!(%peer, "closing connection: cannot register it with the broker's runtime: {e}"),
            },
        }
    }
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
}

/// Accepts connections, each of which counts as one of `connections` (for
/// `limits.max_connections`) from the start: its token travels with it to the broker's runtime.
async fn accept_loop(
    listener: TcpListener,
    broker: Arc<Broker>,
    connections: TaskTracker,
    admission: Arc<Admission>,
    arrived: mpsc::Sender<Arrival>,
) {
    admission
        .accept_each(&listener, "tcp", |stream, peer| {
            let arrival = (stream, peer, connections.token());
            tokio::spawn(hand_over(broker.clone(), arrival, arrived.clone()));
        })
        .await;
}

/// Waits (within the connect timeout) until the client's first packet has arrived, then hands
/// the connection to the broker's runtime, where the packet is read and the client admitted and
/// served.
async fn hand_over(
    broker: Arc<Broker>,
    (stream, peer, token): (TcpStream, SocketAddr, TaskTrackerToken),
    arrived: mpsc::Sender<Arrival>,
) {
    match listener::handshake(&broker, peer, "MQTT", first_packet(&stream)).await {
        Some(First::Arrived) => {}
        Some(First::Closed) | None => return,
    }
    // The socket leaves this runtime's reactor for the main one's.
    match stream.into_std() {
        // Fails only when the broker is shutting down.
        Ok(stream) => drop(arrived.send((stream, peer, token)).await),
        Err(e) => warn!(%peer, "closing connection: cannot move it to the broker's runtime: {e}"),
    }
}

/// At most this much of a client's first packet is waited for here; the rest of a bigger one
/// (a CONNECT with a large will message) is read on the broker's runtime.
const FIRST_PACKET_BYTES: u64 = 16 * 1024;

/// The first byte of every CONNECT (packet type 1, flags 0).
const CONNECT_FIRST_BYTE: u8 = 0x10;

/// How a client began.
enum First {
    /// Its first packet is in the socket's kernel buffer (see [`peek_first`]).
    Arrived,
    /// It closed the connection before.
    Closed,
}

/// Waits for the client's first packet without reading it: each arrival of bytes wakes this
/// task once, however the client trickles them.
async fn first_packet(stream: &TcpStream) -> io::Result<First> {
    loop {
        // A client's end of stream stays ready for good: what is peeked then is all there is.
        let ended = stream.ready(Interest::READABLE).await?.is_read_closed();
        match stream.try_io(Interest::READABLE, || peek_first(stream, ended)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            done => return done,
        }
    }
}

/// Whether the client's first packet is whole in the socket's kernel buffer (or its first
/// [`FIRST_PACKET_BYTES`], or bytes that cannot start a CONNECT, which the broker's runtime
/// reads and reports at once), or the client closed (`ended`: its end of stream came) before
/// it was whole; `WouldBlock` while neither.
fn peek_first(stream: &TcpStream, ended: bool) -> io::Result<First> {
    let mut head = [0u8; 5];
    let peeked = rustix::net::recv(stream, &mut head, RecvFlags::PEEK | RecvFlags::DONTWAIT)?;
    if peeked.0 > 0 && head[0] != CONNECT_FIRST_BYTE {
        return Ok(First::Arrived);
    }
    let needed = match braid_proto::packet_size(&head[..peeked.0]) {
        Ok(Some(size)) => (size as u64).min(FIRST_PACKET_BYTES),
        Ok(None) => u64::MAX,
        Err(_) => return Ok(First::Arrived),
    };
    if rustix::io::ioctl_fionread(stream)? >= needed {
        Ok(First::Arrived)
    } else if ended || peeked.0 == 0 {
        Ok(First::Closed)
    } else {
        Err(io::ErrorKind::WouldBlock.into())
    }
}

/// Gives the calling thread (only: on Linux the nice value is a thread's own) the priority
/// [`NICE`]; the broker runs on without it if the system refuses.
fn lower_priority() {
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), NICE) {
        warn!("cannot lower the priority of the thread that accepts TCP connections: {e}");
    }
}
