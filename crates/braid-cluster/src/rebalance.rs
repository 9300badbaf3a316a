//! Rebalancing: evening the nodes' connections out, after a node joined say. An operator's
//! request (through any node's admin API) is the `rebalance` key, `{"id", "rate", "senders"}`,
//! whose time to live is the rebalance's bound; every node reads it with its heartbeat
//! ([`crate::balance`]). The senders are the nodes that served (live, not draining) and held
//! more than their average by more than the margin (5%, at least one connection) when it was
//! asked; while the key is there, each of them sends away the excess it counts when it first
//! reads the request, at the rate, each connection to the least loaded node. Only they send: a node that took
//! clients in never sends them on because its view of the others' counts was older than its
//! own. It ends once the loads are even (the node that finds them so deletes the key) or at
//! its bound.

use std::time::Duration;

use serde_json::{json, Map, Value};

use braid_broker::balance::Refusal;

use crate::redis::{int, Conn};
use crate::store::pairs;
use crate::{membership, scripts, Shared};

/// Above the average by more than this share of it (and by more than one connection), a node
/// sends its excess away.
const MARGIN: f64 = 0.05;

/// Even: the most loaded node holds at most this many percent of the least loaded's
/// connections.
const BAR_PERCENT: u64 = 115;

/// A rebalance under way, as Redis holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// Tells one rebalance from the next.
    pub(crate) id: u64,
    /// Connections per second each node sends away.
    pub(crate) rate: u32,
    /// The nodes that send: those above the average by more than the margin when it began.
    pub(crate) senders: Vec<String>,
}

impl Request {
    /// As Redis keeps it.
    fn to_text(&self) -> String {
        json!({ "id": self.id, "rate": self.rate, "senders": self.senders }).to_string()
    }

    /// What [`Request::to_text`] wrote.
    pub(crate) fn parse(text: &[u8]) -> Option<Request> {
        let v: Value = serde_json::from_slice(text).ok()?;
        let rate = u32::try_from(v["rate"].as_u64()?).ok().filter(|r| *r > 0)?;
        let senders: Option<Vec<String>> =
            v["senders"].as_array()?.iter().map(|n| Some(n.as_str()?.to_string())).collect();
        Some(Request { id: v["id"].as_u64()?, rate, senders: senders? })
    }
}

fn margin(average: f64) -> f64 {
    (average * MARGIN).max(1.0)
}

fn average(loads: &[u64]) -> f64 {
    loads.iter().sum::<u64>() as f64 / loads.len().max(1) as f64
}

/// How many of its `mine` connections a node should send away for `loads` (those of every
/// node that serves, its own included) to even out: down to the average if it is above it by
/// more than the margin, else none.
pub(crate) fn excess(mine: u64, loads: &[u64]) -> u64 {
    let average = average(loads);
    if loads.is_empty() || mine as f64 <= average + margin(average) {
        return 0;
    }
    mine.saturating_sub(average.ceil() as u64)
}

/// True if `loads` are even: the most loaded node holds at most 1.15 times the least loaded's
/// connections, or none is above the average by more than the margin (a few connections, as
/// 2, 1, 1, are as even as they get).
pub(crate) fn balanced(loads: &[u64]) -> bool {
    let (Some(&max), Some(&min)) = (loads.iter().max(), loads.iter().min()) else { return true };
    let average = average(loads);
    max.saturating_mul(100) <= min.saturating_mul(BAR_PERCENT) || max as f64 <= average + margin(average)
}

/// Starts a rebalance at `rate` connections per second, for at most `bound`, unless the loads
/// are even already; answers the loads it starts from and the nodes that send. Refused with
/// fewer than two nodes that serve.
pub(crate) async fn start(shared: &Shared, rate: u32, bound: Duration) -> Result<Value, Refusal> {
    let unavailable = |e: redis::RedisError| Refusal::Unavailable(format!("Redis: {e}"));
    let mut conn = shared.conn.clone();
    let live = membership::live_nodes(shared, &mut conn).await.map_err(unavailable)?;
    let cmds = [
        redis::cmd("HGETALL").arg(shared.keys.drain()).clone(),
        redis::cmd("HGETALL").arg(shared.keys.load()).clone(),
    ];
    let replies = conn.run_all(&cmds).await.map_err(unavailable)?;
    let draining: Vec<&[u8]> = pairs(replies.first()).map(|(node, _)| node).collect();
    let counted: Vec<(&[u8], &[u8])> = pairs(replies.get(1)).collect();
    let serving: Vec<&String> = live.iter().filter(|n| !draining.contains(&n.as_bytes())).collect();
    if serving.len() < 2 {
        return Err(Refusal::Conflict(
            "fewer than two live nodes that are not draining: there is nothing to even out".into(),
        ));
    }
    let load = |node: &str| {
        let found = counted.iter().find(|(n, _)| *n == node.as_bytes());
        found.and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u64>().ok()).unwrap_or(0)
    };
    let counts: Vec<u64> = serving.iter().map(|n| load(n)).collect();
    let loads: Map<String, Value> =
        serving.iter().zip(&counts).map(|(n, c)| (n.to_string(), json!(c))).collect();
    let senders: Vec<String> = serving
        .iter()
        .zip(&counts)
        .filter(|(_, c)| excess(**c, &counts) > 0)
        .map(|(n, _)| n.to_string())
        .collect();
    let even = balanced(&counts);
    let secs = bound.as_secs();
    let answer = json!({ "rate": rate, "timeout_secs": secs, "balanced": even, "connections": loads, "senders": senders });
    if even {
        return Ok(answer);
    }
    let request = Request { id: rand::random(), rate, senders };
    let bound_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
    let _: () = redis::cmd("SET")
        .arg(shared.keys.rebalance())
        .arg(request.to_text())
        .arg("PX")
        .arg(bound_ms)
        .query_async(&mut conn)
        .await
        .map_err(unavailable)?;
    shared.balance.nudge();
    tracing::info!(rate, secs, connections = %answer["connections"], senders = %answer["senders"], "cluster: rebalance asked (API)");
    Ok(answer)
}

/// Ends `request` (the loads are even), unless another rebalance replaced it.
pub(crate) async fn end(shared: &Shared, conn: &mut Conn, request: &Request) -> redis::RedisResult<()> {
    let ended: redis::Value = redis::cmd("EVAL")
        .arg(scripts::END_REBALANCE)
        .arg(1)
        .arg(shared.keys.rebalance())
        .arg(request.to_text())
        .query_async(conn)
        .await?;
    if int(&ended) == Some(1) {
        tracing::info!("cluster: rebalance done: the nodes' connections are even");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_above_the_average_by_more_than_the_margin_sends_its_excess_away() {
        assert_eq!(excess(300, &[300, 0, 0]), 200);
        assert_eq!(excess(0, &[300, 0, 0]), 0);
        assert_eq!(excess(105, &[105, 100, 95]), 0, "within 5%");
        assert_eq!(excess(107, &[107, 100, 93]), 7, "down to the average");
        assert_eq!(excess(3, &[3, 1]), 0, "one connection above is within the margin");
        assert_eq!(excess(4, &[4, 0]), 2);
        assert_eq!(excess(1001, &[1001, 1000]), 0);
        assert_eq!(excess(5, &[]), 0);
    }

    #[test]
    fn loads_are_even_within_15_percent_or_when_nobody_is_above_the_margin() {
        assert!(balanced(&[100, 100, 100]));
        assert!(balanced(&[115, 100, 108]));
        assert!(!balanced(&[300, 0, 0]));
        assert!(!balanced(&[120, 100, 100]));
        assert!(balanced(&[2, 1, 1]), "as even as four connections get");
        assert!(balanced(&[0, 0]));
        assert!(balanced(&[]));
    }

    #[test]
    fn a_request_reads_back_as_written() {
        let r = Request { id: 7, rate: 50, senders: vec!["n1".into()] };
        assert_eq!(Request::parse(r.to_text().as_bytes()), Some(r));
        assert_eq!(Request::parse(br#"{"id": 7, "rate": 0, "senders": []}"#), None);
        assert_eq!(Request::parse(br#"{"id": 7, "rate": 5}"#), None);
    }
}
