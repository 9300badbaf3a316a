//! The bridge's side on the remote broker: the braid-client options its configuration makes,
//! and over QUIC the data streams of its `topic` lines.

use std::path::PathBuf;
use std::time::Duration;

use tracing::info;

use braid_client::{
    Bytes, Client, ClientOptions, ProtocolVersion, QuicOptions, Reconnect, TlsOptions, Transport,
};

use super::Bridge;

/// The first pause before connecting again; it doubles up to `restart_timeout_secs`.
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(250);

/// The protocol version a `protocol_version` value names.
pub(super) fn version(name: &str) -> Option<ProtocolVersion> {
    match name {
        "mqttv5" | "mqttv50" => Some(ProtocolVersion::V5),
        "mqttv311" => Some(ProtocolVersion::V3_1_1),
        "mqttv31" => Some(ProtocolVersion::V3_1),
        _ => None,
    }
}

/// `host:port`, `[v6]:port`, or a host alone (then `default_port`).
pub(super) fn host_port(address: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = match address.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']')?;
            match after {
                "" => (host, None),
                _ => (host, Some(after.strip_prefix(':')?)),
            }
        }
        None => match address.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => return None,
            Some((host, port)) => (host, Some(port)),
            None => (address, None),
        },
    };
    let port = match port {
        Some(p) => p.parse().ok().filter(|p| *p > 0)?,
        None => default_port,
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// The usual port of a transport.
fn default_port(transport: &str) -> u16 {
    match transport {
        "tls" => 8883,
        "ws" => 80,
        "wss" => 443,
        "quic" => 14567,
        _ => 1883,
    }
}

/// True if the bridge speaks QUIC to the remote (one connection per session, no reconnect of
/// its own: see `session`).
pub(super) fn is_quic(b: &Bridge) -> bool {
    b.config.transport == "quic"
}

/// The connection's options: a persistent session on the remote unless `clean_start`, the
/// bridge's window each way, and (except over QUIC) braid-client's reconnect, resuming the
/// session and resending what the remote did not acknowledge.
pub(super) fn options(b: &Bridge, window: u16) -> ClientOptions {
    let c = &b.config;
    // Checked when the configuration loaded.
    let (host, port) = host_port(&c.address, default_port(&c.transport)).unwrap_or_default();
    let file = |f: &str| (!f.is_empty()).then(|| PathBuf::from(f));
    let tls = TlsOptions {
        ca_file: file(&c.ca_file),
        cert: file(&c.cert_file),
        key: file(&c.key_file),
        insecure: c.insecure,
        server_name: None,
    };
    let mut opts = ClientOptions::new(host, port);
    opts.transport = match c.transport.as_str() {
        "tls" => Transport::Tls(tls),
        "ws" => Transport::WebSocket { path: c.ws_path.clone(), tls: None },
        "wss" => Transport::WebSocket { path: c.ws_path.clone(), tls: Some(tls) },
        "quic" => Transport::Quic(QuicOptions {
            insecure: c.insecure,
            ca_file: file(&c.ca_file),
            ..Default::default()
        }),
        _ => Transport::Tcp,
    };
    opts.version = version(&c.protocol_version).unwrap_or(ProtocolVersion::V5);
    opts.client_id = b.remote_id.clone();
    opts.clean_start = c.clean_start;
    opts.keep_alive = c.keep_alive;
    if opts.version.is_v5() && !c.clean_start {
        // Mosquitto's cleansession false: the session outlives the connection.
        opts.session_expiry = Some(u32::MAX);
    }
    if !c.username.is_empty() {
        opts.username = Some(c.username.clone());
        opts.password = (!c.password.is_empty()).then(|| Bytes::from(c.password.clone().into_bytes()));
    }
    opts.receive_maximum = window;
    opts.max_inflight = window;
    if !is_quic(b) {
        opts.reconnect = Some(Reconnect {
            initial_delay: FIRST_BACKOFF,
            max_delay: Duration::from_secs(c.restart_timeout_secs),
        });
    }
    opts
}

/// The remote side of one connection: the connection's own client and, over QUIC, a data
/// stream for each `topic` line (by the line's position).
#[derive(Clone)]
pub(super) struct Remote {
    pub main: Client,
    pub streams: Vec<Option<Client>>,
}

impl Remote {
    /// Over QUIC, opens a data stream per line at the priority of its pattern (default 0).
    pub(super) async fn open(b: &Bridge, main: Client) -> Result<Remote, braid_client::Error> {
        let mut streams = Vec::new();
        if is_quic(b) {
            for line in &b.lines {
                let priority = b.config.priorities.get(&line.pattern).copied().unwrap_or(0);
                let stream = main.open_stream(priority).await?;
                info!(bridge = %b.config.name, pattern = %line.pattern, priority, stream = stream.stream_id().unwrap_or_default(), "mqtt bridge: QUIC data stream opened for a topic line");
                streams.push(Some(stream));
            }
        }
        Ok(Remote { main, streams })
    }

    /// The client that carries line `i`'s messages: its stream over QUIC, else the connection.
    pub(super) fn for_line(&self, i: usize) -> &Client {
        self.streams.get(i).and_then(Option::as_ref).unwrap_or(&self.main)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(host_port("10.0.0.9:1884", 1883), Some(("10.0.0.9".into(), 1884)));
        assert_eq!(host_port("broker.example", 8883), Some(("broker.example".into(), 8883)));
        assert_eq!(host_port("[::1]:1999", 1883), Some(("::1".into(), 1999)));
        assert_eq!(host_port("[::1]", 1883), Some(("::1".into(), 1883)));
        for bad in ["", ":1883", "host:", "host:x", "host:0", "::1:1883", "[::1]x", "host:70000"] {
            assert_eq!(host_port(bad, 1883), None, "{bad}");
        }
    }
}
