//! `[cluster]`: many nodes as one broker, on Redis.

use serde::{Deserialize, Serialize};

use super::error::bad;
use super::{one_or_many, ConfigError};

/// What a node cut off from Redis for three quarters of its lease does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionPolicy {
    /// Closes its connections with 0x9C (Use another server) and refuses new ones until Redis
    /// is back: no split brain.
    Refuse,
    /// Keeps serving its own clients (availability over consistency): two nodes may then
    /// both serve one client id, and cross-node traffic waits.
    Serve,
}

/// Cluster settings (see `docs/cluster.md`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Run as a node of a cluster. Off: a single broker, no Redis needed.
    pub enabled: bool,
    /// This node's name, unique in the cluster.
    pub node: String,
    /// Redis URL(s): one `redis://` or `rediss://` URL, or the seed URLs of a Redis Cluster.
    #[serde(deserialize_with = "one_or_many")]
    pub redis: Vec<String>,
    /// Prefix of every Redis key the cluster uses (several clusters can share a Redis).
    pub key_prefix: String,
    /// A node's lease in Redis, in milliseconds: a node not heard from for this long is dead,
    /// and its clients' sessions may be taken over.
    pub lease_ms: u64,
    /// What a node cut off from Redis for three quarters of its lease does.
    pub on_partition: PartitionPolicy,
    /// How long a CONNECT waits for the node that holds its session to hand it over, in
    /// milliseconds; a node that does not answer is waited for until its lease lapses, then
    /// taken over.
    pub takeover_timeout_ms: u64,
    /// Most writes to Redis in one round trip, and most inbox entries read at once.
    pub batch: usize,
    /// CA certificate (PEM) for `rediss://` URLs; empty: the system's roots.
    pub ca_file: String,
    /// UDP address the node's links (QUIC) listen on for its peers; empty: no links, every
    /// message between nodes goes through Redis.
    pub listen: String,
    /// The address other nodes dial for this node's links; empty: the listen address, or with
    /// an unspecified IP (`0.0.0.0`) this host's address towards Redis.
    pub advertise: String,
    /// The secret every node shares: it authenticates the links (required with `listen`).
    pub secret: String,
    /// How long a peer may stay silent while messages wait for its acknowledgement, in
    /// milliseconds, before its link is dropped and they go through its Redis inbox.
    pub link_timeout_ms: u64,
    /// The address clients are sent to for this node (a v5 Server Reference, when another
    /// node drains or rebalances); empty: the TCP listener's port on its IP or, with an
    /// unspecified IP, on the host of the links' advertised address.
    pub server_reference: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            node: String::new(),
            redis: vec!["redis://127.0.0.1:6379".into()],
            key_prefix: "braid".into(),
            lease_ms: 10_000,
            on_partition: PartitionPolicy::Refuse,
            takeover_timeout_ms: 3_000,
            batch: 512,
            ca_file: String::new(),
            listen: "0.0.0.0:4370".into(),
            advertise: String::new(),
            secret: String::new(),
            link_timeout_ms: 2_000,
            server_reference: String::new(),
        }
    }
}

impl ClusterConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if self.node.is_empty() {
            return bad("cluster.node", "required when cluster.enabled: a name unique in the cluster");
        }
        let name_ok = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if self.node.len() > 64 || !name_ok(&self.node) {
            return bad("cluster.node", "at most 64 letters, digits, '-', '_' or '.'");
        }
        if self.key_prefix.is_empty() || !name_ok(&self.key_prefix) {
            return bad("cluster.key_prefix", "must be letters, digits, '-', '_' or '.'");
        }
        if self.redis.is_empty() {
            return bad("cluster.redis", "required when cluster.enabled: a redis:// or rediss:// URL");
        }
        if let Some(url) =
            self.redis.iter().find(|u| !(u.starts_with("redis://") || u.starts_with("rediss://")))
        {
            return bad("cluster.redis", &format!("{url:?} is not a redis:// or rediss:// URL"));
        }
        if self.lease_ms < 1000 {
            return bad("cluster.lease_ms", "must be at least 1000");
        }
        if self.takeover_timeout_ms == 0 {
            return bad("cluster.takeover_timeout_ms", "must be at least 1");
        }
        if self.batch == 0 {
            return bad("cluster.batch", "must be at least 1");
        }
        if self.listen.is_empty() {
            return Ok(());
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return bad("cluster.listen", &format!("{:?} is not IP:PORT (empty: no links)", self.listen));
        }
        if !self.advertise.is_empty() && !self.advertise.contains(':') {
            return bad("cluster.advertise", &format!("{:?} is not HOST:PORT", self.advertise));
        }
        if self.secret.len() < 16 {
            return bad(
                "cluster.secret",
                "required when cluster.listen is set: at least 16 characters, the same on every node \
                 (it authenticates the links between nodes)",
            );
        }
        if self.link_timeout_ms < 100 {
            return bad("cluster.link_timeout_ms", "must be at least 100");
        }
        Ok(())
    }
}
