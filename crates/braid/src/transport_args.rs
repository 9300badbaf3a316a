//! Transport flags shared by `braid pub`, `braid sub` and `braid bench`: TLS (mosquitto's
//! `--cafile`, `--cert`, `--key`, `--insecure`), WebSocket, QUIC, and the default port each
//! implies.

use std::path::PathBuf;

use braid_client::{Pacing, QuicOptions, TlsOptions, Transport};

/// How to reach the broker.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct TransportArgs {
    /// MQTT over TLS (implied by --cafile, --cert and --insecure); with --ws, WebSocket over TLS.
    #[arg(short = 'S', long = "tls", visible_alias = "ssl")]
    pub tls: bool,
    /// MQTT over WebSocket.
    #[arg(long)]
    pub ws: bool,
    /// HTTP path of the broker's WebSocket endpoint.
    #[arg(long, value_name = "PATH", default_value = "/mqtt")]
    pub ws_path: String,
    /// PEM CA certificates to verify the broker's certificate (default: the system's).
    #[arg(long, value_name = "FILE")]
    pub cafile: Option<PathBuf>,
    /// PEM client certificate, for brokers that ask for one (with --key).
    #[arg(long, value_name = "FILE", visible_alias = "certfile", requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, value_name = "FILE", visible_alias = "keyfile", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Do not verify the broker's certificate or name (self-signed test certificates only).
    #[arg(long)]
    pub insecure: bool,
    /// MQTT over QUIC (UDP; --cafile and --insecure apply to its certificate).
    #[arg(long, conflicts_with_all = ["ws", "tls", "cert"])]
    pub quic: bool,
    /// QUIC: pacing of the datagrams sent: adaptive (once heavy loss shows a policer), off, or
    /// a fixed number of packets per second.
    #[arg(long, value_name = "adaptive|off|PPS", default_value = "adaptive")]
    pub quic_pacing: Pacing,
}

impl TransportArgs {
    fn tls_options(&self) -> Option<TlsOptions> {
        let tls = self.tls || self.cafile.is_some() || self.cert.is_some() || self.insecure;
        tls.then(|| TlsOptions {
            ca_file: self.cafile.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            insecure: self.insecure,
            server_name: None,
        })
    }

    /// The transport these flags ask for.
    pub(crate) fn transport(&self) -> Transport {
        if self.quic {
            return Transport::Quic(QuicOptions {
                insecure: self.insecure,
                ca_file: self.cafile.clone(),
                server_name: None,
                pacing: self.quic_pacing,
            });
        }
        match (self.ws, self.tls_options()) {
            (false, None) => Transport::Tcp,
            (false, Some(tls)) => Transport::Tls(tls),
            (true, tls) => Transport::WebSocket { path: self.ws_path.clone(), tls },
        }
    }

    /// The usual port of the transport: 1883 (TCP), 8883 (TLS), 8083 (WebSocket), 8084 (WSS),
    /// 14567 (QUIC).
    pub(crate) fn default_port(&self) -> u16 {
        if self.quic {
            return 14567;
        }
        match (self.ws, self.tls_options().is_some()) {
            (false, false) => 1883,
            (false, true) => 8883,
            (true, false) => 8083,
            (true, true) => 8084,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_implies_tls_and_its_port() {
        let t = TransportArgs { cafile: Some("ca.pem".into()), ..Default::default() };
        assert!(matches!(t.transport(), Transport::Tls(TlsOptions { ca_file: Some(_), .. })));
        assert_eq!(t.default_port(), 8883);
        let t = TransportArgs { ws: true, tls: true, ws_path: "/mqtt".into(), ..Default::default() };
        assert!(matches!(t.transport(), Transport::WebSocket { tls: Some(_), .. }));
        assert_eq!(t.default_port(), 8084);
        assert_eq!(TransportArgs::default().transport(), Transport::Tcp);
    }
}
