//! The cluster as operators see it: the live nodes, with their connections and drains, listed
//! by the admin API (`/api/v1/nodes`) and counted in its metrics.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use braid_broker::report::{Report, Sample};

use crate::Shared;

/// Help of `braid_cluster_link_messages_total`.
const LINK_MESSAGES: &str =
    "Messages sent to the peer, by the way they went: over its link, or through its Redis inbox while the link could not carry them (one written to a link that failed before the peer acknowledged it counts on both).";

/// The live nodes, as the heartbeat last read them, and whether this node serves.
pub(crate) struct Nodes(pub(crate) Arc<Shared>);

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Nodes").field(&self.0.me).finish()
    }
}

impl Report for Nodes {
    fn collection(&self) -> &'static str {
        "nodes"
    }

    fn entries(&self) -> Vec<serde_json::Value> {
        let shared = &self.0;
        let serving = shared.serving.load(Ordering::Relaxed);
        let mut live = shared.live.lock().clone();
        if !live.contains(&shared.me) {
            live.push(shared.me.clone());
        }
        live.sort();
        let links = shared.links.as_ref().map(|l| l.all()).unwrap_or_default();
        live.into_iter()
            .map(|name| {
                let this = name == shared.me;
                let (draining, balance) = shared.balance.describe(&name, this);
                let state = match (this, serving, draining) {
                    (true, false, _) => "cut_off",
                    (_, _, Some(state)) => state,
                    _ => "up",
                };
                // How this node reaches it: over a link, or through Redis.
                let link = match links.iter().find(|l| l.node == name) {
                    _ if this => None,
                    Some(l) if l.is_up() => Some("up"),
                    Some(_) => Some("down"),
                    None if shared.links.is_some() => Some("idle"),
                    None => Some("none"),
                };
                let mut entry = serde_json::json!({ "name": name, "this_node": this, "state": state, "clustered": true, "link": link });
                if let Some(fields) = entry.as_object_mut() {
                    fields.extend(balance);
                }
                entry
            })
            .collect()
    }

    fn samples(&self, out: &mut Vec<Sample>) {
        let shared = &self.0;
        let nodes = shared.live.lock().len();
        out.push(Sample::gauge(
            "braid_cluster_nodes",
            "Live nodes of the cluster, as this node last read them.",
            nodes as f64,
        ));
        let serving = f64::from(u8::from(shared.serving.load(Ordering::Relaxed)));
        out.push(Sample::gauge(
            "braid_cluster_serving",
            "1 while this node serves (its lease is held).",
            serving,
        ));
        out.push(Sample::counter(
            "braid_cluster_forwarded_messages_total",
            "Messages handed to other nodes for their subscribers (one per node a message went to).",
            shared.forwarded.load(Ordering::Relaxed),
        ));
        for link in shared.links.as_ref().map(|l| l.all()).unwrap_or_default() {
            let (sent, fell_back, connects) = link.counts();
            out.push(
                Sample::gauge(
                    "braid_cluster_link_up",
                    "1 while the link to the peer is up.",
                    f64::from(u8::from(link.is_up())),
                )
                .with("peer", link.node.clone()),
            );
            out.push(
                Sample::counter("braid_cluster_link_messages_total", LINK_MESSAGES, sent)
                    .with("peer", link.node.clone())
                    .with("path", "link"),
            );
            out.push(
                Sample::counter("braid_cluster_link_messages_total", LINK_MESSAGES, fell_back)
                    .with("peer", link.node.clone())
                    .with("path", "redis"),
            );
            out.push(
                Sample::counter(
                    "braid_cluster_link_connects_total",
                    "Times the link to the peer came up.",
                    connects,
                )
                .with("peer", link.node.clone()),
            );
        }
        shared.balance.samples(out);
        out.push(Sample::counter(
            "braid_cluster_duplicate_messages_total",
            "Messages from other nodes dropped as received before (they came both over a link and through Redis, or were read twice).",
            shared.duplicates.load(Ordering::Relaxed),
        ));
        out.push(Sample::counter(
            "braid_cluster_received_messages_total",
            "Messages from other nodes, over links or from this node's inbox, routed here.",
            shared.received.load(Ordering::Relaxed),
        ));
    }
}
