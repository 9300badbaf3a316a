//! Taking in sessions Redis keeps: one handed over or claimed from another node, or those
//! Redis says this node holds (at start, or joining again).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use tracing::info;

use braid_broker::broker::Broker;

use crate::membership::GRACE;
use crate::store::read_session;
use crate::{ClusterError, Shared};

/// Reads `client_id`'s session from Redis and has the broker adopt it; returns its id here,
/// None if Redis has no session (it ended). Unless its client is `connecting` here, what it got
/// through shared subscriptions and did not acknowledge goes to other members of the groups.
pub(crate) async fn adopt(
    shared: &Shared,
    broker: &Arc<Broker>,
    client_id: &str,
    connecting: bool,
) -> Result<Option<u64>, ClusterError> {
    let keys = shared.keys.session(client_id);
    let mut conn = shared.conn.clone();
    let replies: Vec<Value> = redis::pipe()
        .cmd("HGET")
        .arg(&keys.meta)
        .arg("record")
        .cmd("HGETALL")
        .arg(&keys.queue)
        .cmd("HGETALL")
        .arg(&keys.stages)
        .cmd("SMEMBERS")
        .arg(&keys.qos2)
        .query_async(&mut conn)
        .await?;
    let Some(mut session) =
        read_session(client_id, &replies[0], &replies[1..3], &replies[3], shared.store.clock())
            .map_err(|source| ClusterError::Record { client_id: client_id.into(), source })?
    else {
        return Ok(None);
    };
    if connecting {
        session.shared.clear();
    }
    let id = broker.cluster().new_session_id();
    session.record.id = id;
    shared.store.bind(id, client_id);
    broker.cluster().adopt(session, Instant::now());
    // Until every node routes by the move (relays and a gone node's inbox drained included),
    // a message may come by two ways.
    let settle = Duration::from_millis(shared.config.lease_ms) + GRACE;
    let (broker, client_id) = (Arc::downgrade(broker), client_id.to_string());
    tokio::spawn(async move {
        tokio::time::sleep(settle).await;
        if let Some(broker) = broker.upgrade() {
            broker.cluster().settled(&client_id);
        }
    });
    Ok(Some(id))
}

/// Takes in, at start, the sessions Redis says this node holds (it stopped or died with
/// them), so that what arrives for them is queued until their clients come back.
pub(crate) async fn adopt_owned(shared: &Arc<Shared>, broker: &Arc<Broker>) -> Result<(), ClusterError> {
    let mut conn = shared.conn.clone();
    let owned: Vec<String> =
        redis::cmd("SMEMBERS").arg(shared.keys.owned(&shared.me)).query_async(&mut conn).await?;
    let mut adopted = 0;
    for client_id in owned {
        let keys = shared.keys.session(&client_id);
        let meta: (Option<String>, Option<u64>) =
            redis::cmd("HMGET").arg(&keys.meta).arg("owner").arg("epoch").query_async(&mut conn).await?;
        let mine = matches!(&meta, (Some(owner), Some(_)) if *owner == shared.me);
        if let (true, Some(epoch)) = (mine, meta.1) {
            shared.store.set_epoch(&client_id, epoch);
            if adopt(shared, broker, &client_id, false).await?.is_some() {
                adopted += 1;
                continue;
            }
        }
        let _: redis::RedisResult<()> = redis::cmd("SREM")
            .arg(shared.keys.owned(&shared.me))
            .arg(&client_id)
            .query_async(&mut conn)
            .await;
    }
    if adopted > 0 {
        info!(sessions = adopted, "cluster: took back the sessions this node held");
    }
    Ok(())
}
