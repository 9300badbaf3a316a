//! The receiving side of links: accepts peers that prove the cluster's secret, routes what
//! they send as the inbox reader routes what it reads, and acknowledges each message once what
//! it queued is durable. A peer that cannot authenticate, or sends a frame that does not read,
//! loses that link only: the connection is closed with a code that says why, and logged.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{debug, info, warn};

use braid_broker::broker::Broker;
use braid_broker::message::RemoteId;
use braid_broker::store::{Store, Ticket};

use super::handshake::{self, Hello, Role};
use super::{codec, Links};
use crate::inbox::{route_now, Backlog, Source};
use crate::{wire, Shared};

/// How often a receiver tells its peer how far it got, even with nothing new: the peer's sign
/// that the link lives while messages wait (a slow subscriber holds them, say).
const HEARTBEAT: Duration = Duration::from_millis(200);

/// Accepts peers' links until the broker shuts down.
pub(crate) async fn accept(shared: Arc<Shared>, broker: Arc<Broker>, links: Arc<Links>) {
    loop {
        let incoming = tokio::select! {
            i = links.endpoint.accept() => i,
            _ = broker.shutdown.cancelled() => break,
        };
        let Some(incoming) = incoming else { break };
        let (shared, broker) = (shared.clone(), broker.clone());
        tokio::spawn(async move {
            let from = incoming.remote_address();
            match serve(&shared, &broker, incoming).await {
                Ok(peer) => debug!(%peer, "cluster: link from the node ended"),
                Err(e) => warn!(%from, "cluster: link refused or closed: {e}"),
            }
        });
    }
    links.endpoint.close(0u32.into(), b"shutting down");
}

/// Serves one peer's link; returns its name once it ends, or why it was refused or closed.
async fn serve(
    shared: &Arc<Shared>,
    broker: &Arc<Broker>,
    incoming: quinn::Incoming,
) -> Result<String, String> {
    let timeout = Duration::from_millis(shared.config.link_timeout_ms);
    let from = incoming.remote_address();
    let (conn, control, hello) = tokio::time::timeout(timeout, authenticate(shared, incoming))
        .await
        .map_err(|_| format!("no hello from {from} in {} ms", timeout.as_millis()))??;
    let peer = hello.node;
    info!(%peer, %from, "cluster: link from the node");
    let bulk = conn.accept_uni().await.map_err(|e| format!("{peer}: {e}"))?;
    let (acks, acked) = mpsc::unbounded_channel();
    let acker = tokio::spawn(acknowledge(shared.clone(), control, acked));
    let result =
        receive(shared, broker, &conn, bulk, acks).await.map_err(|e| format!("{peer} ({from}): {e}"));
    acker.abort();
    result.map(|()| peer)
}

/// Takes the peer's hello and answers with this node's; closes the connection (refused) if
/// its proof is wrong.
async fn authenticate(
    shared: &Shared,
    incoming: quinn::Incoming,
) -> Result<(quinn::Connection, quinn::SendStream, Hello), String> {
    let conn = incoming.await.map_err(|e| e.to_string())?;
    let from = conn.remote_address();
    let (send, recv) = conn.accept_bi().await.map_err(|e| e.to_string())?;
    let _ = send.set_priority(i32::MAX);
    let mut recv = FramedRead::new(recv, codec());
    let hello = match recv.next().await {
        Some(Ok(frame)) => Hello::decode(&frame),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("closed before its hello".into()),
    };
    let hello = match hello {
        Ok(h) => h,
        Err(e) => {
            conn.close(handshake::MALFORMED.into(), b"malformed hello");
            return Err(format!("{from}: a malformed hello: {e}"));
        }
    };
    let keys = handshake::exported(&conn)?;
    let secret = &shared.config.secret;
    if !handshake::verify(secret, Role::Dialer, &keys, &hello.node, &shared.me, &hello.proof) {
        conn.close(handshake::REFUSED.into(), b"wrong secret");
        return Err(format!(
            "{from} (says it is node {:?}) did not prove cluster.secret: refused (the nodes' secrets differ, or it is not a node of this cluster)",
            hello.node
        ));
    }
    let proof = handshake::proof(secret, Role::Listener, &keys, &hello.node, &shared.me);
    let answer = Hello { node: shared.me.clone(), incarnation: shared.incarnation.clone(), proof };
    let mut send = FramedWrite::new(send, codec());
    send.send(Bytes::from(answer.encode())).await.map_err(|e| e.to_string())?;
    Ok((conn, send.into_inner(), hello))
}

/// Routed messages, by their count on the link: acknowledged once `ticket` is durable.
struct Routed {
    upto: u64,
    ticket: Ticket,
    ids: Vec<RemoteId>,
}

/// Reads the bulk stream and routes each frame's messages; a frame that does not read closes
/// the link.
async fn receive(
    shared: &Arc<Shared>,
    broker: &Broker,
    conn: &quinn::Connection,
    bulk: quinn::RecvStream,
    acks: mpsc::UnboundedSender<Routed>,
) -> Result<(), String> {
    let mut frames = FramedRead::new(bulk, codec());
    let slow_consumer = Duration::from_secs(broker.live().session.slow_consumer_timeout_secs);
    let mut count = 0u64;
    loop {
        let frame = tokio::select! {
            f = frames.next() => f,
            _ = broker.shutdown.cancelled() => return Ok(()),
        };
        let frame = match frame {
            Some(Ok(frame)) => frame,
            // The codec's own error: a length beyond the largest frame.
            Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                conn.close(handshake::MALFORMED.into(), b"malformed frame");
                return Err(format!("a malformed frame: {e}"));
            }
            Some(Err(e)) => return Err(format!("connection lost: {e}")),
            None => return Ok(()),
        };
        let messages = match wire::unpack(&frame) {
            Ok(m) => m,
            Err(e) => {
                conn.close(handshake::MALFORMED.into(), b"malformed frame");
                return Err(format!("a frame that does not read: {e}"));
            }
        };
        count += messages.len() as u64;
        let mut backlog = Backlog { messages, ..Backlog::default() };
        let (ticket, mut held) = route_now(shared, broker, &mut backlog, Source::Own, false);
        let _ = acks.send(Routed { upto: count, ticket, ids: backlog.routed });
        // Sessions over their limits hold the link as they hold a local publisher: what the
        // peer sends waits in its stream meanwhile (QUIC's flow control tells it).
        let since = Instant::now();
        for holder in held.drain(..) {
            holder.released(since, slow_consumer).await;
        }
    }
}

/// Acknowledges routed messages as what they queued becomes durable, in order, and at least
/// every [`HEARTBEAT`].
async fn acknowledge(
    shared: Arc<Shared>,
    control: quinn::SendStream,
    mut routed: mpsc::UnboundedReceiver<Routed>,
) {
    let mut out = FramedWrite::new(control, codec());
    let mut durable = shared.store.durable();
    let mut waiting: VecDeque<Routed> = VecDeque::new();
    let mut upto = 0u64;
    let mut beat = tokio::time::interval(HEARTBEAT);
    loop {
        let mut beat_now = false;
        tokio::select! {
            r = routed.recv() => match r {
                Some(r) => {
                    waiting.push_back(r);
                    while let Ok(r) = routed.try_recv() {
                        waiting.push_back(r);
                    }
                }
                None => return,
            },
            changed = durable.changed() => if changed.is_err() { return },
            _ = beat.tick() => beat_now = true,
        }
        let at = *durable.borrow_and_update();
        let mut ids = Vec::new();
        let before = upto;
        while waiting.front().is_some_and(|r| r.ticket <= at) {
            if let Some(mut r) = waiting.pop_front() {
                upto = r.upto;
                ids.append(&mut r.ids);
            }
        }
        if upto > before || beat_now {
            if out.send(Bytes::copy_from_slice(&upto.to_le_bytes())).await.is_err() {
                return;
            }
            shared.store.acknowledged(&ids);
        }
    }
}
