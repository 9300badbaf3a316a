//! The plain TCP listener's own thread: connections are accepted, paced by
//! `limits.max_connection_rate` and wait for their CONNECT there (a current-thread runtime);
//! only a connection whose CONNECT was accepted moves to the broker's runtime. Whatever hostile
//! sockets do before CONNECT (slow-loris bytes, silent sockets waiting out the connect timeout,
//! garbage instead of CONNECT, refused clients) then costs that thread, not the workers that
//! serve established clients. The thread runs at the lowest scheduling priority (nice 19), so a
//! connection flood cannot take CPU from those workers either: new connections wait while
//! established clients keep the cores busy.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio_util::task::TaskTracker;
use tracing::{error, warn};

use crate::admission::Admission;
use crate::broker::Broker;
use crate::connection;
use crate::park::ParkingLot;

/// How long stopping waits for the thread's last tasks (refusals being written).
const STOP_WAIT: Duration = Duration::from_secs(1);
/// The thread's nice value: the lowest priority, which an unprivileged process may set.
const NICE: i32 = 19;

/// Runs the accept loop for `listener` on a thread of its own until the broker shuts down; the
/// connections it admits run as tasks of `connections` on the current runtime. Returns once the
/// thread has stopped (connections still waiting for CONNECT are closed). If the thread cannot
/// start, the broker shuts down.
pub async fn run(
    listener: TcpListener,
    broker: Arc<Broker>,
    connections: TaskTracker,
    admission: Arc<Admission>,
    lot: Option<Arc<ParkingLot>>,
) {
    let shutdown = broker.shutdown.clone();
    let main = Handle::current();
    let thread = listener.into_std().and_then(|listener| {
        std::thread::Builder::new().name("braid-handshake".into()).spawn(move || {
            let stop = broker.shutdown.clone();
            lower_priority();
            let started = tokio::runtime::Builder::new_current_thread().enable_all().build().and_then(|rt| {
                let listener = rt.block_on(async { TcpListener::from_std(listener) })?;
                rt.block_on(accept_loop(listener, broker, connections, admission, lot, main));
                rt.shutdown_timeout(STOP_WAIT);
                Ok(())
            });
            if let Err(e) = started {
                error!("cannot accept TCP connections: {e}");
                stop.cancel();
            }
        })
    });
    match thread {
        Ok(thread) => {
            shutdown.cancelled().await;
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        Err(e) => {
            error!("cannot start the TCP listener's thread: {e}");
            shutdown.cancel();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    broker: Arc<Broker>,
    connections: TaskTracker,
    admission: Arc<Admission>,
    lot: Option<Arc<ParkingLot>>,
    main: Handle,
) {
    let shutdown = broker.shutdown.clone();
    loop {
        admission.pace().await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) if !admission.admit() => drop(stream),
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let (broker, lot, main, tasks) = (broker.clone(), lot.clone(), main.clone(), connections.clone());
                    connections.spawn(connection::tcp::serve(broker, stream, peer, lot, main, tasks));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Gives the calling thread (only: on Linux the nice value is a thread's own) the priority
/// [`NICE`]; the broker runs on without it if the system refuses.
fn lower_priority() {
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), NICE) {
        warn!("cannot lower the priority of the thread that accepts TCP connections: {e}");
    }
}
