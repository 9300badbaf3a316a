//! `[runtime]` and `[log]`: the threads that run connections, and logging.

use serde::{Deserialize, Serialize};

/// The threads that run connections.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Worker threads; 0 = one per CPU core but one, at least one (see
    /// [`RuntimeConfig::workers`]).
    pub worker_threads: usize,
}

impl RuntimeConfig {
    /// The worker threads to start on a machine with `cores` cores. The automatic choice
    /// leaves a core to the kernel's network processing and the broker's helper threads: on 2
    /// cores, one worker used less CPU per message than two and answered sooner at low load in
    /// every case measured, since no message crosses threads (docs/architecture.md, "Threads").
    pub fn workers(&self, cores: usize) -> usize {
        match self.worker_threads {
            0 => cores.saturating_sub(1).max(1),
            n => n,
        }
    }
}

/// Logging.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter such as `info` or `braid_broker=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".into() }
    }
}
