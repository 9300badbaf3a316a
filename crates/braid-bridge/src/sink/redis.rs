//! The `redis` sink: one command per output, its words (`command`, split at spaces) each a
//! template filled from the output (`HSET device:${clientid} temp ${temp}`, `XADD s * v
//! ${payload}`, `PUBLISH ch ${payload}`); a batch's commands are pipelined on one multiplexed
//! connection. An error reply (a wrong type, a bad argument) is a refusal; a lost connection
//! or a timeout writes the command again on a new connection.

use braid_broker::config::SinkConfig;
use braid_rules::Template;
use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;

use super::{Output, Written};

/// A Redis target.
pub(super) struct Redis {
    client: redis::Client,
    words: Vec<Template>,
    connection: Option<MultiplexedConnection>,
}

impl Redis {
    pub(super) fn new(config: &SinkConfig) -> Result<Redis, String> {
        let client = redis::Client::open(config.url.as_str()).map_err(|e| format!("url: {e}"))?;
        let words = config
            .command
            .split_whitespace()
            .map(|w| Template::parse(w).map_err(|e| format!("command: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Redis { client, words, connection: None })
    }

    pub(super) async fn write(&mut self, batch: &[&Output]) -> Vec<Written> {
        if self.connection.is_none() {
            match self.client.get_multiplexed_async_connection().await {
                Ok(c) => self.connection = Some(c),
                Err(e) => return batch.iter().map(|_| Written::Failed(e.to_string())).collect(),
            }
        }
        let Some(connection) = &self.connection else { return Vec::new() };
        let commands = batch.iter().map(|output| {
            let mut words = self.words.iter().map(|w| w.render(output));
            let mut command = redis::cmd(&words.next().unwrap_or_default());
            for word in words {
                command.arg(word);
            }
            let mut connection = connection.clone();
            async move {
                match command.query_async::<redis::Value>(&mut connection).await {
                    Ok(_) => Written::Sent,
                    Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                        Written::Failed(e.to_string())
                    }
                    Err(e) => Written::Refused(e.to_string()),
                }
            }
        });
        let written = join_all(commands).await;
        if written.iter().any(|w| matches!(w, Written::Failed(_))) {
            self.connection = None;
        }
        written
    }
}
