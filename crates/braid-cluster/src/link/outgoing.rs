//! The sending side of a link: dials the peer, proves the secret, and sends what the router
//! hands the link, many messages per frame, keeping those that wait for an acknowledgement
//! until the peer's cumulative count covers them. When the link fails, those go to the peer's
//! Redis inbox, and so does whatever comes while it is down; their publishers then wait for
//! that write to be durable. Either way the link's [`super::Link::safe`] watermark rises over
//! each message once it is safe (see [`super::Link::send_confirmed`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_broker::store::{Store, Ticket};
use braid_client::Backoff;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::endpoint::{exported, Endpoint};
use super::handshake::{self, Hello, Role};
use super::{framed, FrameSink, Frames, Link, Outgoing, FRAME_BYTES};
use crate::wire::{put_forward, take_n};
use crate::Shared;

/// Longest wait between two tries to dial a peer.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The QoS 1/2 messages the link's task took and that are not safe yet.
#[derive(Default)]
struct Unsafe {
    /// Every message numbered below it was taken from the link's queue.
    taken: u64,
    /// Sent over the current connection, by their count on it: safe once the peer's count
    /// covers them (and, when the connection fails, those it could not send yet).
    sent: VecDeque<(u64, Outgoing)>,
    /// Written to the peer's Redis inbox: safe once their store ticket is durable.
    stored: VecDeque<(u64, Ticket)>,
}

impl Unsafe {
    /// Raises the link's watermark to the first message not safe yet (the store having made
    /// its writes up to `durable` durable).
    fn settle(&mut self, link: &Link, durable: &mut watch::Receiver<Ticket>) {
        let durable = *durable.borrow_and_update();
        while self.stored.front().is_some_and(|(_, ticket)| *ticket <= durable) {
            self.stored.pop_front();
        }
        let first = [self.sent.front().map(|(_, o)| o.n), self.stored.front().map(|(n, _)| *n)];
        link.safe.raise(first.into_iter().flatten().min().unwrap_or(self.taken));
    }

    /// Takes what the router handed the link into `items`.
    fn take(&mut self, link: &Link, items: &mut Vec<Outgoing>) {
        link.take(items);
        if let Some(last) = items.last() {
            self.taken = last.n + 1;
        }
    }

    /// Sends `item` to the peer's inbox; its publisher, if any, waits for that write.
    fn through_redis(&mut self, shared: &Shared, link: &Link, item: Outgoing) {
        link.fell_back.fetch_add(1, Ordering::Relaxed);
        let ticket = shared.store.forward(&link.node, &shared.incarnation, &item.fwd, false);
        if item.confirmed {
            self.stored.push_back((item.n, ticket));
        }
    }

    /// What the router handed the link goes to the peer's inbox.
    fn take_through_redis(&mut self, shared: &Shared, link: &Link, items: &mut Vec<Outgoing>) {
        self.take(link, items);
        for item in items.drain(..) {
            self.through_redis(shared, link, item);
        }
    }

    /// What the current connection sent and the peer did not acknowledge goes to its inbox.
    fn fall_back(&mut self, shared: &Shared, link: &Link) {
        for (_, item) in std::mem::take(&mut self.sent) {
            self.through_redis(shared, link, item);
        }
    }
}

/// Drives `link` until the broker shuts down.
pub(crate) async fn run(
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    endpoint: Arc<Endpoint>,
    link: Arc<Link>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), MAX_BACKOFF);
    let mut failing: Option<String> = None;
    let mut pending = Unsafe::default();
    let mut durable = shared.store.durable();
    let mut items = Vec::new();
    loop {
        if shutdown.is_cancelled() {
            break;
        }
        match dial(&shared, &endpoint, &link).await {
            Ok(halves) => {
                backoff.reset();
                failing = None;
                link.up.store(true, Ordering::Relaxed);
                link.connects.fetch_add(1, Ordering::Relaxed);
                info!(peer = %link.node, "cluster: link up");
                let why = forward(&shared, &shutdown, &link, halves, &mut pending, &mut durable).await;
                link.up.store(false, Ordering::Relaxed);
                pending.fall_back(&shared, &link);
                pending.settle(&link, &mut durable);
                if shutdown.is_cancelled() {
                    break;
                }
                warn!(peer = %link.node, "cluster: link down ({why}); messages go through its Redis inbox until it is back");
            }
            Err(e) => {
                if failing.as_deref() != Some(&e) {
                    warn!(peer = %link.node, "cluster: cannot link to the node ({e}); messages go through its Redis inbox meanwhile");
                    failing = Some(e);
                }
            }
        }
        // A node that is gone is tried less often (its routes go once it is taken over).
        let live = shared.live.lock().contains(&link.node);
        let pause = if live { backoff.pause() } else { MAX_BACKOFF };
        // Down: what comes meanwhile goes through Redis.
        let wait = tokio::time::sleep(pause);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => break,
                _ = link.ready.0.notified() => pending.take_through_redis(&shared, &link, &mut items),
                changed = durable.changed(), if !pending.stored.is_empty() => if changed.is_err() { break },
                _ = shutdown.cancelled() => break,
            }
            pending.settle(&link, &mut durable);
        }
    }
    // Shutting down: what is left goes through Redis (the store writes it out before the node
    // leaves), and nothing more is taken.
    link.queue.lock().closed = true;
    pending.take_through_redis(&shared, &link, &mut items);
    pending.settle(&link, &mut durable);
    while !pending.stored.is_empty() && durable.changed().await.is_ok() {
        pending.settle(&link, &mut durable);
    }
    link.safe.close();
}

/// Connects to the peer at the address it advertises in Redis and authenticates both ways.
async fn dial(shared: &Arc<Shared>, endpoint: &Endpoint, link: &Link) -> Result<(Frames, FrameSink), String> {
    let address = crate::membership::link_address(shared, &link.node)
        .await
        .map_err(|e| format!("reading its address in Redis: {e}"))?
        .ok_or("it advertises no link address")?;
    let timeout = Duration::from_millis(shared.config.link_timeout_ms);
    let handshake = async {
        let addr =
            tokio::net::lookup_host(&address).await.map_err(|e| e.to_string())?.next().ok_or("no address")?;
        let stream = endpoint.connect(addr, &link.node).await.map_err(|e| e.to_string())?;
        let keys = exported(&stream, handshake::EXPORT_LABEL)?;
        let (mut frames, mut out) = framed(stream);
        let secret = &shared.config.secret;
        let proof = handshake::proof(secret, Role::Dialer, &keys, &shared.me, &link.node);
        let hello = Hello { node: shared.me.clone(), incarnation: shared.incarnation.clone(), proof };
        out.send(Bytes::from(hello.encode())).await.map_err(|e| e.to_string())?;
        let answer = match frames.next().await {
            Some(Ok(frame)) => handshake::answer(&frame).map_err(|e| e.to_string())?,
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("closed during the handshake".into()),
        };
        if answer.node != link.node {
            return Err(format!("it is node {:?} now", answer.node));
        }
        if !handshake::verify(secret, Role::Listener, &keys, &shared.me, &link.node, &answer.proof) {
            return Err("its proof of cluster.secret is wrong: the nodes' secrets differ".into());
        }
        Ok((frames, out))
    };
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(halves)) => Ok(halves),
        Ok(Err(e)) => Err(format!("{address}: {e}")),
        Err(_) => Err(format!("{address}: no answer in {} ms", timeout.as_millis())),
    }
}

/// Sends what comes over the link until it fails, and returns why; `pending.sent` holds
/// what was sent and not acknowledged.
async fn forward(
    shared: &Shared,
    shutdown: &CancellationToken,
    link: &Link,
    (mut acks, mut out): (Frames, FrameSink),
    pending: &mut Unsafe,
    durable: &mut watch::Receiver<Ticket>,
) -> String {
    // Messages sent over this connection (QoS 0 included: the peer counts them all).
    let mut count = 0u64;
    // When the peer last sent its count (at least every 200 ms): a peer that sends no count
    // for the link timeout while messages wait is gone. (One that no longer acknowledges what
    // this node sends at the TCP level is noticed by the kernel, see [`Endpoint`].)
    let mut heard = Instant::now();
    let timeout = Duration::from_millis(shared.config.link_timeout_ms);
    let mut watchdog = tokio::time::interval(timeout / 4);
    let mut items = Vec::new();
    loop {
        tokio::select! {
            biased;
            ack = acks.next() => match ack {
                Some(Ok(frame)) => {
                    let Ok(upto) = take_n::<8>(&mut &frame[..]).map(u64::from_le_bytes) else {
                        return "the peer sent a malformed acknowledgement".into();
                    };
                    heard = Instant::now();
                    while pending.sent.front().is_some_and(|(c, _)| *c <= upto) {
                        pending.sent.pop_front();
                    }
                }
                Some(Err(e)) => return e.to_string(),
                None => return "closed by the peer".into(),
            },
            _ = link.ready.0.notified() => {
                pending.take(link, &mut items);
                if let Some(after) = items.iter().map(|i| i.after).max().filter(|a| *a > 0) {
                    shared.store.wait_durable(after).await;
                }
                link.sent.fetch_add(items.len() as u64, Ordering::Relaxed);
                // Frames of up to FRAME_BYTES, each a 4-byte length (as the codec frames
                // acknowledgements) and its records, encoded straight into the write buffer
                // and written out frame by frame.
                let mut left = items.drain(..).peekable();
                while left.peek().is_some() {
                    let buf = out.write_buffer_mut();
                    let at = buf.len();
                    buf.extend_from_slice(&[0; 4]);
                    for item in left.by_ref() {
                        put_forward(buf, &shared.incarnation, &item.fwd, shared.store.clock());
                        count += 1;
                        if item.confirmed {
                            pending.sent.push_back((count, item));
                        }
                        if buf.len() - at - 4 >= FRAME_BYTES {
                            break;
                        }
                    }
                    let len = (buf.len() - at - 4) as u32;
                    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
                    if let Err(e) = SinkExt::<Bytes>::flush(&mut out).await {
                        // What was not encoded yet falls back with what waits for the peer.
                        pending.sent.extend(left.map(|item| (u64::MAX, item)));
                        return e.to_string();
                    }
                }
            }
            changed = durable.changed(), if !pending.stored.is_empty() => if changed.is_err() {
                return "the store has stopped".into();
            },
            _ = watchdog.tick() => {
                if !pending.sent.is_empty() && heard.elapsed() > timeout {
                    return format!("no word from the peer in {} ms", timeout.as_millis());
                }
            }
            _ = shutdown.cancelled() => {
                // A clean end (TLS close_notify): the peer does not take it for a lost link.
                let _ = SinkExt::<Bytes>::close(&mut out).await;
                return "shutting down".into();
            }
        }
        pending.settle(link, durable);
    }
}
