//! Listeners, the accept loop and graceful shutdown.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use braid_proto::ReasonCode;

use crate::broker::Broker;
use crate::config::Config;
use crate::{connection, quic, sys};

/// A server running in a task of the current runtime, for programs and tests that embed Braid.
/// Dropping it shuts the broker down.
#[derive(Debug)]
pub struct Running {
    /// Where the MQTT/TCP listener is bound.
    pub addr: SocketAddr,
    /// Where the MQTT over QUIC listener is bound (UDP), if `quic.enabled`.
    pub quic_addr: Option<SocketAddr>,
    /// The shared broker state (config, metrics, shutdown token).
    pub broker: Arc<Broker>,
    task: Option<JoinHandle<()>>,
}

impl Running {
    /// Shuts the broker down (v5 clients get DISCONNECT 0x8B) and waits until it has stopped.
    pub async fn shutdown(&mut self) {
        self.broker.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.broker.shutdown.cancel();
    }
}

/// A broker bound to its listeners, ready to run.
pub struct Server {
    broker: Arc<Broker>,
    tcp: TcpListener,
    quic: Option<quinn::Endpoint>,
}

impl Server {
    /// Binds every configured listener.
    pub async fn bind(config: Config) -> io::Result<Server> {
        let addr = config.listeners.tcp;
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("listeners.tcp: cannot listen on {addr}: {e}")))?;
        let quic = if config.quic.enabled { Some(quic::bind(&config)?) } else { None };
        Ok(Server { broker: Broker::new(config), tcp, quic })
    }

    /// Binds `config` and runs the server in a task of the current runtime.
    pub async fn spawn(config: Config) -> io::Result<Running> {
        let server = Server::bind(config).await?;
        let (addr, quic_addr, broker) = (server.local_addr(), server.quic_addr(), server.broker().clone());
        let task = tokio::spawn(server.run());
        Ok(Running { addr, quic_addr, broker, task: Some(task) })
    }

    /// The address the MQTT/TCP listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.tcp.local_addr().expect("a bound listener has an address")
    }

    /// The UDP address the MQTT over QUIC listener is bound to, if enabled.
    pub fn quic_addr(&self) -> Option<SocketAddr> {
        self.quic.as_ref().and_then(|e| e.local_addr().ok())
    }

    /// The shared broker state.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Accepts clients until `broker().shutdown` is cancelled, then closes every connection
    /// (v5 clients get DISCONNECT 0x8B) and returns.
    pub async fn run(self) {
        info!(transport = "tcp", addr = %self.local_addr(), "listening for MQTT");
        tokio::spawn(sys::run(self.broker.clone()));
        tokio::spawn(sweep_keep_alive(self.broker.clone()));
        let shutdown = self.broker.shutdown.clone();
        let connections = TaskTracker::new();
        if let Some(endpoint) = &self.quic {
            tokio::spawn(quic::accept(endpoint.clone(), self.broker.clone(), connections.clone()));
        }
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = self.tcp.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        let (rd, wr) = stream.into_split();
                        connections.spawn(connection::serve(self.broker.clone(), rd, wr, peer));
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        info!(connections = connections.len(), "shutting down");
        self.broker.close_all(ReasonCode::ServerShuttingDown);
        // Every connection sends its DISCONNECT and closes, each within a bounded time.
        connections.close();
        let _ = tokio::time::timeout(Duration::from_secs(3), connections.wait()).await;
        if let Some(endpoint) = &self.quic {
            endpoint.close(0u32.into(), b"shutting down");
            let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        }
    }
}

/// How often silent connections are looked for: a client is closed between 1.5 times its keep
/// alive and that plus this.
const KEEP_ALIVE_SWEEP: Duration = Duration::from_millis(500);

async fn sweep_keep_alive(broker: Arc<Broker>) {
    let mut tick = tokio::time::interval(KEEP_ALIVE_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => broker.expire_silent(),
            _ = broker.shutdown.cancelled() => return,
        }
    }
}
