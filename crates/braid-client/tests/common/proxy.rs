//! A UDP proxy between a QUIC client and the broker that constrains one direction, to show
//! what streams and priorities do on a poor path.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::mpsc;

/// How one direction of the proxy treats datagrams.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Shape {
    /// Forward at once.
    Open,
    /// At most this many bytes per second, with a drop-tail queue of this many datagrams.
    Paced { bytes_per_sec: u64, queue: usize },
    /// At most this many datagrams per second (burst 5), the rest dropped: iptables `limit`.
    Policed { packets_per_sec: u32 },
}

/// Starts a proxy to `broker`; returns the address clients connect to.
pub(crate) async fn udp_proxy(broker: SocketAddr, to_broker: Shape, to_client: Shape) -> SocketAddr {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    back.connect(broker).await.unwrap();
    let addr = front.local_addr().unwrap();
    let client = Arc::new(std::sync::Mutex::new(None::<SocketAddr>));
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let (down_tx, down_rx) = mpsc::unbounded_channel();
    let (f, c) = (front.clone(), client.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = f.recv_from(&mut buf).await {
            *c.lock().unwrap() = Some(from);
            let _ = up_tx.send(buf[..n].to_vec());
        }
    });
    let b = back.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = b.recv(&mut buf).await {
            let _ = down_tx.send(buf[..n].to_vec());
        }
    });
    tokio::spawn(forward(to_broker, up_rx, Out::Broker(back)));
    tokio::spawn(forward(to_client, down_rx, Out::Client(front, client)));
    addr
}

/// Where one direction sends.
enum Out {
    Broker(Arc<UdpSocket>),
    Client(Arc<UdpSocket>, Arc<std::sync::Mutex<Option<SocketAddr>>>),
}

impl Out {
    async fn send(&self, p: &[u8]) {
        match self {
            Out::Broker(s) => {
                let _ = s.send(p).await;
            }
            Out::Client(s, to) => {
                let to = *to.lock().unwrap();
                if let Some(to) = to {
                    let _ = s.send_to(p, to).await;
                }
            }
        }
    }
}

/// Moves datagrams from `rx` to `out`, shaped.
async fn forward(shape: Shape, mut rx: mpsc::UnboundedReceiver<Vec<u8>>, out: Out) {
    let mut queue: VecDeque<Vec<u8>> = VecDeque::new();
    // A policer starts with its burst available, as iptables `limit` does.
    let mut credit = if matches!(shape, Shape::Policed { .. }) { 5.0 } else { 0.0 };
    let mut last = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    loop {
        tokio::select! {
            p = rx.recv() => {
                let Some(p) = p else { return };
                let now = Instant::now();
                match shape {
                    Shape::Open => out.send(&p).await,
                    Shape::Paced { queue: max, .. } => if queue.len() < max { queue.push_back(p) },
                    Shape::Policed { packets_per_sec } => {
                        credit = (credit + now.duration_since(last).as_secs_f64() * f64::from(packets_per_sec)).min(5.0);
                        last = now;
                        if credit >= 1.0 {
                            credit -= 1.0;
                            out.send(&p).await;
                        }
                    }
                }
            }
            _ = tick.tick(), if matches!(shape, Shape::Paced { .. }) => {
                let Shape::Paced { bytes_per_sec, .. } = shape else { continue };
                let now = Instant::now();
                credit = (credit + now.duration_since(last).as_secs_f64() * bytes_per_sec as f64).min(20_000.0);
                last = now;
                while queue.front().is_some_and(|p| credit >= p.len() as f64) {
                    let p = queue.pop_front().expect("front exists");
                    credit -= p.len() as f64;
                    out.send(&p).await;
                }
            }
        }
    }
}
