//! The paced UDP socket: token buckets in packets per second ([`Pace`]) that datagrams wait
//! for before they are built and sent.
//!
//! A client endpoint has one connection and one bucket. A server endpoint sends to every peer
//! through one socket, so each peer has its own bucket ([`PacedSocket::per_peer`],
//! [`PacedSocket::pace_peer`]). quinn asks the socket whether a connection may send through
//! a poller of that connection's own, which knows nothing of the peer; the peer is learned from
//! the datagram itself: quinn's connection driver calls the poller's `poll_writable` and, when
//! it is ready, `try_send` right after on the same thread, so the poller leaves a handle to
//! itself in a thread-local slot that `try_send` takes and binds to the destination's bucket.
//! From then on the poller waits for that bucket's tokens before it reports ready, so the
//! next packet is built only when it can leave. Datagrams the endpoint sends by itself
//! (stateless resets, version negotiation) have no poller and are never paced.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// A token bucket in packets: the rate (none: unlimited) and the tokens available.
#[derive(Debug)]
struct Bucket {
    rate: Option<f64>,
    tokens: f64,
    last: Instant,
    /// The per-peer socket's count of paced peers, while this bucket is registered with it.
    paced: Option<Arc<AtomicUsize>>,
}

impl Bucket {
    /// Burst allowed at `rate`: two packets, or 4 ms worth at high rates (timer granularity).
    fn capacity(rate: f64) -> f64 {
        (rate * 0.004).max(2.0)
    }

    fn refill(&mut self, now: Instant) {
        if let Some(rate) = self.rate {
            let earned = now.saturating_duration_since(self.last).as_secs_f64() * rate;
            self.tokens = (self.tokens + earned).min(Bucket::capacity(rate));
        }
        self.last = now;
    }

    /// When a packet may go: `None` now, else the instant a token is there.
    fn ready_at(&mut self, now: Instant) -> Option<Instant> {
        self.refill(now);
        let rate = self.rate?;
        (self.tokens < 1.0).then(|| now + Duration::from_secs_f64((1.0 - self.tokens) / rate))
    }

    /// Counts this bucket in (`true`) or out of its socket's paced peers.
    fn count_paced(&self, paced: bool) {
        if let Some(count) = &self.paced {
            if paced {
                count.fetch_add(1, Ordering::AcqRel);
            } else {
                count.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// Shared handle on a token bucket: the socket spends it, the governor sets its rate.
#[derive(Clone, Debug)]
pub struct Pace(Arc<Mutex<Bucket>>);

impl Pace {
    /// A bucket at `rate` packets per second (`None`: not pacing until a rate is set).
    pub fn new(rate: Option<f64>) -> Pace {
        let tokens = rate.map_or(0.0, Bucket::capacity);
        Pace(Arc::new(Mutex::new(Bucket { rate, tokens, last: Instant::now(), paced: None })))
    }

    fn lock(&self) -> MutexGuard<'_, Bucket> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_rate(&self, rate: Option<f64>) {
        let mut b = self.lock();
        b.refill(Instant::now());
        if b.rate.is_none() {
            b.tokens = rate.map_or(0.0, Bucket::capacity);
        }
        if b.rate.is_some() != rate.is_some() {
            b.count_paced(rate.is_some());
        }
        b.rate = rate;
    }

    /// The current rate in packets per second (none: not pacing).
    pub fn rate(&self) -> Option<f64> {
        self.lock().rate
    }

    fn same(&self, other: &Pace) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Which bucket a datagram spends.
#[derive(Debug)]
enum Buckets {
    /// A client's endpoint: its one connection's.
    One(Pace),
    /// A server's endpoint: the destination's, if it is paced.
    PerPeer {
        peers: DashMap<SocketAddr, Pace>,
        /// Peers whose bucket has a rate: while any has, datagrams go one at a time.
        paced: Arc<AtomicUsize>,
    },
}

/// What a poller knows of the bucket its connection spends: the peer's address and bucket.
type Binding = Mutex<Option<(SocketAddr, Option<Pace>)>>;

thread_local! {
    /// The binding of the poller that has just reported ready, for the `try_send` that follows.
    static READY: RefCell<Option<Arc<Binding>>> = const { RefCell::new(None) };
}

/// A UDP socket that sends at most at its buckets' pace.
#[derive(Debug)]
pub struct PacedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    buckets: Buckets,
}

impl PacedSocket {
    /// A client's socket: every datagram spends `pace`.
    pub fn new(inner: Arc<dyn AsyncUdpSocket>, pace: Pace) -> PacedSocket {
        PacedSocket { inner, buckets: Buckets::One(pace) }
    }

    /// A server's socket: datagrams to a peer registered with [`PacedSocket::pace_peer`] spend
    /// its bucket; others are not paced.
    pub fn per_peer(inner: Arc<dyn AsyncUdpSocket>) -> PacedSocket {
        let buckets = Buckets::PerPeer { peers: DashMap::new(), paced: Arc::new(AtomicUsize::new(0)) };
        PacedSocket { inner, buckets }
    }

    /// Paces datagrams to `peer` with `pace` until the returned guard is dropped (a per-peer
    /// socket; on a client's socket this does nothing).
    pub fn pace_peer(self: &Arc<Self>, peer: SocketAddr, pace: Pace) -> PeerPace {
        if let Buckets::PerPeer { peers, paced } = &self.buckets {
            {
                let mut b = pace.lock();
                b.paced = Some(paced.clone());
                if b.rate.is_some() {
                    b.count_paced(true);
                }
            }
            if let Some(old) = peers.insert(peer, pace.clone()) {
                retire(&old);
            }
        }
        PeerPace { socket: self.clone(), peer, pace }
    }

    /// The bucket a datagram to `destination` spends; `binding` is the sending poller's (none:
    /// the endpoint's own datagram, not paced on a per-peer socket).
    fn bucket_for(&self, destination: SocketAddr, binding: Option<&Binding>) -> Option<Pace> {
        match &self.buckets {
            Buckets::One(pace) => Some(pace.clone()),
            Buckets::PerPeer { peers, .. } => {
                let binding = binding?;
                let mut bound = binding.lock().unwrap_or_else(|e| e.into_inner());
                match &*bound {
                    Some((addr, pace)) if *addr == destination => pace.clone(),
                    _ => {
                        let pace = peers.get(&destination).map(|p| p.clone());
                        *bound = Some((destination, pace.clone()));
                        pace
                    }
                }
            }
        }
    }
}

/// Takes a bucket out of its socket's count of paced peers.
fn retire(pace: &Pace) {
    let mut b = pace.lock();
    if b.rate.is_some() {
        b.count_paced(false);
    }
    b.paced = None;
}

/// Paces one peer of a per-peer socket while it lives.
#[derive(Debug)]
pub struct PeerPace {
    socket: Arc<PacedSocket>,
    peer: SocketAddr,
    pace: Pace,
}

impl PeerPace {
    /// The peer's bucket.
    pub fn pace(&self) -> &Pace {
        &self.pace
    }
}

impl Drop for PeerPace {
    fn drop(&mut self) {
        if let Buckets::PerPeer { peers, .. } = &self.socket.buckets {
            // A later connection from the same address may have replaced this one's bucket.
            if peers.remove_if(&self.peer, |_, p| p.same(&self.pace)).is_some() {
                retire(&self.pace);
            }
        }
    }
}

impl AsyncUdpSocket for PacedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        let inner = self.inner.clone().create_io_poller();
        let bound = match &self.buckets {
            Buckets::One(pace) => Some((SocketAddr::from(([0, 0, 0, 0], 0)), Some(pace.clone()))),
            Buckets::PerPeer { .. } => None,
        };
        Box::pin(PacedPoller {
            socket: self,
            inner,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            binding: Arc::new(Mutex::new(bound)),
        })
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let binding = READY.with(|r| r.borrow_mut().take());
        let Some(pace) = self.bucket_for(transmit.destination, binding.as_deref()) else {
            return self.inner.try_send(transmit);
        };
        let mut b = pace.lock();
        if b.ready_at(Instant::now()).is_some() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.inner.try_send(transmit)?;
        if b.rate.is_some() {
            let segments = transmit.segment_size.map_or(1, |s| transmit.contents.len().div_ceil(s.max(1)));
            b.tokens -= segments as f64;
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// One datagram per send while pacing (each spends a token), else segmentation offload.
    fn max_transmit_segments(&self) -> usize {
        let paced = match &self.buckets {
            Buckets::One(pace) => pace.rate().is_some(),
            Buckets::PerPeer { paced, .. } => paced.load(Ordering::Acquire) > 0,
        };
        if paced {
            1
        } else {
            self.inner.max_transmit_segments()
        }
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

/// One connection's poller: writable when its bucket has a token and the socket is writable.
struct PacedPoller {
    socket: Arc<PacedSocket>,
    inner: Pin<Box<dyn UdpPoller>>,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// The peer and bucket this connection's datagrams go to (learned from the first one, on a
    /// per-peer socket).
    binding: Arc<Binding>,
}

impl fmt::Debug for PacedPoller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedPoller").finish_non_exhaustive()
    }
}

impl UdpPoller for PacedPoller {
    fn poll_writable(mut self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        let pace =
            self.binding.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|(_, p)| p.clone());
        if let Some(pace) = pace {
            loop {
                let Some(at) = pace.lock().ready_at(Instant::now()) else { break };
                self.timer.as_mut().reset(at.into());
                if self.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
        }
        let ready = self.inner.as_mut().poll_writable(cx);
        if matches!(ready, Poll::Ready(Ok(()))) && matches!(self.socket.buckets, Buckets::PerPeer { .. }) {
            let binding = self.binding.clone();
            READY.with(|r| *r.borrow_mut() = Some(binding));
        }
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_spaces_packets_at_its_rate_after_a_burst_of_two() {
        let pace = Pace::new(Some(10.0));
        let now = Instant::now();
        let mut b = pace.lock();
        b.last = now;
        assert_eq!(b.ready_at(now), None);
        b.tokens -= 2.0;
        let at = b.ready_at(now).expect("no token left");
        assert!((at - now).as_secs_f64() > 0.09 && (at - now).as_secs_f64() <= 0.1);
        assert_eq!(b.ready_at(now + Duration::from_millis(100)), None);
    }

    fn per_peer() -> Arc<PacedSocket> {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let runtime = quinn::TokioRuntime;
        let inner = quinn::Runtime::wrap_udp_socket(&runtime, udp).unwrap();
        Arc::new(PacedSocket::per_peer(inner))
    }

    #[tokio::test]
    async fn a_server_socket_paces_each_peer_by_its_own_bucket_and_stops_when_it_goes() {
        let socket = per_peer();
        let (a, b): (SocketAddr, SocketAddr) =
            ("127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap());
        let guard = socket.pace_peer(a, Pace::new(None));
        assert!(socket.max_transmit_segments() >= 1);
        let binding: Binding = Mutex::new(None);
        // A connection to `a`: bound to a's bucket by its first datagram; the endpoint's own
        // datagrams (no binding) and other peers are not paced.
        assert!(socket.bucket_for(a, Some(&binding)).unwrap().same(guard.pace()));
        assert!(socket.bucket_for(a, None).is_none());
        assert!(socket.bucket_for(b, Some(&Mutex::new(None))).is_none());
        // Once a's bucket has a rate, every datagram goes alone.
        guard.pace().set_rate(Some(30.0));
        assert_eq!(socket.max_transmit_segments(), 1);
        // A new connection from the same address replaces the bucket; the old guard leaves it.
        let newer = socket.pace_peer(a, Pace::new(None));
        assert_eq!(socket.max_transmit_segments(), socket.inner.max_transmit_segments());
        drop(guard);
        assert!(socket.bucket_for(a, Some(&Mutex::new(None))).unwrap().same(newer.pace()));
        drop(newer);
        assert!(socket.bucket_for(a, Some(&Mutex::new(None))).is_none());
    }
}
