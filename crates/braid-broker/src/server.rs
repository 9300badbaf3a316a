//! Listeners, the accept loop and graceful shutdown.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use braid_proto::ReasonCode;

use crate::auth::Security;
use crate::broker::Broker;
use crate::config::Config;
use crate::store::{Store, UnixClock};
use crate::sys;
use crate::transport::admission::Admission;
use crate::transport::listener::{self, Listeners};
use crate::transport::quic;
use crate::transport::tcp::accept as handshake_thread;
use crate::transport::tcp::park::ParkingLot;
use crate::transport::Transport;

/// A server running in a task of the current runtime, for programs and tests that embed Braid.
/// Dropping it shuts the broker down.
#[derive(Debug)]
pub struct Running {
    /// Where the MQTT/TCP listener is bound.
    pub addr: SocketAddr,
    /// Where the TLS, WebSocket and WSS listeners are bound, if configured.
    pub addrs: listener::Addrs,
    /// Where the MQTT over QUIC listener is bound (UDP), if `quic.enabled`.
    pub quic_addr: Option<SocketAddr>,
    /// The shared broker state (config, metrics, shutdown token).
    pub broker: Arc<Broker>,
    task: Option<JoinHandle<()>>,
}

impl Running {
    /// Shuts the broker down (v5 clients get DISCONNECT 0x8B) and waits until it has stopped.
    pub async fn shutdown(&mut self) {
        self.broker.shutdown().cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.broker.shutdown().cancel();
    }
}

/// A broker bound to its listeners, ready to run.
pub struct Server {
    broker: Arc<Broker>,
    tcp: TcpListener,
    listeners: Listeners,
    quic: Option<quic::Listener>,
}

impl Server {
    /// Checks the authentication and ACL files ([`Security::check`]), opens the store
    /// (reloading persisted sessions) and binds every configured listener. Auth or ACL files
    /// that do not load and unusable TLS files are an `InvalidInput` error that names the key
    /// and the file (for the former, its inner error is the [`crate::config::ConfigError`]).
    pub async fn bind(config: Config) -> io::Result<Server> {
        Security::check(&config).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let broker =
            Broker::open(config).map_err(|e| io::Error::other(format!("store: {e}; refusing to start")))?;
        Server::listen(broker).await
    }

    /// As [`Server::bind`], on `store` instead of the one `store.backend` names (a cluster
    /// node's), which converts times by `clock`.
    pub async fn bind_on(config: Config, store: Arc<dyn Store>, clock: UnixClock) -> io::Result<Server> {
        Security::check(&config).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Server::listen(Broker::open_on(config, store, clock)).await
    }

    async fn listen(broker: Arc<Broker>) -> io::Result<Server> {
        let addr = broker.config().listeners.tcp;
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("listeners.tcp: cannot listen on {addr}: {e}")))?;
        let listeners = Listeners::bind(broker.config()).await?;
        let quic = if broker.config().quic.enabled { Some(quic::bind(broker.config())?) } else { None };
        Ok(Server { broker, tcp, listeners, quic })
    }

    /// Binds `config` and runs the server in a task of the current runtime.
    pub async fn spawn(config: Config) -> io::Result<Running> {
        let server = Server::bind(config).await?;
        let (addr, quic_addr, broker) = (server.local_addr(), server.quic_addr(), server.broker().clone());
        let addrs = server.listeners.addrs();
        let task = tokio::spawn(server.run());
        Ok(Running { addr, addrs, quic_addr, broker, task: Some(task) })
    }

    /// The address the MQTT/TCP listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.tcp.local_addr().expect("a bound listener has an address")
    }

    /// The UDP address the MQTT over QUIC listener is bound to, if enabled.
    pub fn quic_addr(&self) -> Option<SocketAddr> {
        self.quic.as_ref().and_then(|q| q.endpoint.local_addr().ok())
    }

    /// Every MQTT listener with the address it is bound to (QUIC's is UDP).
    pub fn bound(&self) -> Vec<(Transport, SocketAddr)> {
        let a = self.listeners.addrs();
        [
            (Transport::Tcp, Some(self.local_addr())),
            (Transport::Tls, a.tls),
            (Transport::Ws, a.ws),
            (Transport::Wss, a.wss),
            (Transport::Quic, self.quic_addr()),
        ]
        .into_iter()
        .filter_map(|(t, addr)| addr.map(|a| (t, a)))
        .collect()
    }

    /// The shared broker state.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Accepts clients until `broker().shutdown` is cancelled, then closes every connection
    /// (v5 clients get DISCONNECT 0x8B) and returns.
    pub async fn run(self) {
        info!(transport = "tcp", addr = %self.local_addr(), "listening for MQTT");
        self.broker.security().log_startup();
        tokio::spawn(sys::run(self.broker.clone()));
        tokio::spawn(drive_timers(self.broker.clone()));
        tokio::spawn(watch_files(self.broker.clone()));
        let broker = self.broker.clone();
        tokio::spawn(async move { broker.memory().watch(broker.shutdown().clone()).await });
        let connections = TaskTracker::new();
        let lot = match self.broker.config().listeners.park_after_secs {
            0 => None,
            _ => match ParkingLot::start(&self.broker, connections.clone(), crate::transport::tcp::resume) {
                Ok(lot) => Some(lot),
                Err(e) => {
                    warn!("idle connections will not park: cannot start the parking lot: {e}");
                    None
                }
            },
        };
        let admission = Arc::new(Admission::new(&self.broker, &connections));
        self.listeners.spawn(&self.broker, &connections, &admission);
        if let Some(listener) = &self.quic {
            tokio::spawn(quic::accept(
                listener.clone(),
                self.broker.clone(),
                connections.clone(),
                admission.clone(),
            ));
        }
        // Accepting and the wait for CONNECT run on a thread of their own (see handshake_thread).
        handshake_thread::run(self.tcp, self.broker.clone(), connections.clone(), admission, lot.clone())
            .await;
        info!(connections = connections.len(), "shutting down");
        // A cluster node's clients may go on at another node.
        let reason = match self.broker.config().cluster.enabled {
            true => ReasonCode::UseAnotherServer,
            false => ReasonCode::ServerShuttingDown,
        };
        self.broker.close_all(reason);
        // Every connection sends its DISCONNECT and closes, each within a bounded time.
        connections.close();
        let _ = tokio::time::timeout(Duration::from_secs(3), connections.wait()).await;
        if let Some(endpoint) = self.quic.as_ref().map(|q| &q.endpoint) {
            endpoint.close(0u32.into(), b"shutting down");
            let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        }
        if let Some(lot) = lot {
            lot.stop();
        }
        // Everything submitted is written and synced before the process exits.
        let store = self.broker.store().clone();
        let _ = tokio::task::spawn_blocking(move || store.close()).await;
    }
}

/// Reloads the password and ACL files when they change (`auth.reload_interval_secs`).
async fn watch_files(broker: Arc<Broker>) {
    let secs = broker.config().auth.reload_interval_secs;
    if secs == 0 {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(secs));
    loop {
        tokio::select! {
            _ = tick.tick() => broker.security().reload(false),
            _ = broker.shutdown().cancelled() => return,
        }
    }
}

/// Runs the broker's timers (will delays, session expiries, the connection sweep) when they
/// are due: one task for all of them, which the core tells when an earlier one is set.
async fn drive_timers(broker: Arc<Broker>) {
    loop {
        broker.handle_timeout(Instant::now());
        let due = async {
            match broker.poll_timeout() {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = due => {}
            () = broker.timers_changed().notified() => {}
            _ = broker.shutdown().cancelled() => return,
        }
    }
}
