//! Moving clients between the nodes of a cluster: the seam a cluster implements so that
//! operators (the admin API) can drain a node or even the nodes' connections out (see
//! [`crate::broker::ClusterSide::set_balancer`]). A single broker has none. The connections
//! themselves are sent away with [`crate::broker::ClusterSide::send_away`].

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// The answer to a request: what was started or ended, as JSON for the API, or why not.
pub type Answer<'a> = Pin<Box<dyn Future<Output = Result<serde_json::Value, Refusal>> + Send + 'a>>;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No live node has this name (the message names it).
    UnknownNode(String),
    /// Not now: no other node could take the clients, say.
    Conflict(String),
    /// Redis could not be reached.
    Unavailable(String),
}

/// Drains and rebalances of a cluster's connections.
pub trait Balancer: Send + Sync + Debug {
    /// Drains live node `node`: it refuses new connections (0x9C) and sends its clients to
    /// the other nodes at `rate` connections per second; answers the drain's state.
    fn drain<'a>(&'a self, node: &'a str, rate: u32) -> Answer<'a>;

    /// Ends `node`'s drain, if it drains: it accepts connections again.
    fn cancel_drain<'a>(&'a self, node: &'a str) -> Answer<'a>;

    /// Evens the nodes' connections out: each node above the average sends its excess to the
    /// least loaded nodes at `rate` connections per second, until balanced or for at most
    /// `bound`; answers the loads it started from.
    fn rebalance(&self, rate: u32, bound: Duration) -> Answer<'_>;
}
