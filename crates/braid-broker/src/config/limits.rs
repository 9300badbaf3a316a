//! `[limits]`: connection, rate, topic and memory limits.

use serde::{Deserialize, Serialize};

use super::error::bad;
use super::ConfigError;

/// Connection, rate, topic and memory limits; 0 means unlimited where noted.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Open client connections at once (0 = unlimited); more are closed when accepted.
    pub max_connections: usize,
    /// New connections accepted per second (0 = unlimited); more wait in the listen backlog.
    pub max_connection_rate: u32,
    /// PUBLISH packets per second per client (0 = unlimited); excess is slowed, not dropped.
    pub publish_rate: u32,
    /// PUBLISH bytes (topic plus payload) per second per client (0 = unlimited).
    pub publish_bytes_rate: u64,
    /// Longest topic name or filter, bytes.
    pub max_topic_length: usize,
    /// Most levels in a topic name or filter.
    pub max_topic_levels: usize,
    /// Subscriptions per client (0 = unlimited).
    pub max_subscriptions: usize,
    /// Resident memory, bytes, above which publishers are not read from (0 = off).
    pub memory_high_watermark: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_connections: 0,
            max_connection_rate: 0,
            publish_rate: 0,
            publish_bytes_rate: 0,
            max_topic_length: 65_535,
            max_topic_levels: 128,
            max_subscriptions: 0,
            memory_high_watermark: 0,
        }
    }
}

impl LimitsConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_topic_length == 0 {
            return bad("limits.max_topic_length", "must be at least 1");
        }
        if self.max_topic_levels == 0 {
            return bad("limits.max_topic_levels", "must be at least 1");
        }
        Ok(())
    }
}
