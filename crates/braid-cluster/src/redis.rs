//! Connections to Redis, one Redis or a Redis Cluster alike: [`Conn`] reconnects by itself and
//! pipelines concurrent commands. The writer and the lease share one; each blocking reader
//! has its own (a blocked connection would hold up every command behind it).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, IntoConnectionInfo, Pipeline, RedisFuture, TlsCertificates, Value};

use crate::ClusterError;

/// How to reach Redis.
#[derive(Clone)]
pub(crate) enum Redis {
    /// One Redis server.
    Single(Box<Client>, String),
    /// A Redis Cluster, from its seed URLs.
    Cluster(Box<ClusterClient>, String),
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display())
    }
}

/// A connection to one Redis or to a Redis Cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    /// To one Redis server.
    Single(ConnectionManager),
    /// To a Redis Cluster: commands go to their key's slot.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Conn::Single",
            Conn::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Runs `cmds` and returns their replies, in order: one pipeline on one Redis; on a Redis
    /// Cluster, whose pipelines must stay on one slot, one pipeline per hash tag (the
    /// commands of one tag keep their order; different tags run at once).
    pub(crate) async fn run_all(&mut self, cmds: &[Cmd]) -> redis::RedisResult<Vec<Value>> {
        match self {
            Conn::Single(c) => {
                let mut pipe = redis::pipe();
                for cmd in cmds {
                    pipe.add_command(cmd.clone());
                }
                pipe.query_async(c).await
            }
            Conn::Cluster(c) => {
                let mut groups: Vec<(Vec<u8>, Vec<usize>)> = Vec::new();
                for (i, cmd) in cmds.iter().enumerate() {
                    let tag = hash_tag(cmd);
                    match groups.iter_mut().find(|(t, _)| *t == tag) {
                        Some((_, members)) => members.push(i),
                        None => groups.push((tag, vec![i])),
                    }
                }
                let requests = groups.iter().map(|(_, members)| {
                    let mut c = c.clone();
                    let mut pipe = redis::pipe();
                    for &i in members {
                        pipe.add_command(cmds[i].clone());
                    }
                    async move { pipe.query_async::<Vec<Value>>(&mut c).await }
                });
                let mut out = vec![Value::Nil; cmds.len()];
                for ((_, members), replies) in
                    groups.iter().zip(futures_util::future::join_all(requests).await)
                {
                    for (&i, reply) in members.iter().zip(replies?) {
                        out[i] = reply;
                    }
                }
                Ok(out)
            }
        }
    }
}

/// What decides a command's slot on a Redis Cluster: the hash tag of its key (the part in the
/// first `{...}`), or the whole key. The key is the first argument (EVAL: the first key).
fn hash_tag(cmd: &Cmd) -> Vec<u8> {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(b) => Some(b),
            _ => None,
        })
        .collect();
    let is_eval =
        args.first().is_some_and(|n| n.eq_ignore_ascii_case(b"EVAL") || n.eq_ignore_ascii_case(b"EVALSHA"));
    let key = args.get(if is_eval { 3 } else { 1 }).copied().unwrap_or_default();
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    tag.unwrap_or(key).to_vec()
}

impl Redis {
    /// Checks `urls`: one `redis://` or `rediss://` URL, or several (the seed nodes of a Redis
    /// Cluster). `ca_file`: the CA certificate (PEM) `rediss://` servers are checked against,
    /// empty for the system's roots.
    pub(crate) fn new(urls: &[String], ca_file: &str) -> Result<Redis, ClusterError> {
        let shown = urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(", ");
        let bad = |e: &dyn std::fmt::Display| ClusterError::Config(format!("cluster.redis: {shown}: {e}"));
        let certs = match ca_file {
            "" => None,
            path => Some(TlsCertificates {
                client_tls: None,
                root_cert: Some(
                    std::fs::read(path)
                        .map_err(|e| ClusterError::Config(format!("cluster.ca_file: {path}: {e}")))?,
                ),
            }),
        };
        match urls {
            [] => Err(bad(&"no URL")),
            [one] => {
                let client = match certs {
                    Some(certs) => {
                        let info = one.as_str().into_connection_info().map_err(|e| bad(&e))?;
                        Client::build_with_tls(info, certs)
                    }
                    None => Client::open(one.as_str()),
                };
                Ok(Redis::Single(Box::new(client.map_err(|e| bad(&e))?), shown))
            }
            many => {
                let mut builder = ClusterClientBuilder::new(many.iter().map(String::as_str))
                    .connection_timeout(Duration::from_secs(2))
                    .response_timeout(Duration::from_secs(5))
                    .retries(3);
                if let Some(certs) = certs {
                    builder = builder.certs(certs);
                }
                Ok(Redis::Cluster(Box::new(builder.build().map_err(|e| bad(&e))?), shown))
            }
        }
    }

    /// The URLs without passwords, for logs.
    pub(crate) fn display(&self) -> String {
        match self {
            Redis::Single(_, shown) | Redis::Cluster(_, shown) => shown.clone(),
        }
    }

    /// A new connection; on one Redis, its commands time out after `timeout` and it
    /// reconnects with backoff.
    pub(crate) async fn connect(&self, timeout: Duration) -> Result<Conn, ClusterError> {
        let failed = ClusterError::redis(self.display());
        match self {
            Redis::Single(client, _) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_secs(2))
                    .set_number_of_retries(1);
                Ok(Conn::Single(client.get_connection_manager_with_config(config).await.map_err(failed)?))
            }
            Redis::Cluster(client, _) => {
                Ok(Conn::Cluster(client.get_async_connection().await.map_err(failed)?))
            }
        }
    }
}

/// `url` with any password replaced by `***`.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// The bytes of a bulk string (or simple string) reply.
pub(crate) fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// An integer reply (or a string holding one).
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => std::str::from_utf8(bytes(other)?).ok()?.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::{hash_tag, redact};

    #[test]
    fn commands_of_one_session_or_node_share_a_tag() {
        let eval = redis::cmd("EVAL").arg("script").arg(4).arg("braid:s:{c1}").arg("braid:q:{c1}").clone();
        let xadd = redis::cmd("XADD").arg("braid:inbox:{n2}").arg("*").clone();
        let plain = redis::cmd("HSET").arg("braid:nodes").arg("n1").clone();
        assert_eq!(hash_tag(&eval), b"c1");
        assert_eq!(hash_tag(&xadd), b"n2");
        assert_eq!(hash_tag(&plain), b"braid:nodes");
    }

    #[test]
    fn passwords_stay_out_of_logs() {
        assert_eq!(redact("redis://u:secret@h:1"), "redis://u:***@h:1");
        assert_eq!(redact("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
