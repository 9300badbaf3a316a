//! `[store]`: where sessions, queues and retained messages are kept.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::bad;
use super::ConfigError;

/// Where sessions, queues and retained messages are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreBackend {
    /// In an append-only log under `data_dir`, reloaded at restart.
    Disk,
    /// In memory only: fastest, lost at restart.
    Memory,
}

/// When an acknowledged message is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// PUBACK/PUBREC only after the message is fsynced (group commit).
    Sync,
    /// Acknowledge at once; fsync every `flush_interval_ms`.
    Async,
}

/// Persistence settings (see `docs/persistence.md`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Disk (default) or memory.
    pub backend: StoreBackend,
    /// Directory of the disk store, created if missing.
    pub data_dir: PathBuf,
    /// Sync (acknowledge after fsync) or async (fsync every `flush_interval_ms`).
    pub durability: Durability,
    /// Async durability: longest time between two fsyncs, in milliseconds.
    pub flush_interval_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: StoreBackend::Disk,
            data_dir: "braid-data".into(),
            durability: Durability::Sync,
            flush_interval_ms: 100,
        }
    }
}

impl StoreConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.flush_interval_ms == 0 {
            return bad("store.flush_interval_ms", "must be at least 1");
        }
        if self.data_dir.as_os_str().is_empty() {
            return bad("store.data_dir", "must not be empty");
        }
        Ok(())
    }
}
