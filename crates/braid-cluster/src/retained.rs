//! Retained messages, cluster-wide: Redis holds them in one hash, each change logged to a
//! stream (written by the store's `Op::Retain`). A node reads the hash at start and applies the
//! log from then on, its own changes included, so every node's index converges on Redis's
//! order of changes.

use std::sync::Arc;
use std::time::Duration;

use crate::redis::Conn;
use redis::Value;
use tracing::warn;

use braid_broker::broker::Broker;
use braid_broker::message::Message;
use braid_broker::store::{codec, UnixClock};
use braid_proto::BytesMut;

use crate::keys::Keys;
use crate::redis::bytes;
use crate::store::pairs;
use crate::streams::{last_id, position, read_log};
use crate::{log_failure, ClusterError, Shared};

/// Every retained message in Redis (their expiries converted by `clock`), and the log
/// position they are as of.
pub(crate) async fn load(
    conn: &mut Conn,
    keys: &Keys,
    clock: &UnixClock,
) -> Result<(Vec<Arc<Message>>, String), ClusterError> {
    let from = last_id(conn, &keys.retained_log()).await?;
    let all: Value = redis::cmd("HGETALL").arg(keys.retained()).query_async(conn).await?;
    let mut out = Vec::new();
    for (topic, body) in pairs(Some(&all)) {
        match codec::read_message(BytesMut::from(body), clock) {
            Ok(msg) => out.push(msg),
            Err(e) => {
                warn!(topic = %String::from_utf8_lossy(topic), "cluster: an unreadable retained message is skipped: {e}")
            }
        }
    }
    Ok((out, from))
}

/// Waits until this node has applied every retained change Redis had when called (at most
/// a few seconds: with Redis away, a SUBSCRIBE goes on with what this node has).
pub(crate) async fn caught_up(shared: Arc<Shared>) {
    let mut conn = shared.conn.clone();
    let wait = async {
        let Ok(last) = last_id(&mut conn, &shared.keys.retained_log()).await else { return };
        let target = position(&last);
        let _ = shared.retained_applied.subscribe().wait_for(|applied| *applied >= target).await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(3), wait).await;
}

/// Applies the retained log from `from` on, until the broker shuts down.
pub(crate) async fn follow(shared: Arc<Shared>, broker: Arc<Broker>, mut from: String) {
    shared.retained_applied.send_replace(position(&from));
    let Ok(mut conn) = shared.redis.connect(Duration::from_secs(5)).await else {
        tracing::error!("cluster: cannot follow retained messages");
        return;
    };
    let stream = shared.keys.retained_log();
    let mut failing = false;
    loop {
        let read = tokio::select! {
            r = read_log(&mut conn, &stream, &from) => r,
            _ = broker.shutdown().cancelled() => return,
        };
        match read {
            Ok(entries) => {
                failing = false;
                for (id, fields) in entries {
                    apply(&broker, &fields);
                    from = id;
                }
                shared.retained_applied.send_replace(position(&from));
            }
            Err(e) => {
                log_failure("following retained messages", &mut failing, &e);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

fn apply(broker: &Broker, fields: &[Value]) {
    let get = |name: &[u8]| {
        fields
            .chunks(2)
            .find(|c| c.first().and_then(bytes) == Some(name))
            .and_then(|c| c.get(1).and_then(bytes))
    };
    let (Some(topic), Some(value)) = (get(b"t"), get(b"v")) else { return };
    let msg = if value.is_empty() {
        Message::internal(String::from_utf8_lossy(topic).into_owned().into(), Default::default(), true)
    } else {
        match codec::read_message(BytesMut::from(value), broker.unix_clock()) {
            Ok(msg) => msg,
            Err(e) => return warn!("cluster: an unreadable retained change is skipped: {e}"),
        }
    };
    broker.remotes().apply_retained(msg, std::time::Instant::now());
}
