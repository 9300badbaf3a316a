//! Parking idle plain-TCP connections.
//!
//! Most connections of a large fleet are idle most of the time. A connection's task, its tokio
//! I/O registration and its read buffer cost well over a kilobyte, so an idle connection gives
//! them up: when the broker's sweeper finds it silent both ways for `listeners.park_after_secs`,
//! its task hands the socket and the little state it needs to the parking lot and ends. The lot
//! watches parked sockets with one epoll instance of its own (a thread blocked in `epoll_wait`;
//! the kernel keeps the interest list, no user memory per socket). Bytes from the client, a
//! delivery or a close request ([`ConnControl::wake`]) give the connection a new task, which
//! carries on exactly where the old one stopped.

use std::collections::HashMap;
use std::io;
use std::net::TcpStream as StdTcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use futures_util::future::BoxFuture;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use parking_lot::Mutex;
use slab::Slab;
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio_util::task::TaskTracker;
use tracing::warn;

use braid_proto::{ByteString, ProtocolVersion};

use crate::auth::AclSeed;
use crate::broker::{Accepted, Broker};
use crate::control::{ConnControl, Unpark};
use crate::metrics::Metrics;

/// The lot's own token, used to stop its thread.
const STOP: Token = Token(usize::MAX);

/// What a parked connection keeps.
pub(crate) struct Parked {
    /// The socket, deregistered from tokio.
    pub stream: StdTcpStream,
    /// Its session attachment.
    pub accepted: Accepted,
    /// The protocol version it speaks.
    pub version: ProtocolVersion,
    /// What it keeps of its authorization.
    pub acl: Option<Box<AclSeed>>,
    /// Topic aliases the client defined (v5), if any. Boxed: 8 bytes for the common none.
    #[allow(clippy::box_collection)]
    pub aliases: Option<Box<HashMap<u16, ByteString>>>,
}

/// Carries on with a connection that was parked in the lot: the task the lot spawns for it.
pub(crate) type Resume = fn(Arc<Broker>, Arc<ParkingLot>, Parked) -> BoxFuture<'static, ()>;

/// Parked connections and the thread that watches their sockets.
pub struct ParkingLot {
    registry: Registry,
    stop_waker: Waker,
    stopped: AtomicBool,
    parked: Mutex<Slab<Box<Parked>>>,
    runtime: Handle,
    tasks: TaskTracker,
    broker: Weak<Broker>,
    resume: Resume,
    /// This lot, for the tasks it spawns.
    this: Weak<ParkingLot>,
}

impl Unpark for ParkingLot {
    /// Gives the connection parked under `key` a new task. Called once per park, by whoever
    /// won [`ConnControl::unpark`].
    fn unpark(&self, key: u32) {
        let Some(parked) = self.parked.lock().try_remove(key as usize) else { return };
        let _ = self.registry.deregister(&mut SourceFd(&parked.stream.as_raw_fd()));
        let (Some(broker), Some(lot)) = (self.broker.upgrade(), self.this.upgrade()) else { return };
        broker.metrics().clients_parked.fetch_sub(1, Ordering::Relaxed);
        let _runtime = self.runtime.enter();
        self.tasks.spawn((self.resume)(broker, lot, *parked));
    }
}

impl std::fmt::Debug for ParkingLot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkingLot").field("parked", &self.parked.lock().len()).finish()
    }
}

impl ParkingLot {
    /// Starts a lot whose resumed connections run `resume` as tasks of `tasks` on the current
    /// runtime.
    pub(crate) fn start(
        broker: &Arc<Broker>,
        tasks: TaskTracker,
        resume: Resume,
    ) -> io::Result<Arc<ParkingLot>> {
        let mut poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let stop_waker = Waker::new(poll.registry(), STOP)?;
        let lot = Arc::new_cyclic(|this| ParkingLot {
            registry,
            stop_waker,
            stopped: AtomicBool::new(false),
            parked: Mutex::new(Slab::new()),
            runtime: Handle::current(),
            tasks,
            broker: Arc::downgrade(broker),
            resume,
            this: this.clone(),
        });
        let watcher = lot.clone();
        std::thread::Builder::new().name("braid-park".into()).spawn(move || watcher.watch(&mut poll))?;
        Ok(lot)
    }

    /// Stops the watching thread (every connection must have been closed first).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let _ = self.stop_waker.wake();
    }

    /// Parks `stream` with its state. On failure the socket is closed and the attachment is
    /// handed back, for the caller to end the connection.
    pub(crate) fn park(
        &self,
        stream: TcpStream,
        accepted: Accepted,
        version: ProtocolVersion,
        aliases: HashMap<u16, ByteString>,
        acl: Option<Box<AclSeed>>,
    ) -> Result<(), (Accepted, io::Error)> {
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => return Err((accepted, e)),
        };
        let ctl = accepted.ctl.clone();
        let fd = stream.as_raw_fd();
        {
            let mut slab = self.parked.lock();
            let entry = slab.vacant_entry();
            // A slab index: below the number of open sockets, so within 32 bits.
            let Ok(key) = u32::try_from(entry.key()) else {
                return Err((accepted, io::Error::other("too many parked connections")));
            };
            let aliases = (!aliases.is_empty()).then(|| Box::new(aliases));
            entry.insert(Box::new(Parked { stream, accepted, version, acl, aliases }));
            // Marked parked before the socket is watched, so that a readiness event finds it.
            ctl.set_parked(key);
            if let Err(e) =
                self.registry.register(&mut SourceFd(&fd), Token(key as usize), Interest::READABLE)
            {
                ctl.clear_parked(key);
                return Err((slab.remove(key as usize).accepted, e));
            }
            // Counted under the slab's lock, which an unpark takes before it counts down.
            if let Some(broker) = self.broker.upgrade() {
                Metrics::add(&broker.metrics().clients_parked, 1);
            }
        }
        // A wake that came while parking unparks it at once.
        ctl.unpark_if_woken();
        Ok(())
    }

    fn watch(self: Arc<Self>, poll: &mut Poll) {
        let mut events = Events::with_capacity(1024);
        loop {
            if let Err(e) = poll.poll(&mut events, None) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                warn!("parking lot stopped: {e}");
                return;
            }
            for event in events.iter() {
                if event.token() == STOP {
                    if self.stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    continue;
                }
                let ctl: Option<Arc<ConnControl>> =
                    self.parked.lock().get(event.token().0).map(|p| p.accepted.ctl.clone());
                if let Some(ctl) = ctl {
                    ctl.unpark();
                }
            }
        }
    }
}
