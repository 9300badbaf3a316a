//! `[listeners]`, `[tls]` and `[quic]`: where clients connect and with which certificates.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::bad;
use super::ConfigError;
/// Network listeners.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Listeners {
    /// MQTT over TCP.
    pub tcp: SocketAddr,
    /// Seconds of silence (both ways) after which a plain-TCP connection parks: it gives up its
    /// task and buffers until bytes, a delivery or a close arrive. 0 = never.
    pub park_after_secs: u64,
    /// MQTT over TLS (off unless set; usually port 8883).
    pub tls: Option<SocketAddr>,
    /// MQTT over WebSocket (off unless set; e.g. port 8080).
    pub ws: Option<SocketAddr>,
    /// MQTT over WebSocket over TLS (off unless set; e.g. port 8084).
    pub wss: Option<SocketAddr>,
    /// The HTTP path WebSocket clients connect to.
    pub ws_path: String,
    /// MQTT over QUIC (UDP), when `quic.enabled`.
    pub quic: SocketAddr,
    /// The HTTP admin listener: Prometheus metrics, the REST API and the dashboard (see
    /// `docs/api.md`); `""` turns it off. Off loopback it needs `admin.api_keys_file`.
    #[serde(with = "optional_addr")]
    pub http: Option<SocketAddr>,
}

impl Default for Listeners {
    fn default() -> Self {
        Listeners {
            tcp: SocketAddr::from(([0, 0, 0, 0], 1883)),
            tls: None,
            ws: None,
            wss: None,
            ws_path: "/mqtt".into(),
            park_after_secs: 5,
            quic: SocketAddr::from(([0, 0, 0, 0], 14567)),
            http: Some(SocketAddr::from(([127, 0, 0, 1], 18083))),
        }
    }
}

/// An address that may be off: `""` in the file, the environment or a flag.
mod optional_addr {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(addr: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
        match addr {
            Some(a) => s.collect_str(a),
            None => s.serialize_str(""),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        match text.trim() {
            "" => Ok(None),
            t => t.parse().map(Some).map_err(|_| {
                serde::de::Error::custom(format!("{t:?} is not an IP:PORT address (\"\" turns it off)"))
            }),
        }
    }
}

/// Whether TLS clients must present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// A certificate is asked for; if one is sent it must verify against `tls.client_ca`.
    Optional,
    /// A certificate verifying against `tls.client_ca` is required.
    Require,
}

/// The lowest TLS version accepted: `"1.2"` or `"1.3"` (a bare `1.3` from a flag or the
/// environment is read as the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(try_from = "VersionText")]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    Tls13,
}

/// A TLS version as written: a string or a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum VersionText {
    Text(String),
    Number(f64),
}

impl TryFrom<VersionText> for TlsVersion {
    type Error = String;

    fn try_from(v: VersionText) -> Result<Self, String> {
        let text = match v {
            VersionText::Text(t) => t,
            VersionText::Number(n) => n.to_string(),
        };
        match text.as_str() {
            "1.2" => Ok(TlsVersion::Tls12),
            "1.3" => Ok(TlsVersion::Tls13),
            other => Err(format!("{other:?} is not a supported TLS version (\"1.2\" or \"1.3\")")),
        }
    }
}

/// Certificates for the TLS and WSS listeners (see `docs/transports.md`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// PEM CA certificates that client certificates are verified against.
    pub client_ca: Option<PathBuf>,
    /// Whether clients must present a certificate.
    pub client_auth: ClientAuth,
    /// The client certificate's CN (or first DNS/e-mail SAN) replaces the CONNECT user name.
    pub use_cn_as_username: bool,
    /// The lowest TLS version accepted.
    pub min_version: TlsVersion,
    /// Seconds between checks of the files' modification times (reload on change); 0 reloads
    /// on SIGHUP only.
    pub reload_interval_secs: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert: None,
            key: None,
            client_ca: None,
            client_auth: ClientAuth::None,
            use_cn_as_username: false,
            min_version: TlsVersion::Tls12,
            reload_interval_secs: 5,
        }
    }
}

/// MQTT over QUIC (see `docs/quic.md`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuicConfig {
    /// Listen for MQTT over QUIC on `listeners.quic`.
    pub enabled: bool,
    /// PEM certificate chain; empty: a self-signed certificate is generated at startup.
    pub cert_file: String,
    /// PEM private key of `cert_file`.
    pub key_file: String,
    /// Accept 0-RTT data from resuming clients.
    pub zero_rtt: bool,
    /// Let clients change address mid-connection (connection migration).
    pub migration: bool,
    /// Seconds without any packet after which a QUIC connection is dropped.
    pub idle_timeout_secs: u64,
    /// Pacing of what the broker sends to each QUIC client: `adaptive`, `off`, or packets per
    /// second (a number, or the number as a string: `25` and `"25"` are the same).
    #[serde(deserialize_with = "pacing_text")]
    pub pacing: String,
}

impl Default for QuicConfig {
    fn default() -> Self {
        QuicConfig {
            enabled: true,
            cert_file: String::new(),
            key_file: String::new(),
            zero_rtt: true,
            migration: true,
            idle_timeout_secs: 60,
            pacing: "adaptive".into(),
        }
    }
}

/// `quic.pacing` as text: a string as it is, a bare number (`--set quic.pacing=25`,
/// `BRAID_QUIC_PACING=25`, `pacing = 25` in the file) as its digits; `validate` checks it.
fn pacing_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = String;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("adaptive, off, or a number of packets per second")
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(Text)
}

impl Listeners {
    /// Its own checks, and that a TLS or WSS listener has `tls`'s certificate.
    pub(super) fn validate(&self, tls: &TlsConfig) -> Result<(), ConfigError> {
        if !self.ws_path.starts_with('/') {
            return bad("listeners.ws_path", "must start with /");
        }
        let tls_listener = [("listeners.tls", self.tls), ("listeners.wss", self.wss)]
            .into_iter()
            .find(|(_, addr)| addr.is_some());
        if let Some((listener, _)) = tls_listener {
            let missing = [("tls.cert", &tls.cert), ("tls.key", &tls.key)]
                .into_iter()
                .find_map(|(key, path)| path.is_none().then_some(key));
            if let Some(key) = missing {
                return bad(key, &format!("{listener} is set: tls.cert and tls.key are required"));
            }
        }
        Ok(())
    }
}

impl TlsConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.client_auth != ClientAuth::None && self.client_ca.is_none() {
            return bad("tls.client_ca", "required when tls.client_auth is optional or require");
        }
        if self.use_cn_as_username && self.client_auth == ClientAuth::None {
            return bad("tls.use_cn_as_username", "needs tls.client_auth = optional or require");
        }
        Ok(())
    }
}

impl QuicConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.cert_file.is_empty() != self.key_file.is_empty() {
            let missing = if self.cert_file.is_empty() { "quic.cert_file" } else { "quic.key_file" };
            return bad(missing, "quic.cert_file and quic.key_file go together: set both or neither");
        }
        if let Err(e) = self.pacing.parse::<braid_pacing::Pacing>() {
            return bad("quic.pacing", &e);
        }
        if self.idle_timeout_secs == 0 {
            return bad("quic.idle_timeout_secs", "must be at least 1");
        }
        Ok(())
    }
}
