//! The names of the cluster's Redis keys, all under `cluster.key_prefix`. A session's keys
//! share a hash tag (its client id), and so do the retained hash and its change log, so that
//! the scripts that touch several of them stay on one slot of a Redis Cluster.

/// Key names for one cluster.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

/// The keys of one session.
#[derive(Debug, Clone)]
pub(crate) struct SessionKeys {
    /// Hash: `epoch`, `owner`, `record`.
    pub meta: String,
    /// Hash: sequence number -> delivery.
    pub queue: String,
    /// Hash: sequence number -> stage (absent: queued).
    pub stages: String,
    /// Set: inbound QoS 2 packet ids awaiting PUBREL.
    pub qos2: String,
}

impl SessionKeys {
    /// All four, in the order the scripts take them.
    pub(crate) fn all(&self) -> [&str; 4] {
        [&self.meta, &self.queue, &self.stages, &self.qos2]
    }
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Keys {
        Keys { prefix: prefix.to_string() }
    }

    /// String with a PX expiry: the lease of `node` (its value: the node's incarnation).
    pub(crate) fn lease(&self, node: &str) -> String {
        format!("{}:lease:{{{node}}}", self.prefix)
    }

    /// Hash: node -> its incarnation (`name@start_ms`): every node that joined and has not
    /// been taken over; the live ones hold their lease.
    pub(crate) fn nodes(&self) -> String {
        format!("{}:nodes", self.prefix)
    }

    /// Hash: node -> the address its links listen on (see [`crate::link`]).
    pub(crate) fn links(&self) -> String {
        format!("{}:links", self.prefix)
    }

    /// Hash: node -> the address its clients are sent to by others (its Server Reference).
    pub(crate) fn servers(&self) -> String {
        format!("{}:servers", self.prefix)
    }

    /// Hash: node -> its connections, as it last counted them.
    pub(crate) fn load(&self) -> String {
        format!("{}:load", self.prefix)
    }

    /// Hash: node -> the drain asked of it (see [`crate::drain`]).
    pub(crate) fn drain(&self) -> String {
        format!("{}:drain", self.prefix)
    }

    /// Hash: node -> how its drain goes, as it last wrote it.
    pub(crate) fn drain_state(&self) -> String {
        format!("{}:drainstate", self.prefix)
    }

    /// String with a PX expiry (the rebalance's bound): the rebalance under way, if any (see
    /// [`crate::rebalance`]).
    pub(crate) fn rebalance(&self) -> String {
        format!("{}:rebalance", self.prefix)
    }

    /// String: a fingerprint of the nodes' `cluster.secret` (see
    /// [`crate::link::handshake::fingerprint`]).
    pub(crate) fn secret(&self) -> String {
        format!("{}:secret", self.prefix)
    }

    /// Set: the filters `node`'s sessions subscribe to.
    pub(crate) fn routes(&self, node: &str) -> String {
        format!("{}:routes:{{{node}}}", self.prefix)
    }

    /// Stream: every change of any node's routes, in order.
    pub(crate) fn route_log(&self) -> String {
        format!("{}:routelog", self.prefix)
    }

    /// Hash: node -> the last route log entry it has applied.
    pub(crate) fn route_seen(&self) -> String {
        format!("{}:routeseen", self.prefix)
    }

    /// Stream (consumer group `braid`): messages and control requests for `node`.
    pub(crate) fn inbox(&self, node: &str) -> String {
        format!("{}:inbox:{{{node}}}", self.prefix)
    }

    /// Set: the client ids whose sessions `node` holds.
    pub(crate) fn owned(&self, node: &str) -> String {
        format!("{}:owned:{{{node}}}", self.prefix)
    }

    /// String with a PX expiry: the node taking over gone `node`.
    pub(crate) fn reaping(&self, node: &str) -> String {
        format!("{}:reaping:{{{node}}}", self.prefix)
    }

    /// Hash: topic -> retained message.
    pub(crate) fn retained(&self) -> String {
        format!("{}:retained:{{r}}", self.prefix)
    }

    /// Stream: every change of a retained message, in order.
    pub(crate) fn retained_log(&self) -> String {
        format!("{}:retainedlog:{{r}}", self.prefix)
    }

    /// The keys of `client_id`'s session.
    pub(crate) fn session(&self, client_id: &str) -> SessionKeys {
        let p = &self.prefix;
        SessionKeys {
            meta: format!("{p}:s:{{{client_id}}}"),
            queue: format!("{p}:q:{{{client_id}}}"),
            stages: format!("{p}:st:{{{client_id}}}"),
            qos2: format!("{p}:q2:{{{client_id}}}"),
        }
    }
}
