//! `[auth]` and `[acl]`: who may connect, and which topics they may use.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::bad;
use super::ConfigError;

/// Authentication: who may connect. Methods are tried in the order of `docs/security.md`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Accept clients that send neither user name nor password.
    pub allow_anonymous: bool,
    /// Password file written by `braid passwd` (none when absent).
    pub password_file: Option<PathBuf>,
    /// Seconds between checks of the password and ACL files for changes; 0 = only on SIGHUP.
    pub reload_interval_secs: u64,
    /// Key for JSON Web Tokens in the password field: the shared secret (HS256) or a PEM public
    /// key (RS256, ES256). JWT is off when absent.
    pub jwt_key_file: Option<PathBuf>,
    /// `HS256`, `RS256` or `ES256`.
    pub jwt_algorithm: String,
    /// The claim that carries the client's ACL (absent claim: the ACL rules file applies).
    pub jwt_acl_claim: String,
    /// `http://host:port/path` asked (POST JSON) about credentials no other method knows.
    pub http_url: Option<String>,
    /// Milliseconds the HTTP hook may take; a slower answer denies.
    pub http_timeout_ms: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            allow_anonymous: true,
            password_file: None,
            reload_interval_secs: 2,
            jwt_key_file: None,
            jwt_algorithm: "HS256".into(),
            jwt_acl_claim: "acl".into(),
            http_url: None,
            http_timeout_ms: 2000,
        }
    }
}

/// What applies when no ACL rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AclPolicy {
    /// Allow.
    Allow,
    /// Deny.
    #[default]
    Deny,
}

/// What a denied PUBLISH from an MQTT 3.1.x client does (v5 clients get reason 0x87).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeniedPublish {
    /// Acknowledge (QoS 1/2) and drop it; counted.
    #[default]
    Drop,
    /// Close the connection.
    Disconnect,
}

/// Topic authorization.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AclConfig {
    /// The rules file (no file: every topic is allowed except publishing under `$SYS`).
    pub file: Option<PathBuf>,
    /// Policy when no rule matches.
    pub default_policy: AclPolicy,
    /// What a denied PUBLISH from a 3.1.x client does.
    pub v3_denied_publish: DeniedPublish,
}

impl AuthConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !["HS256", "RS256", "ES256"].contains(&self.jwt_algorithm.as_str()) {
            return bad("auth.jwt_algorithm", "must be HS256, RS256 or ES256");
        }
        if self.http_timeout_ms == 0 {
            return bad("auth.http_timeout_ms", "must be at least 1");
        }
        Ok(())
    }
}
