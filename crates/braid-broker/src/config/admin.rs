//! `[admin]`: the HTTP admin listener's authentication and limits.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::bad;
use super::{Config, ConfigError};

/// The HTTP admin listener (`listeners.http`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// API keys (`braid apikey add FILE NAME`): when set, every request but
    /// `GET /api/v1/health` needs one, as a bearer token or as basic auth (user: the key's
    /// name). Required when `listeners.http` is not a loopback address.
    pub api_keys_file: Option<PathBuf>,
    /// Serve HTTPS with `tls.cert` and `tls.key`.
    pub tls: bool,
    /// Largest request body accepted (a publish's payload is in it), in bytes.
    pub max_body_bytes: usize,
    /// Where packet traces started from the API are written (default: `store.data_dir`/traces).
    pub trace_dir: Option<PathBuf>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig { api_keys_file: None, tls: false, max_body_bytes: 1024 * 1024, trace_dir: None }
    }
}

/// The admin listener's checks, which read `[listeners]` and `[tls]` too.
pub(super) fn validate(config: &Config) -> Result<(), ConfigError> {
    let admin = &config.admin;
    let Some(addr) = config.listeners.http else { return Ok(()) };
    if !addr.ip().is_loopback() && admin.api_keys_file.is_none() {
        return bad(
            "listeners.http",
            &format!(
                "{addr} is not a loopback address: set admin.api_keys_file (keys made with \
                     `braid apikey add FILE NAME`) so that only holders of a key can use the API"
            ),
        );
    }
    if admin.tls && (config.tls.cert.is_none() || config.tls.key.is_none()) {
        return bad("admin.tls", "needs tls.cert and tls.key");
    }
    if admin.max_body_bytes == 0 {
        return bad("admin.max_body_bytes", "must be at least 1");
    }
    Ok(())
}
