//! Draining a node: an operator asks (through any node's admin API) that a node's clients go
//! elsewhere before it is stopped. The request is a field of the `drain` hash (node -> its
//! rate, `{"rate": N}`), which every node reads with its heartbeat ([`crate::balance`]). The
//! node asked refuses new CONNECTs (0x9C, with a Server Reference) and sends its connections
//! away at that rate; it writes how that goes to `drainstate` with each heartbeat, and once no
//! connection is left it is drained and keeps refusing until it stops or the drain is
//! cancelled (the field deleted). A drain ends with the process: a node deletes its own
//! request when it leaves, and a restarted one when it starts.

use std::collections::HashMap;

use serde_json::{json, Value};

use braid_broker::balance::Refusal;

use crate::store::pairs;
use crate::{membership, Shared};

/// How a node's drain goes, as it writes it with each heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Connections per second it sends away.
    pub(crate) rate: u32,
    /// Connections it has sent away since the drain began.
    pub(crate) moved: u64,
    /// Connections it still has.
    pub(crate) remaining: u64,
}

impl Progress {
    /// A drain at `rate` that has not moved anything yet, `remaining` connections to go.
    pub(crate) fn new(rate: u32, remaining: u64) -> Progress {
        Progress { rate, moved: 0, remaining }
    }

    /// `draining` while connections are left, then `drained`.
    pub(crate) fn state(&self) -> &'static str {
        if self.remaining == 0 {
            "drained"
        } else {
            "draining"
        }
    }

    /// As the API shows it and `drainstate` keeps it.
    pub(crate) fn to_json(self) -> Value {
        json!({ "state": self.state(), "rate": self.rate, "moved": self.moved, "remaining": self.remaining })
    }

    /// What [`Progress::to_json`] wrote.
    pub(crate) fn parse(text: &[u8]) -> Option<Progress> {
        let v: Value = serde_json::from_slice(text).ok()?;
        Some(Progress {
            rate: u32::try_from(v["rate"].as_u64()?).ok()?,
            moved: v["moved"].as_u64()?,
            remaining: v["remaining"].as_u64()?,
        })
    }
}

/// The rate of a drain request (`{"rate": N}`).
pub(crate) fn parse_request(text: &[u8]) -> Option<u32> {
    let v: Value = serde_json::from_slice(text).ok()?;
    u32::try_from(v["rate"].as_u64()?).ok().filter(|r| *r > 0)
}

/// Asks live node `node` to drain at `rate` connections per second. Refused for a node that
/// is not live, and when no other live node that is not draining could take its clients.
pub(crate) async fn start(shared: &Shared, node: &str, rate: u32) -> Result<Value, Refusal> {
    let unavailable = |e: redis::RedisError| Refusal::Unavailable(format!("Redis: {e}"));
    let mut conn = shared.conn.clone();
    let live = membership::live_nodes(shared, &mut conn).await.map_err(unavailable)?;
    if !live.iter().any(|n| n == node) {
        return Err(unknown(node, &live));
    }
    let asked: redis::Value =
        redis::cmd("HGETALL").arg(shared.keys.drain()).query_async(&mut conn).await.map_err(unavailable)?;
    let draining: HashMap<&[u8], &[u8]> = pairs(Some(&asked)).collect();
    if !live.iter().any(|n| n != node && !draining.contains_key(n.as_bytes())) {
        return Err(Refusal::Conflict(format!(
            "no other live node that is not draining could take the clients of {node:?}"
        )));
    }
    let request = json!({ "rate": rate }).to_string();
    let _: () = redis::cmd("HSET")
        .arg(shared.keys.drain())
        .arg(node)
        .arg(request)
        .query_async(&mut conn)
        .await
        .map_err(unavailable)?;
    if node == shared.me {
        shared.balance.nudge();
    }
    tracing::info!(%node, rate, "cluster: drain asked (API)");
    Ok(json!({ "node": node, "draining": true, "rate": rate }))
}

/// Ends `node`'s drain: it accepts connections again. Refused for a node that is not live and
/// has no drain.
pub(crate) async fn cancel(shared: &Shared, node: &str) -> Result<Value, Refusal> {
    let unavailable = |e: redis::RedisError| Refusal::Unavailable(format!("Redis: {e}"));
    let mut conn = shared.conn.clone();
    let cmds = [
        redis::cmd("HDEL").arg(shared.keys.drain()).arg(node).clone(),
        redis::cmd("HDEL").arg(shared.keys.drain_state()).arg(node).clone(),
    ];
    let replies = conn.run_all(&cmds).await.map_err(unavailable)?;
    let was_draining = replies.first().and_then(crate::redis::int) == Some(1);
    if !was_draining {
        let live = membership::live_nodes(shared, &mut conn).await.map_err(unavailable)?;
        if !live.iter().any(|n| n == node) {
            return Err(unknown(node, &live));
        }
    }
    if node == shared.me {
        shared.balance.nudge();
    }
    if was_draining {
        tracing::info!(%node, "cluster: drain cancelled (API)");
    }
    Ok(json!({ "node": node, "draining": false, "was_draining": was_draining }))
}

fn unknown(node: &str, live: &[String]) -> Refusal {
    Refusal::UnknownNode(format!("no live node is named {node:?} (the live nodes: {})", live.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_and_requests_read_back_as_written() {
        let p = Progress { rate: 100, moved: 12, remaining: 988 };
        assert_eq!(p.to_json()["state"], "draining");
        assert_eq!(Progress::parse(p.to_json().to_string().as_bytes()), Some(p));
        assert_eq!(Progress { remaining: 0, ..p }.state(), "drained");
        assert_eq!(Progress::parse(b"{\"rate\": 1}"), None);
        assert_eq!(parse_request(br#"{"rate": 250}"#), Some(250));
        assert_eq!(parse_request(br#"{"rate": 0}"#), None);
        assert_eq!(parse_request(b"garbage"), None);
    }
}
