//! The receiving side of links: accepts peers that prove the cluster's secret, routes what
//! they send as the inbox reader routes what it reads, and acknowledges each message once what
//! it queued is durable. A peer that cannot authenticate is told why and closed; one that sends
//! a frame that does not read loses that link only; both are logged.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use tracing::{debug, info, warn};

use braid_broker::broker::Broker;
use braid_broker::message::RemoteId;
use braid_broker::store::{Store, Ticket};

use super::endpoint::exported;
use super::handshake::{self, Hello, Role};
use super::{framed, FrameSink, Frames, Links};
use crate::inbox::{route_now, Backlog, Source};
use crate::{wire, Shared};

/// How often a receiver tells its peer how far it got, even with nothing new: the peer's sign
/// that the link lives while messages wait (a slow subscriber holds them, say).
const HEARTBEAT: Duration = Duration::from_millis(200);

/// Accepts peers' links until the broker shuts down.
pub(crate) async fn accept(shared: Arc<Shared>, broker: Arc<Broker>, links: Arc<Links>) {
    loop {
        let accepted = tokio::select! {
            a = links.endpoint.accept() => a,
            _ = broker.shutdown().cancelled() => break,
        };
        let (stream, from) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, say: the next try may succeed.
                warn!("cluster: accepting a link: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (shared, broker, links) = (shared.clone(), broker.clone(), links.clone());
        tokio::spawn(async move {
            match serve(&shared, &broker, &links, stream).await {
                Ok(peer) => debug!(%peer, %from, "cluster: link from the node ended"),
                Err(e) => warn!(%from, "cluster: link refused or closed: {e}"),
            }
        });
    }
}

/// Serves one peer's link; returns its name once it ends, or why it was refused or closed.
async fn serve(
    shared: &Arc<Shared>,
    broker: &Arc<Broker>,
    links: &Links,
    stream: tokio::net::TcpStream,
) -> Result<String, String> {
    let timeout = Duration::from_millis(shared.config.link_timeout_ms);
    let (frames, acks, hello) = tokio::time::timeout(timeout, authenticate(shared, links, stream))
        .await
        .map_err(|_| format!("no hello in {} ms", timeout.as_millis()))??;
    let peer = hello.node;
    info!(%peer, "cluster: link from the node");
    let (routed, acked) = mpsc::unbounded_channel();
    let acker = tokio::spawn(acknowledge(shared.clone(), acks, acked));
    let result = receive(shared, broker, frames, routed).await.map_err(|e| format!("{peer}: {e}"));
    acker.abort();
    result.map(|()| peer)
}

/// Makes the TLS handshake, takes the peer's hello and answers with this node's; refuses the
/// link (and says why, then closes it) if the hello does not read or its proof is wrong.
async fn authenticate(
    shared: &Shared,
    links: &Links,
    stream: tokio::net::TcpStream,
) -> Result<(Frames, FrameSink, Hello), String> {
    let stream = links.endpoint.accept_tls(stream).await.map_err(|e| format!("TLS: {e}"))?;
    let keys = exported(&stream, handshake::EXPORT_LABEL)?;
    let (mut frames, mut out) = framed(stream);
    let hello = match frames.next().await {
        Some(Ok(frame)) => Hello::decode(&frame).map_err(|e| e.to_string()),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("closed before its hello".into()),
    };
    let hello = match hello {
        Ok(h) => h,
        Err(e) => {
            let _ = out.send(Bytes::from(handshake::refusal("malformed hello"))).await;
            return Err(format!("a malformed hello: {e}"));
        }
    };
    let secret = &shared.config.secret;
    if !handshake::verify(secret, Role::Dialer, &keys, &hello.node, &shared.me, &hello.proof) {
        let _ = out.send(Bytes::from(handshake::refusal("wrong secret"))).await;
        return Err(format!(
            "a peer saying it is node {:?} did not prove cluster.secret: refused (the nodes' secrets differ, or it is not a node of this cluster)",
            hello.node
        ));
    }
    let proof = handshake::proof(secret, Role::Listener, &keys, &hello.node, &shared.me);
    let answer = Hello { node: shared.me.clone(), incarnation: shared.incarnation.clone(), proof };
    out.send(Bytes::from(answer.encode())).await.map_err(|e| e.to_string())?;
    Ok((frames, out, hello))
}

/// Routed messages, by their count on the link: acknowledged once `ticket` is durable.
struct Routed {
    upto: u64,
    ticket: Ticket,
    ids: Vec<RemoteId>,
}

/// Reads the link's frames and routes their messages; a frame that does not read ends the
/// link.
async fn receive(
    shared: &Arc<Shared>,
    broker: &Broker,
    mut frames: Frames,
    acks: mpsc::UnboundedSender<Routed>,
) -> Result<(), String> {
    let slow_consumer = Duration::from_secs(broker.live().session.slow_consumer_timeout_secs);
    let mut count = 0u64;
    loop {
        let frame = tokio::select! {
            f = frames.next() => f,
            _ = broker.shutdown().cancelled() => return Ok(()),
        };
        let frame = match frame {
            Some(Ok(frame)) => frame,
            // The codec's own error: a length beyond the largest frame.
            Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(format!("a malformed frame: {e}"));
            }
            Some(Err(e)) => return Err(format!("connection lost: {e}")),
            None => return Ok(()),
        };
        let messages = match wire::unpack(frame, shared.store.clock()) {
            Ok(m) => m,
            Err(e) => return Err(format!("a frame that does not read: {e}")),
        };
        count += messages.len() as u64;
        let mut backlog = Backlog { messages, ..Backlog::default() };
        let (ticket, mut held) = route_now(shared, broker, &mut backlog, Source::Own, false);
        let _ = acks.send(Routed { upto: count, ticket, ids: backlog.routed });
        // Sessions over their limits hold the link as they hold a local publisher: what the
        // peer sends waits in the connection meanwhile (TCP's flow control tells it).
        let since = Instant::now();
        for holder in held.drain(..) {
            holder.released(since, slow_consumer).await;
        }
    }
}

/// Acknowledges routed messages as what they queued becomes durable, in order, and at least
/// every [`HEARTBEAT`].
async fn acknowledge(shared: Arc<Shared>, mut out: FrameSink, mut routed: mpsc::UnboundedReceiver<Routed>) {
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
