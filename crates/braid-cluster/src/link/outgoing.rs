//! The sending side of a link: dials the peer, proves the secret, and sends what the router
//! hands the link, many messages per frame, keeping those that wait for an acknowledgement
//! until the peer's cumulative count covers them. When the link fails, those go to the peer's
//! Redis inbox, and so does whatever comes while it is down; each QoS 1/2 message's
//! confirmation then waits for that write (see [`super::Link::send_confirmed`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::handshake::{self, Hello, Role};
use super::{codec, Link, Outgoing, FRAME_BYTES};
use crate::wire::{take_n, Pack};
use crate::Shared;

/// Longest wait between two tries to dial a peer.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Drives `link` until the broker shuts down.
pub(crate) async fn run(
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    endpoint: quinn::Endpoint,
    link: Arc<Link>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut failing: Option<String> = None;
    loop {
        if shutdown.is_cancelled() {
            break;
        }
        match dial(&shared, &endpoint, &link).await {
            Ok((conn, control)) => {
                backoff = Duration::from_millis(50);
                failing = None;
                link.up.store(true, Ordering::Relaxed);
                link.connects.fetch_add(1, Ordering::Relaxed);
                info!(peer = %link.node, "cluster: link up");
                let (why, waiting) = forward(&shared, &shutdown, &link, &conn, control, &mut rx).await;
                link.up.store(false, Ordering::Relaxed);
                conn.close(0u32.into(), why.as_bytes());
                for item in waiting {
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
                // A node that is gone is tried less often (its routes go once it is taken over).
                if !shared.live.lock().contains(&link.node) {
                    backoff = MAX_BACKOFF;
                }
            }
        }
        // Down: what comes meanwhile goes through Redis.
        let wait = tokio::time::sleep(backoff);
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
        backoff = (backoff * 2).min(MAX_BACKOFF);
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
    let ticket = shared.store.forward_record(&link.node, item.record.to_vec());
    if let Some(ack) = item.ack {
        let _ = ack.send(ticket);
    }
}

/// The peer's control stream after the handshake.
type Control = (quinn::SendStream, FramedRead<quinn::RecvStream, tokio_util::codec::LengthDelimitedCodec>);

/// Connects to the peer at the address it advertises in Redis and authenticates both ways.
async fn dial(
    shared: &Arc<Shared>,
    endpoint: &quinn::Endpoint,
    link: &Link,
) -> Result<(quinn::Connection, Control), String> {
    let address = crate::membership::link_address(shared, &link.node)
        .await
        .map_err(|e| format!("reading its address in Redis: {e}"))?
        .ok_or("it advertises no link address")?;
    let addr = tokio::net::lookup_host(&address)
        .await
        .map_err(|e| format!("{address}: {e}"))?
        .next()
        .ok_or_else(|| format!("{address}: no address"))?;
    let timeout = Duration::from_millis(shared.config.link_timeout_ms);
    let connecting = endpoint.connect(addr, &link.node).map_err(|e| format!("{address}: {e}"))?;
    let conn = tokio::time::timeout(timeout, connecting)
        .await
        .map_err(|_| format!("{address}: no answer in {} ms", timeout.as_millis()))?
        .map_err(|e| format!("{address}: {e}"))?;
    let handshake = async {
        let (send, recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        let _ = send.set_priority(i32::MAX);
        let keys = handshake::exported(&conn)?;
        let mut send = FramedWrite::new(send, codec());
        let mut recv = FramedRead::new(recv, codec());
        let secret = &shared.config.secret;
        let proof = handshake::proof(secret, Role::Dialer, &keys, &shared.me, &link.node);
        let hello = Hello { node: shared.me.clone(), incarnation: shared.incarnation.clone(), proof };
        send.send(Bytes::from(hello.encode())).await.map_err(|e| e.to_string())?;
        let answer = match recv.next().await {
            Some(Ok(frame)) => Hello::decode(&frame)?,
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err(refusal(&conn)),
        };
        if answer.node != link.node {
            return Err(format!("{address} is node {:?} now", answer.node));
        }
        if !handshake::verify(secret, Role::Listener, &keys, &shared.me, &link.node, &answer.proof) {
            conn.close(handshake::REFUSED.into(), b"wrong secret");
            return Err("its proof of cluster.secret is wrong: the nodes' secrets differ".into());
        }
        Ok((send.into_inner(), recv))
    };
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(control)) => Ok((conn, control)),
        Ok(Err(e)) => Err(format!("{address}: {e}")),
        Err(_) => Err(format!("{address}: no answer to the hello in {} ms", timeout.as_millis())),
    }
}

/// Why the peer closed the connection during the handshake.
fn refusal(conn: &quinn::Connection) -> String {
    match conn.close_reason() {
        Some(quinn::ConnectionError::ApplicationClosed(c)) if c.error_code == handshake::REFUSED.into() => {
            "refused: the nodes' cluster.secret differ".into()
        }
        Some(e) => e.to_string(),
        None => "closed during the handshake".into(),
    }
}

/// Sends what comes over `conn` until the link fails; returns why, and the messages that were
/// waiting for an acknowledgement then.
async fn forward(
    shared: &Shared,
    shutdown: &CancellationToken,
    link: &Link,
    conn: &quinn::Connection,
    control: Control,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
) -> (String, Vec<Outgoing>) {
    let mut waiting: VecDeque<(u64, Outgoing)> = VecDeque::new();
    let why = send_frames(shared, shutdown, link, conn, control, rx, &mut waiting).await;
    (why, waiting.into_iter().map(|(_, item)| item).collect())
}

/// The body of [`forward`]: `waiting` holds what was sent and not acknowledged, by its count on
/// the link.
async fn send_frames(
    shared: &Shared,
    shutdown: &CancellationToken,
    link: &Link,
    conn: &quinn::Connection,
    (control, mut acks): Control,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    waiting: &mut VecDeque<(u64, Outgoing)>,
) -> String {
    let bulk = match conn.open_uni().await {
        Ok(s) => s,
        Err(e) => return e.to_string(),
    };
    let _ = bulk.set_priority(0);
    let mut bulk = FramedWrite::new(bulk, codec());
    let mut sent = 0u64;
    // When the peer last sent a count, and when its QUIC stack last acknowledged a packet of
    // ours: a count that keeps coming says only that the way back works (a one-way cut, or a
    // peer that does not get what this node sends, leaves the second still).
    let (mut heard, mut heard_back, mut transport_acks) = (Instant::now(), Instant::now(), 0);
    let timeout = Duration::from_millis(shared.config.link_timeout_ms);
    let mut watchdog = tokio::time::interval(timeout / 4);
    let _control = control;
    loop {
        tokio::select! {
            biased;
            ack = acks.next() => match ack {
                Some(Ok(frame)) => {
                    let Ok(upto) = take_n::<8>(&mut &frame[..]).map(u64::from_le_bytes) else {
                        conn.close(handshake::MALFORMED.into(), b"bad acknowledgement");
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
                None => return conn.close_reason().map_or("closed by the peer".into(), |e| e.to_string()),
            },
            item = rx.recv() => {
                let Some(first) = item else { return "shutting down".into() };
                let mut items = vec![first];
                let mut bytes = items[0].record.len();
                while bytes < FRAME_BYTES {
                    let Ok(item) = rx.try_recv() else { break };
                    bytes += item.record.len();
                    items.push(item);
                }
                if let Some(after) = items.iter().map(|i| i.after).max().filter(|a| *a > 0) {
                    shared.store.wait_durable(after).await;
                }
                let mut pack = Pack::default();
                link.sent.fetch_add(items.len() as u64, Ordering::Relaxed);
                for item in items {
                    pack.push(&item.record);
                    sent += 1;
                    if item.ack.is_some() {
                        waiting.push_back((sent, item));
                    }
                }
                if let Err(e) = bulk.send(Bytes::from(pack.into_bytes())).await {
                    return e.to_string();
                }
            }
            _ = watchdog.tick() => {
                let acks = conn.stats().frame_rx.acks;
                if acks != transport_acks {
                    (transport_acks, heard_back) = (acks, Instant::now());
                }
                if !waiting.is_empty() && heard.elapsed() > timeout {
                    return format!("no word from the peer in {} ms", timeout.as_millis());
                }
                if !waiting.is_empty() && heard_back.elapsed() > timeout {
                    return format!("the peer has received nothing from this node in {} ms", timeout.as_millis());
                }
            }
            _ = shutdown.cancelled() => return "shutting down".into(),
        }
    }
}
