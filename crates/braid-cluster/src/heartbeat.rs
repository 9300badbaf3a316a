//! The node's heartbeat: it renews the lease (see [`crate::membership`]), keeps
//! `$SYS/cluster/nodes` up to date, stops serving when cut off from Redis, and joins again
//! after its lease lapsed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use braid_broker::broker::{Broker, WillOnRelease};
use braid_broker::config::PartitionPolicy;
use braid_broker::message::Message;
use braid_proto::ReasonCode;

use crate::membership::{self, Renewed};
use crate::{inbox, routes, sessions, Shared};

/// Renews the lease, keeps `$SYS/cluster/nodes` up to date, stops serving when cut off and
/// leaves the cluster when the broker shuts down.
pub(crate) async fn run(shared: Arc<Shared>, broker: Arc<Broker>) {
    let lease = Duration::from_millis(shared.config.lease_ms);
    let mut tick = tokio::time::interval(lease / 4);
    let mut conn = shared.conn.clone();
    let mut renewed = Instant::now();
    let mut nodes_seen = String::new();
    // A lapsed lease was found and joining again has not succeeded yet.
    let mut rejoining = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = broker.shutdown().cancelled() => break,
        }
        match membership::renew(&shared, &mut conn).await {
            Ok(Renewed::Held) if !rejoining => {
                renewed = Instant::now();
                if !shared.serving.swap(true, Ordering::Relaxed) {
                    info!("cluster: Redis reached again; serving clients again");
                }
            }
            Ok(Renewed::Held | Renewed::Lapsed) => {
                warn!("cluster: this node's lease had lapsed (cut off, or Redis lost its data): its sessions may have been taken over; letting them go and joining again");
                stop_serving(&shared, &broker);
                rejoining = true;
                match rejoin(&shared, &broker).await {
                    Ok(()) => {
                        rejoining = false;
                        renewed = Instant::now();
                        shared.serving.store(true, Ordering::Relaxed);
                        info!("cluster: joined again; serving clients again");
                    }
                    Err(e) => warn!("cluster: joining again failed ({e}); retried at the next renewal"),
                }
            }
            Ok(Renewed::Taken) => {
                error!(node = %shared.me, "cluster: another process took this node's name; no longer serving");
                stop_serving(&shared, &broker);
                continue;
            }
            Err(e) => {
                // Before the lease lapses in Redis (another node may then take over).
                if renewed.elapsed() >= lease * 3 / 4 && shared.config.on_partition == PartitionPolicy::Refuse
                {
                    if shared.serving() {
                        warn!("cluster: cut off from Redis for three quarters of the lease ({e}): telling clients to use another server");
                    }
                    stop_serving(&shared, &broker);
                }
                continue;
            }
        }
        if let Ok(nodes) = membership::live_nodes(&shared, &mut conn).await {
            shared.live.lock().clone_from(&nodes);
            let list = format!("[{}]", nodes.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(","));
            if list != nodes_seen {
                info!(nodes = %list, "cluster: nodes");
                let topic = "$SYS/cluster/nodes".into();
                let _ = broker.publish(Message::internal(topic, list.clone().into(), true), Instant::now());
                nodes_seen = list;
            }
        }
    }
}

fn stop_serving(shared: &Shared, broker: &Broker) {
    shared.serving.store(false, Ordering::Relaxed);
    broker.close_all(ReasonCode::UseAnotherServer);
}

/// Lets go of every session here (another node may hold them now) and joins again as after a
/// start: the inbox group, the sessions Redis still says are this node's, the routes afresh.
async fn rejoin(shared: &Arc<Shared>, broker: &Arc<Broker>) -> Result<(), crate::ClusterError> {
    let now = Instant::now();
    for client_id in broker.client_ids() {
        broker.cluster().release(&client_id, now, None, WillOnRelease::Kept);
        shared.store.unbind(&client_id);
    }
    inbox::create_group(&mut shared.conn.clone(), &shared.keys.inbox(&shared.me)).await?;
    sessions::adopt_owned(shared, broker).await?;
    routes::announce(shared, broker);
    Ok(())
}
