//! This node's inbox: a Redis stream other nodes write messages and handover requests into,
//! read through a consumer group. A message is routed to this node's sessions, and its entry
//! acknowledged and deleted only once what the sessions queued is durable in Redis: a node
//! that dies before that reads the entry again at its next start. Entries read twice (that,
//! or a sender's retried write) are dropped by their number from the sending incarnation.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use braid_broker::broker::Broker;
use braid_broker::store::Store;

use crate::routes::stream_entries;
use crate::wire::{self, Entry};
use crate::{directory, log_failure, ClusterError, Shared};

const GROUP: &str = "braid";

/// Creates the inbox's consumer group (reading from the stream's start: what was sent while
/// this node was away is delivered) and returns the reader's task.
pub(crate) async fn run(shared: Arc<Shared>, broker: Arc<Broker>) -> Result<JoinHandle<()>, ClusterError> {
    let inbox = shared.keys.inbox(&shared.me);
    let mut conn = shared.conn.clone();
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&inbox)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await;
    if let Err(e) = created {
        if e.code() != Some("BUSYGROUP") {
            return Err(ClusterError::Redis(format!("cannot create the inbox group: {e}")));
        }
    }
    let reader = shared.redis.manager(Duration::from_secs(5)).await?;
    Ok(tokio::spawn(read(shared, broker, reader, inbox)))
}

/// Reads the inbox until the broker shuts down: first what was read before but never
/// acknowledged (pending), then new entries.
async fn read(shared: Arc<Shared>, broker: Arc<Broker>, mut conn: ConnectionManager, inbox: String) {
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut pending = true;
    let mut failing = false;
    loop {
        let from = if pending { "0" } else { ">" };
        let read = tokio::select! {
            r = read_group(&mut conn, &inbox, &shared.me, from, shared.config.batch) => r,
            _ = broker.shutdown.cancelled() => return,
        };
        let entries = match read {
            Ok(v) => {
                failing = false;
                stream_entries(&v)
            }
            Err(e) => {
                log_failure("reading the inbox", &mut failing, &e);
                // After a reconnect, what was read but not acknowledged is read again.
                pending = true;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        if pending && entries.is_empty() {
            pending = false;
            continue;
        }
        let mut ticket = 0;
        let mut ids = Vec::with_capacity(entries.len());
        for (id, fields) in entries {
            ids.push(id);
            match wire::read(&fields) {
                Ok(Entry::Message { msg, scope, origin: (from, n) }) => {
                    let last = seen.entry(from).or_insert(0);
                    if n <= *last {
                        debug!(n, "cluster: a message received twice is dropped");
                        continue;
                    }
                    *last = n;
                    let published = broker.publish_forwarded(msg, &scope, Instant::now());
                    ticket = ticket.max(published.ticket);
                }
                Ok(Entry::Release { client_id, from }) => {
                    tokio::spawn(directory::hand_over(shared.clone(), broker.clone(), client_id, from));
                }
                Ok(Entry::Released { client_id }) => {
                    if let Some(tx) = shared.handovers.lock().remove(&client_id) {
                        let _ = tx.send(());
                    }
                }
                Err(e) => warn!("cluster: an unreadable inbox entry is skipped: {e}"),
            }
        }
        wait_durable(&*shared.store, ticket).await;
        acknowledge(&shared, &inbox, &ids).await;
    }
}

async fn read_group(
    conn: &mut ConnectionManager,
    inbox: &str,
    me: &str,
    from: &str,
    count: usize,
) -> redis::RedisResult<redis::Value> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP").arg(GROUP).arg(me).arg("COUNT").arg(count);
    if from == ">" {
        cmd.arg("BLOCK").arg(1000);
    }
    cmd.arg("STREAMS").arg(inbox).arg(from);
    cmd.query_async(conn).await
}

/// Waits until the store's changes up to `ticket` are in Redis.
pub(crate) async fn wait_durable(store: &dyn Store, ticket: u64) {
    if ticket == 0 {
        return;
    }
    let mut durable = store.durable();
    let _ = durable.wait_for(|t| *t >= ticket).await;
}

/// Acknowledges and deletes the entries `ids`, retrying until Redis takes it.
async fn acknowledge(shared: &Shared, inbox: &str, ids: &[String]) {
    if ids.is_empty() {
        return;
    }
    let mut conn = shared.conn.clone();
    let mut failing = false;
    loop {
        let result: redis::RedisResult<()> = redis::pipe()
            .cmd("XACK")
            .arg(inbox)
            .arg(GROUP)
            .arg(ids)
            .ignore()
            .cmd("XDEL")
            .arg(inbox)
            .arg(ids)
            .ignore()
            .query_async(&mut conn)
            .await;
        match result {
            Ok(()) => {
                if failing {
                    info!("cluster: inbox acknowledgements resumed");
                }
                return;
            }
            Err(e) => {
                log_failure("acknowledging inbox entries", &mut failing, &e);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
