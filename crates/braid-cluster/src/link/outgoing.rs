//! The sending side of a link: dials the peer, proves the secret, and sends what the router
//! hands the link, many messages per frame, keeping those that wait for an acknowledgement
//! until the peer's cumulative count covers them. When the link fails, those go to the peer's
//! Redis inbox, and so does whatever comes while it is down; each QoS 1/2 message's
//! confirmation then waits for that write (see [`super::Link::send_confirmed`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_client::Backoff;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::endpoint::{exported, Endpoint};
use super::handshake::{self, Hello, Role};
use super::{framed, FrameSink, Frames, Link, Outgoing, FRAME_BYTES};
use crate::wire::{take_n, Pack};
use crate::Shared;

/// Longest wait between two tries to dial a peer.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Drives `link` until the broker shuts down.
pub(crate) async fn run(
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    endpoint: Arc<Endpoint>,
    link: Arc<Link>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), MAX_BACKOFF);
    let mut failing: Option<String> = None;
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
                // Sent and not acknowledged yet, by their count on the link.
                let mut waiting = VecDeque::new();
                let why = forward(&shared, &shutdown, &link, halves, &mut rx, &mut waiting).await;
                link.up.store(false, Ordering::Relaxed);
                for (_, item) in waiting {
                    through_redis(&shared, &link, item);
                }
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
                item = rx.recv() => match item {
                    Some(item) => through_redis(&shared, &link, item),
                    None => return,
                },
                _ = shutdown.cancelled() => break,
            }
        }
    }
    // Shutting down: what is left goes through Redis (the store writes it out before the node
    // leaves).
    rx.close();
    while let Some(item) = rx.recv().await {
        through_redis(&shared, &link, item);
    }
}

/// A message the link cannot carry goes to the peer's inbox; its confirmation, if any, waits
/// for that write.
fn through_redis(shared: &Shared, link: &Link, item: Outgoing) {
    link.fell_back.fetch_add(1, Ordering::Relaxed);
    let ticket = shared.store.forward(&link.node, &shared.incarnation, &item.fwd, false);
    if let Some(ack) = item.ack {
        let _ = ack.send(ticket);
    }
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

/// Sends what comes over the link until it fails, and returns why; `waiting` holds what was
/// sent and not acknowledged, by its count on the link.
async fn forward(
    shared: &Shared,
    shutdown: &CancellationToken,
    link: &Link,
    (mut acks, mut out): (Frames, FrameSink),
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    waiting: &mut VecDeque<(u64, Outgoing)>,
) -> String {
    let mut sent = 0u64;
    // When the peer last sent its count (at least every 200 ms): a peer that sends no count
    // for the link timeout while messages wait is gone. (One that no longer acknowledges what
    // this node sends at the TCP level is noticed by the kernel, see [`Endpoint`].)
    let mut heard = Instant::now();
    let timeout = Duration::from_millis(shared.config.link_timeout_ms);
    let mut watchdog = tokio::time::interval(timeout / 4);
    loop {
        tokio::select! {
            biased;
            ack = acks.next() => match ack {
                Some(Ok(frame)) => {
                    let Ok(upto) = take_n::<8>(&mut &frame[..]).map(u64::from_le_bytes) else {
                        return "the peer sent a malformed acknowledgement".into();
                    };
                    heard = Instant::now();
                    while waiting.front().is_some_and(|(n, _)| *n <= upto) {
                        if let Some((_, Outgoing { ack: Some(ack), .. })) = waiting.pop_front() {
                            let _ = ack.send(0);
                        }
                    }
                }
                Some(Err(e)) => return e.to_string(),
                None => return "closed by the peer".into(),
            },
            item = rx.recv() => {
                let Some(first) = item else { return "shutting down".into() };
                let size = |i: &Outgoing| i.fwd.msg.payload.len() + i.fwd.msg.topic.len();
                let mut bytes = size(&first);
                let mut items = vec![first];
                while bytes < FRAME_BYTES {
                    let Ok(item) = rx.try_recv() else { break };
                    bytes += size(&item);
                    items.push(item);
                }
                if let Some(after) = items.iter().map(|i| i.after).max().filter(|a| *a > 0) {
                    shared.store.wait_durable(after).await;
                }
                let mut pack = Pack::default();
                link.sent.fetch_add(items.len() as u64, Ordering::Relaxed);
                for item in items {
                    pack.push_forward(&shared.incarnation, &item.fwd, shared.store.clock());
                    sent += 1;
                    if item.ack.is_some() {
                        waiting.push_back((sent, item));
                    }
                }
                if let Err(e) = out.send(Bytes::from(pack.into_bytes())).await {
                    return e.to_string();
                }
            }
            _ = watchdog.tick() => {
                if !waiting.is_empty() && heard.elapsed() > timeout {
                    return format!("no word from the peer in {} ms", timeout.as_millis());
                }
            }
            _ = shutdown.cancelled() => {
                // A clean end (TLS close_notify): the peer does not take it for a lost link.
                let _ = SinkExt::<Bytes>::close(&mut out).await;
                return "shutting down".into();
            }
        }
    }
}
