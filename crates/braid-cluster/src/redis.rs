//! Connections to Redis: one multiplexed connection that reconnects by itself for commands and
//! pipelines, and dedicated ones for blocking reads (a blocked connection would hold up every
//! command behind it).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Client;

use crate::ClusterError;

/// How to reach Redis.
#[derive(Debug, Clone)]
pub(crate) struct Redis {
    client: Client,
    url: String,
}

impl Redis {
    /// Checks `urls` (one Redis; a Redis Cluster's seed list is not served yet).
    pub(crate) fn new(urls: &[String]) -> Result<Redis, ClusterError> {
        let url = match urls {
            [one] => one.clone(),
            _ => {
                return Err(ClusterError::Config(
                    "cluster.redis: one URL expected (Redis Cluster seed lists are not supported yet)".into(),
                ))
            }
        };
        let client = Client::open(url.as_str())
            .map_err(|e| ClusterError::Config(format!("cluster.redis: {}: {e}", redact(&url))))?;
        Ok(Redis { client, url })
    }

    /// The URL without its password, for logs.
    pub(crate) fn display(&self) -> String {
        redact(&self.url)
    }

    /// A connection that reconnects with backoff and pipelines concurrent commands; commands
    /// time out after `timeout`.
    pub(crate) async fn manager(&self, timeout: Duration) -> Result<ConnectionManager, ClusterError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(2))
            .set_number_of_retries(1);
        self.client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| ClusterError::Redis(format!("{}: {e}", self.display())))
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
pub(crate) fn bytes(v: &redis::Value) -> Option<&[u8]> {
    match v {
        redis::Value::BulkString(b) => Some(b),
        redis::Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// An integer reply (or a string holding one).
pub(crate) fn int(v: &redis::Value) -> Option<i64> {
    match v {
        redis::Value::Int(i) => Some(*i),
        other => std::str::from_utf8(bytes(other)?).ok()?.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_stay_out_of_logs() {
        assert_eq!(redact("redis://u:secret@h:1"), "redis://u:***@h:1");
        assert_eq!(redact("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
