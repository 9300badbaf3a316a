//! Taking over a node that is gone: its lease lapsed (killed, cut off, or stopped). One live
//! node, chosen by a lock in Redis, claims each session the gone node held (still held by it:
//! a client that reconnected elsewhere took its own), adopts them, and drains the gone node's
//! inbox into them: what was acknowledged to publishers and sent there is delivered. Then it
//! clears the gone node's routes, so nothing more is sent there, and keeps draining for a
//! grace period while the other nodes catch up with that change.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::redis::Conn;
use redis::Value;
use tracing::{info, warn};

use braid_broker::broker::Broker;
use braid_broker::session::IN_PROCESS;

use crate::inbox::{self, create_group, read_group, Source, Taken, GROUP};
use crate::membership::{self, GRACE};
use crate::redis::bytes;
use crate::routes;
use crate::scripts;
use crate::sessions;
use crate::streams::{entries_of, stream_entries};
use crate::Shared;

/// Looks for gone nodes every half lease and takes over those no other node is taking over
/// (sessions whose clients have not come back elsewhere).
pub(crate) async fn run(shared: Arc<Shared>, broker: Arc<Broker>) {
    let mut tick = tokio::time::interval(Duration::from_millis(shared.config.lease_ms / 2));
    let mut conn = shared.conn.clone();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = broker.shutdown().cancelled() => return,
        }
        if !shared.serving() {
            continue;
        }
        let Ok(known) =
            redis::cmd("HKEYS").arg(shared.keys.nodes()).query_async::<Vec<String>>(&mut conn).await
        else {
            continue;
        };
        for node in known.into_iter().filter(|n| *n != shared.me) {
            if !membership::alive(&shared, &mut conn, &node).await {
                if let Err(e) = take_over(&shared, &broker, &node).await {
                    warn!(%node, "cluster: taking over a gone node failed ({e}); retried later");
                }
            }
        }
    }
}

/// Takes over `node`, whose lease has lapsed, unless another node is doing so: returns
/// whether this node did. The gone node's inbox is drained into the sessions before this
/// returns; the grace-period draining goes on in a task of its own.
pub(crate) async fn take_over(
    shared: &Arc<Shared>,
    broker: &Arc<Broker>,
    node: &str,
) -> redis::RedisResult<bool> {
    let mut conn = shared.conn.clone();
    let lock: Value = redis::cmd("SET")
        .arg(shared.keys.reaping(node))
        .arg(&shared.me)
        .arg("NX")
        .arg("PX")
        .arg(shared.config.lease_ms * 3 + GRACE.as_millis() as u64)
        .query_async(&mut conn)
        .await?;
    if !matches!(lock, Value::Okay) && bytes(&lock) != Some(b"OK") {
        return Ok(false);
    }
    shared.reaping.send_modify(|n| *n += 1);
    shared.gone.lock().insert(node.to_string());
    let reaped = reap(shared, broker, node).await;
    shared.reaping.send_modify(|n| *n -= 1);
    match reaped {
        Ok(taken) => {
            tokio::spawn(finish(shared.clone(), broker.clone(), node.to_string(), Instant::now(), taken));
            Ok(true)
        }
        Err(e) => {
            let _: redis::RedisResult<()> =
                redis::cmd("DEL").arg(shared.keys.reaping(node)).query_async(&mut conn).await;
            Err(e)
        }
    }
}

async fn reap(shared: &Arc<Shared>, broker: &Arc<Broker>, node: &str) -> redis::RedisResult<Arc<Taken>> {
    let started = Instant::now();
    let mut conn = shared.conn.clone();
    let owned: Vec<String> =
        redis::cmd("SMEMBERS").arg(shared.keys.owned(node)).query_async(&mut conn).await?;
    let mut taken = Taken::default();
    // An in-process client's session (a bridge's outbox) is its node's own: it waits in Redis
    // for that node to come back instead of being taken in, where its filters would take
    // this node's messages too.
    for client_id in owned.iter().filter(|c| !c.starts_with(IN_PROCESS)) {
        let keys = shared.keys.session(client_id);
        let epoch: i64 = redis::cmd("EVAL")
            .arg(scripts::CLAIM_FROM)
            .arg(1)
            .arg(&keys.meta)
            .arg(node)
            .arg(&shared.me)
            .query_async(&mut conn)
            .await?;
        if epoch > 0 {
            shared.store.set_epoch(client_id, epoch as u64);
            let id = match broker.cluster().session_id(client_id) {
                Some(id) => Some(id),
                None => sessions::adopt(shared, broker, client_id, false).await.map_err(|e| {
                    redis::RedisError::from((redis::ErrorKind::Client, "adopting a session", e.to_string()))
                })?,
            };
            if let Some(id) = id {
                let _: () = redis::cmd("SADD")
                    .arg(shared.keys.owned(&shared.me))
                    .arg(client_id)
                    .query_async(&mut conn)
                    .await?;
                taken.sessions.insert(id);
            }
        }
        let _: () =
            redis::cmd("SREM").arg(shared.keys.owned(node)).arg(client_id).query_async(&mut conn).await?;
    }
    let taken = Arc::new(taken);
    let inbox = shared.keys.inbox(node);
    let _ = create_group(&mut conn, &inbox).await;
    let drained = drain(shared, broker, &mut conn, &inbox, node, &taken).await?;
    // Nothing more is routed there once every node has applied this; the adopted sessions'
    // routes are in the log before it. Not if the node is back meanwhile: they are its own.
    routes::flushed(shared, broker).await;
    if membership::alive(shared, &mut conn, node).await {
        info!(%node, "cluster: a node being taken over is back; its routes stay");
        shared.gone.lock().remove(node);
        return Ok(taken);
    }
    let mut forget_routes = redis::cmd("DEL");
    forget_routes.arg(shared.keys.routes(node));
    let mut logged = redis::cmd("XADD");
    logged.arg(shared.keys.route_log()).arg("*").arg("n").arg(node).arg("o").arg("reset").arg("f").arg("");
    conn.run_all(&[forget_routes, logged]).await?;
    let sessions = taken.sessions.len();
    info!(%node, sessions, messages = drained, ms = started.elapsed().as_millis() as u64, "cluster: took over a gone node");
    Ok(taken)
}

/// Drains the gone node's inbox for a grace period after its routes were cleared (nodes that
/// had not applied that yet may still send there), then forgets the node.
async fn finish(shared: Arc<Shared>, broker: Arc<Broker>, node: String, since: Instant, taken: Arc<Taken>) {
    let mut conn = shared.conn.clone();
    let inbox = shared.keys.inbox(&node);
    let mut late = 0;
    while since.elapsed() < GRACE {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if membership::alive(&shared, &mut conn, &node).await {
            // Back: what arrives in its inbox now is for its own new sessions.
            break;
        }
        match drain(&shared, &broker, &mut conn, &inbox, &node, &taken).await {
            Ok(n) => late += n,
            Err(e) => warn!(%node, "cluster: draining a gone node's inbox: {e}"),
        }
    }
    // The gone node, back meanwhile, keeps its own inbox.
    if !membership::alive(&shared, &mut conn, &node).await {
        let mut unlisted = redis::cmd("HDEL");
        unlisted.arg(shared.keys.nodes()).arg(&node);
        let mut gone = redis::cmd("DEL");
        gone.arg(&inbox);
        let _ = conn.run_all(&[unlisted, gone]).await;
    }
    let _: redis::RedisResult<()> =
        redis::cmd("DEL").arg(shared.keys.reaping(&node)).query_async(&mut conn).await;
    if late > 0 {
        info!(%node, messages = late, "cluster: messages sent to a gone node after its routes were cleared were delivered");
    }
}

/// Routes what waits in a gone node's inbox: the entries it had read but not acknowledged,
/// then the rest. Returns how many entries there were.
async fn drain(
    shared: &Arc<Shared>,
    broker: &Arc<Broker>,
    conn: &mut Conn,
    inbox: &str,
    node: &str,
    taken: &Taken,
) -> redis::RedisResult<usize> {
    let consumer = format!("{}:reaping:{node}", shared.me);
    let mut total = 0;
    let mut start = "0-0".to_string();
    loop {
        let v: Value = redis::cmd("XAUTOCLAIM")
            .arg(inbox)
            .arg(GROUP)
            .arg(&consumer)
            .arg(0)
            .arg(&start)
            .arg("COUNT")
            .arg(inbox::read_count(shared.config.batch))
            .query_async(conn)
            .await?;
        let Value::Array(mut parts) = v else { break };
        let next = parts.first().and_then(bytes).map(|b| String::from_utf8_lossy(b).into_owned());
        let entries = if parts.len() > 1 { entries_of(parts.swap_remove(1)) } else { Vec::new() };
        total += entries.len();
        route_entries(shared, broker, inbox, entries, taken).await;
        match next {
            Some(n) if n != "0-0" => start = n,
            _ => break,
        }
    }
    loop {
        let v = read_group(conn, inbox, &consumer, ">", inbox::read_count(shared.config.batch), None).await?;
        let entries = stream_entries(v);
        if entries.is_empty() {
            break;
        }
        total += entries.len();
        route_entries(shared, broker, inbox, entries, taken).await;
    }
    Ok(total)
}

/// Routes the messages of `entries` of the gone node's `inbox` into the sessions taken from it
/// and acknowledges them.
async fn route_entries(
    shared: &Shared,
    broker: &Broker,
    inbox: &str,
    entries: Vec<(String, Vec<Value>)>,
    taken: &Taken,
) {
    let mut backlog = inbox::Backlog::default();
    inbox::take_in(shared, entries, None, &mut backlog);
    // A gone node's inbox is drained at once, whoever it holds.
    let _ = inbox::route(shared, broker, &mut backlog, Source::Gone(taken), false).await;
    let mut routed = inbox::Routed::default();
    routed.take(&mut backlog);
    inbox::acknowledge(shared, inbox, &mut routed).await;
}
