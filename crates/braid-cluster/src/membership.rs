//! Who is in the cluster: each node holds a lease key with a time to live, renewed a few
//! times per lease. A node whose lease lapsed is dead to the others. A node that cannot renew
//! its own for three quarters of the lease (before the lease lapses in Redis) stops serving (`cluster.on_partition = "refuse"`): its
//! clients are told to use another server (0x9C), so two nodes never serve one client id.

use std::time::{Duration, Instant};

use crate::redis::Conn;
use redis::Value;
use tracing::{info, warn};

use braid_broker::config::ClusterConfig;

use crate::keys::Keys;
use crate::redis::{bytes, int};
use crate::scripts;
use crate::{ClusterError, Shared};

/// How long the inbox of a gone node is still drained after its routes were cleared (nodes
/// that had not applied that yet may still send there).
pub(crate) const GRACE: Duration = Duration::from_secs(3);

/// Takes the lease of `config.node`, waiting up to one lease for a previous holder's to lapse.
pub(crate) async fn take_lease(
    conn: &mut Conn,
    keys: &Keys,
    config: &ClusterConfig,
    incarnation: &str,
) -> Result<(), ClusterError> {
    let deadline = Instant::now() + Duration::from_millis(config.lease_ms + 1000);
    let mut logged = false;
    loop {
        let taken: i64 = redis::cmd("EVAL")
            .arg(scripts::RENEW)
            .arg(1)
            .arg(keys.lease(&config.node))
            .arg(incarnation)
            .arg(config.lease_ms)
            .query_async(conn)
            .await?;
        if taken != 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(ClusterError::NameInUse(format!(
                "another running node is named {:?} (its lease in Redis is renewed): give each node a unique name",
                config.node
            )));
        }
        if !logged {
            warn!(node = %config.node, "a node of this name held a lease: waiting for it to lapse (a process that died)");
            logged = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What renewing the lease found.
pub(crate) enum Renewed {
    /// Held, and renewed.
    Held,
    /// It had lapsed: taken again now.
    Lapsed,
    /// Another process holds it.
    Taken,
}

/// Renews the lease and the node's entries in the node list, the links' addresses and the
/// Server References.
pub(crate) async fn renew(shared: &Shared, conn: &mut Conn) -> redis::RedisResult<Renewed> {
    let mut lease = redis::cmd("EVAL");
    lease
        .arg(scripts::RENEW)
        .arg(1)
        .arg(shared.keys.lease(&shared.me))
        .arg(&shared.incarnation)
        .arg(shared.config.lease_ms);
    let mut listed = redis::cmd("HSET");
    listed.arg(shared.keys.nodes()).arg(&shared.me).arg(&shared.incarnation);
    let mut cmds = vec![lease, listed];
    if let Some(links) = &shared.links {
        cmds.push(redis::cmd("HSET").arg(shared.keys.links()).arg(&shared.me).arg(&links.advertise).clone());
    }
    if let Some(reference) = shared.balance.reference() {
        cmds.push(redis::cmd("HSET").arg(shared.keys.servers()).arg(&shared.me).arg(reference).clone());
    }
    let replies = conn.run_all(&cmds).await?;
    Ok(match replies.first().and_then(int) {
        Some(1) => Renewed::Held,
        Some(2) => Renewed::Lapsed,
        _ => Renewed::Taken,
    })
}

/// The nodes whose lease is held, sorted.
pub(crate) async fn live_nodes(shared: &Shared, conn: &mut Conn) -> redis::RedisResult<Vec<String>> {
    live_in(&shared.keys, conn).await
}

/// [`live_nodes`] under `keys`, for a node that is not serving yet.
async fn live_in(keys: &Keys, conn: &mut Conn) -> redis::RedisResult<Vec<String>> {
    let names: Vec<String> = redis::cmd("HKEYS").arg(keys.nodes()).query_async(conn).await?;
    let exists: Vec<redis::Cmd> =
        names.iter().map(|n| redis::cmd("EXISTS").arg(keys.lease(n)).clone()).collect();
    let alive = if names.is_empty() { Vec::new() } else { conn.run_all(&exists).await? };
    let mut live: Vec<String> =
        names.into_iter().zip(alive).filter(|(_, v)| int(v) == Some(1)).map(|(n, _)| n).collect();
    live.sort();
    Ok(live)
}

/// The address `node`'s links listen on, if it advertises one.
pub(crate) async fn link_address(shared: &Shared, node: &str) -> redis::RedisResult<Option<String>> {
    redis::cmd("HGET").arg(shared.keys.links()).arg(node).query_async(&mut shared.conn.clone()).await
}

/// Refuses a `cluster.secret` that is not the live nodes' (their fingerprint in Redis differs);
/// else records this one's, for the nodes that start later.
pub(crate) async fn check_secret(
    conn: &mut Conn,
    keys: &Keys,
    config: &ClusterConfig,
) -> Result<(), ClusterError> {
    let mine = crate::link::handshake::fingerprint(&config.secret);
    let theirs: Option<String> = redis::cmd("GET").arg(keys.secret()).query_async(conn).await?;
    if theirs.as_deref().is_some_and(|t| t != mine) {
        let live = live_in(keys, conn).await?;
        if let Some(n) = live.iter().find(|n| **n != config.node) {
            return Err(ClusterError::Config(format!(
                "cluster.secret: not the secret of the running nodes (node {n:?} has another): give every node the same secret"
            )));
        }
    }
    // No live node has another secret (a cluster restarted with a new one): this one counts.
    let _: () = redis::cmd("SET").arg(keys.secret()).arg(&mine).query_async(conn).await?;
    Ok(())
}

/// True if `node`'s lease is held.
pub(crate) async fn alive(shared: &Shared, conn: &mut Conn, node: &str) -> bool {
    let v: redis::RedisResult<Value> = redis::cmd("GET").arg(shared.keys.lease(node)).query_async(conn).await;
    matches!(v, Ok(ref v) if bytes(v).is_some())
}

/// Gives up the lease: the node has stopped. It stays in the node list, so that another node
/// takes its sessions and inbox over.
pub(crate) async fn leave(shared: &Shared) {
    let conn = &mut shared.conn.clone();
    let result: redis::RedisResult<()> =
        redis::cmd("DEL").arg(shared.keys.lease(&shared.me)).query_async(conn).await;
    match result {
        Ok(()) => info!(node = %shared.me, "left the cluster"),
        Err(e) => warn!("cluster: could not leave cleanly ({e}); the lease lapses by itself"),
    }
}
