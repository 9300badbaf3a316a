//! One session per client id, cluster-wide. A CONNECT claims its client id: if another live
//! node holds the session, that node closes its connection (0x8E), writes out what it has and
//! answers; then a script raises the session's ownership epoch and names this node the owner.
//! Every later write of the session carries that epoch ([`crate::store`]), so a node that lost
//! the session, even one that missed the request, cannot change it. Unless the client starts
//! clean, the session is then read from Redis and adopted by the broker.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use braid_broker::broker::{Broker, WillOnRelease};
use braid_broker::directory::{self as seam, Waiting};
use braid_broker::session::IN_PROCESS;
use braid_proto::{ByteString, ReasonCode};

use crate::redis::{bytes, int, Conn};
use crate::scripts;
use crate::wire;
use crate::{membership, reaper, retained, routes, sessions};
use crate::{ClusterError, Shared};

/// The cluster's [`braid_broker::directory::Directory`].
#[derive(Debug)]
pub(crate) struct Directory {
    shared: Arc<Shared>,
    broker: std::sync::Weak<Broker>,
}

impl Directory {
    pub(crate) fn new(shared: Arc<Shared>, broker: &Arc<Broker>) -> Directory {
        Directory { shared, broker: Arc::downgrade(broker) }
    }
}

impl braid_broker::directory::Directory for Directory {
    fn claim<'a>(&'a self, client_id: &'a str, clean_start: bool) -> seam::Claiming<'a> {
        Box::pin(async move {
            let draining = self.shared.balance.draining() && !client_id.starts_with(IN_PROCESS);
            if !self.shared.serving() || draining {
                return Err(ReasonCode::UseAnotherServer);
            }
            if client_id.is_empty() {
                // Assigned here, at random: no other node has it.
                return Ok(());
            }
            let broker = self.broker.upgrade().ok_or(ReasonCode::ServerUnavailable)?;
            claim(&self.shared, &broker, client_id, clean_start).await.map_err(|e| {
                warn!(%client_id, "cluster: cannot claim the session: {e}");
                ReasonCode::ServerUnavailable
            })
        })
    }

    fn before_subscribe(&self) -> Option<Waiting> {
        Some(Box::pin(retained::caught_up(self.shared.clone())))
    }

    fn after_subscribe(&self) -> Option<Waiting> {
        let broker = self.broker.upgrade()?;
        let confirmed = self.shared.confirmed.load(std::sync::atomic::Ordering::Relaxed);
        if broker.remotes().filter_changes() <= confirmed {
            return None;
        }
        Some(Box::pin(routes::propagated(self.shared.clone(), broker)))
    }

    fn attached(&self, client_id: &str) {
        let (shared, broker, client_id) = (self.shared.clone(), self.broker.clone(), client_id.to_string());
        tokio::spawn(async move {
            let Some(broker) = broker.upgrade() else { return };
            check_owner(&shared, &broker, &client_id).await;
        });
    }

    fn server_reference(&self) -> Option<ByteString> {
        let live = self.shared.live.lock().clone();
        self.shared.balance.suggest(&live, &self.shared.me)
    }

    fn ended(&self, client_id: &str) {
        let mut ended = redis::cmd("EVAL");
        ended.arg(scripts::ENDED).arg(1).arg(&self.shared.keys.session(client_id).meta).arg(&self.shared.me);
        // After the session's own writes, in order.
        self.shared.store.submit_cmds(vec![ended]);
    }
}

async fn claim(
    shared: &Arc<Shared>,
    broker: &Arc<Broker>,
    client_id: &str,
    clean: bool,
) -> Result<(), ClusterError> {
    let mut conn = shared.conn.clone();
    let keys = shared.keys.session(client_id);
    let deadline = Instant::now()
        + Duration::from_millis(3 * shared.config.lease_ms + shared.config.takeover_timeout_ms);
    // From the request to another node to the adoption, what that node relays here waits.
    let mut claiming = None;
    loop {
        let owner: Option<String> =
            redis::cmd("HGET").arg(&keys.meta).arg("owner").query_async(&mut conn).await?;
        let Some(owner) = owner.filter(|o| *o != shared.me) else { break };
        claiming = Some(Claiming::new(shared));
        if request_release(shared, &mut conn, client_id, &owner, clean).await || Instant::now() > deadline {
            break;
        }
        // Not while waiting for a gone node's lease to lapse.
        claiming = None;
        // The holder is gone: once its lease has lapsed, its sessions and inbox are taken
        // over (by this node, or by the one already doing it), then the session is asked
        // for again.
        let taken_over = !membership::alive(shared, &mut conn, &owner).await
            && reaper::take_over(shared, broker, &owner).await?;
        if !taken_over {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let reply: Vec<Value> = redis::cmd("EVAL")
        .arg(scripts::CLAIM)
        .arg(4)
        .arg(&keys.all()[..])
        .arg(&shared.me)
        .arg(if clean { "1" } else { "0" })
        .query_async(&mut conn)
        .await?;
    let epoch = reply.first().and_then(int).unwrap_or(0) as u64;
    let prev =
        reply.get(1).and_then(bytes).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
    if !prev.is_empty() && prev != shared.me {
        // Claimed by yet another node in the meantime, or the node asked above attached a
        // connection of its own claim after it answered: its writes are fenced from now on;
        // it is asked (again) to close its connection all the same.
        request_release(shared, &mut conn, client_id, &prev, clean).await;
        let _: redis::RedisResult<()> =
            redis::cmd("SREM").arg(shared.keys.owned(&prev)).arg(client_id).query_async(&mut conn).await;
    }
    shared.store.set_epoch(client_id, epoch);
    let _: () =
        redis::cmd("SADD").arg(shared.keys.owned(&shared.me)).arg(client_id).query_async(&mut conn).await?;
    if !clean && !broker.cluster().has_session(client_id) {
        sessions::adopt(shared, broker, client_id, true).await?;
    }
    drop(claiming);
    Ok(())
}

/// Counts a claim under way (see `Shared::claiming`) while it lives.
struct Claiming<'a>(&'a Shared);

impl<'a> Claiming<'a> {
    fn new(shared: &'a Shared) -> Claiming<'a> {
        shared.claiming.send_modify(|n| *n += 1);
        Claiming(shared)
    }
}

impl Drop for Claiming<'_> {
    fn drop(&mut self) {
        self.0.claiming.send_modify(|n| *n -= 1);
    }
}

/// Asks `owner`, if alive, to close `client_id`'s connection and write out its session (for a
/// client that starts `clean`: the session ends), and waits for its answer (at most
/// `cluster.takeover_timeout_ms`, less if `owner`'s lease lapses meanwhile): true if it
/// answered.
async fn request_release(
    shared: &Shared,
    conn: &mut Conn,
    client_id: &str,
    owner: &str,
    clean: bool,
) -> bool {
    if !membership::alive(shared, conn, owner).await {
        return false;
    }
    let (tx, rx) = oneshot::channel();
    shared.handovers.lock().insert(client_id.into(), tx);
    let request = wire::release_cmd(&shared.keys.inbox(owner), client_id, &shared.me, clean);
    let sent: redis::RedisResult<()> = request.query_async(conn).await;
    if sent.is_err() {
        shared.handovers.lock().remove(client_id);
        return false;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(shared.config.takeover_timeout_ms);
    tokio::pin!(rx);
    loop {
        // Its lease is looked at now and then: once it has lapsed, no answer will come.
        let wait = deadline.min(tokio::time::Instant::now() + LEASE_CHECK);
        if tokio::time::timeout_at(wait, &mut rx).await.is_ok() {
            return true;
        }
        let gone = !membership::alive(shared, conn, owner).await;
        if gone || tokio::time::Instant::now() >= deadline {
            shared.handovers.lock().remove(client_id);
            match gone {
                true => {
                    warn!(%client_id, %owner, "cluster: the node holding the session is gone; taking it over")
                }
                false => {
                    warn!(%client_id, %owner, "cluster: the node holding the session does not answer; waiting for its lease to lapse")
                }
            }
            return false;
        }
    }
}

/// How often a claim waiting for the holder's answer looks whether the holder's lease lapsed.
const LEASE_CHECK: Duration = Duration::from_millis(250);

/// After a connection attached here: if another node has claimed the client id since this
/// node did (two CONNECTs at once), this one goes (0x8E), even if its session writes nothing.
async fn check_owner(shared: &Shared, broker: &Broker, client_id: &str) {
    let mut conn = shared.conn.clone();
    let meta: redis::RedisResult<(Option<String>, Option<u64>)> = redis::cmd("HMGET")
        .arg(&shared.keys.session(client_id).meta)
        .arg("owner")
        .arg("epoch")
        .query_async(&mut conn)
        .await;
    let Ok((owner, epoch)) = meta else { return };
    let mine = shared.store.epoch(client_id);
    if owner.as_deref() != Some(&*shared.me) || (mine.is_some() && epoch != mine) {
        if broker.cluster().release(client_id, Instant::now(), None, WillOnRelease::Resumed).is_some() {
            warn!(%client_id, "cluster: another node claimed this client id at the same time; its connection here is closed");
        }
        shared.store.unbind(client_id);
    }
}

/// Another node claims `client_id` (for a client that starts `clean`): closes its connection
/// here (0x8E), waits until what its session wrote is in Redis, and tells `to` so.
pub(crate) async fn hand_over(
    shared: Arc<Shared>,
    broker: Arc<Broker>,
    client_id: ByteString,
    to: String,
    clean: bool,
) {
    // A session taken from a gone node goes on only with what that node's inbox held for it.
    let _ = shared.reaping.subscribe().wait_for(|n| *n == 0).await;
    let relay = routes::relay_sink(&shared, &broker, &to);
    let will = if clean { WillOnRelease::Ended } else { WillOnRelease::Resumed };
    if let Some((ticket, filters)) = broker.cluster().release(&client_id, Instant::now(), Some(&relay), will)
    {
        routes::relaying(&shared, &broker, &to, filters.iter().map(|f| f.to_string()).collect());
        let ticket = ticket.max(shared.store.finish_waiting(&client_id));
        shared.store.wait_durable(ticket).await;
        shared.store.unbind(&client_id);
        info!(%client_id, node = %to, "cluster: session handed over");
    }
    let mut conn = shared.conn.clone();
    let mut pipe = redis::pipe();
    pipe.add_command(wire::released_cmd(&shared.keys.inbox(&to), &client_id, &shared.me)).ignore();
    let _: redis::RedisResult<()> = pipe.query_async(&mut conn).await;
}

/// Lets go of the sessions whose writes were fenced: another node owns them now (unless this
/// node has claimed the session again since those writes).
pub(crate) async fn release_fenced(
    shared: Arc<Shared>,
    broker: Arc<Broker>,
    mut fenced: mpsc::UnboundedReceiver<(ByteString, u64)>,
) {
    while let Some((client_id, epoch)) = fenced.recv().await {
        if shared.store.epoch(&client_id).is_some_and(|now| now > epoch) {
            continue;
        }
        if broker.cluster().release(&client_id, Instant::now(), None, WillOnRelease::Resumed).is_some() {
            warn!(%client_id, "cluster: another node owns this session now; its connection here is closed");
        }
        shared.store.unbind(&client_id);
    }
}
