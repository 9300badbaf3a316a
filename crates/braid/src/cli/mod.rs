//! `braid pub` and `braid sub`: everyday command-line clients with mosquitto_pub /
//! mosquitto_sub flags, built on braid-client. This module holds what both share: connection
//! flags, v5 properties (`-D`, `--user-property`), parsing helpers and exit codes.

pub(crate) mod apikey;
pub(crate) mod ctl;
pub(crate) mod passwd;
pub(crate) mod publish;
pub(crate) mod subscribe;

use std::hash::{BuildHasher, Hasher};
use std::process::ExitCode;

use clap::ArgAction;
use tracing_subscriber::EnvFilter;

use crate::transport_args::TransportArgs;
use braid_client::{
    Bytes, ClientOptions, Error, Properties, ProtocolVersion, QoS, ReasonCode, RetainHandling, Will,
};

/// Exit status for connection, refusal and protocol errors.
pub(crate) const EXIT_ERROR: u8 = 1;
/// Exit status when `-W` expires (mosquitto's MOSQ_ERR_TIMEOUT).
pub(crate) const EXIT_TIMEOUT: u8 = 27;

/// Flags shared by `braid pub` and `braid sub` (mosquitto's names; `-h` is the host, so help
/// is `--help` only).
#[derive(clap::Args, Debug)]
pub(crate) struct ConnArgs {
    /// Broker host.
    #[arg(short = 'h', long = "host", default_value = "localhost")]
    pub host: String,
    /// Broker port. Default 1883; 8883 with TLS, 8083 with --ws, 8084 with both.
    #[arg(short = 'p', long = "port")]
    pub port: Option<u16>,
    #[command(flatten)]
    pub transport: TransportArgs,
    /// MQTT version: 31, 311 or 5 (also mqttv31, mqttv311, mqttv5). Defaults to 311, or 5
    /// when -D / --user-property is given.
    #[arg(short = 'V', long = "protocol-version", value_name = "VERSION", value_parser = parse_version)]
    pub version: Option<ProtocolVersion>,
    /// Client id. Defaults to braid-pub-/braid-sub- and a random suffix.
    #[arg(short = 'i', long = "id")]
    pub id: Option<String>,
    /// Disable clean session: a persistent session (needs -i). With v5 the session never
    /// expires unless -x says otherwise.
    #[arg(short = 'c', long = "disable-clean-session")]
    pub persistent: bool,
    /// Keep alive in seconds (0 = off).
    #[arg(short = 'k', long = "keepalive", default_value_t = 60)]
    pub keepalive: u16,
    /// User name.
    #[arg(short = 'u', long = "username")]
    pub username: Option<String>,
    /// Password.
    #[arg(short = 'P', long = "pw")]
    pub password: Option<String>,
    /// v5 Session Expiry Interval in seconds; -1, inf or ∞ for never.
    #[arg(short = 'x', long = "session-expiry", value_name = "SECS", value_parser = parse_expiry, allow_hyphen_values = true)]
    pub session_expiry: Option<u32>,
    /// A v5 user property KEY=VALUE on the PUBLISH (pub) or SUBSCRIBE (sub); repeatable.
    #[arg(long = "user-property", value_name = "KEY=VALUE", value_parser = parse_user_property)]
    pub user_properties: Vec<(String, String)>,
    /// A v5 property, mosquitto style: -D COMMAND IDENTIFIER VALUE, e.g. `-D publish
    /// message-expiry-interval 30` or `-D connect user-property key value`. COMMAND is
    /// connect, publish, subscribe or will. Repeatable.
    #[arg(short = 'D', long = "property", num_args = 3..=4, value_names = ["COMMAND", "IDENTIFIER", "VALUE"])]
    pub property: Vec<String>,
    /// Topic of the will message.
    #[arg(long = "will-topic")]
    pub will_topic: Option<String>,
    /// Payload of the will message (empty if not given).
    #[arg(long = "will-payload", requires = "will_topic")]
    pub will_payload: Option<String>,
    /// QoS of the will message.
    #[arg(long = "will-qos", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub will_qos: u8,
    /// Retain the will message.
    #[arg(long = "will-retain", requires = "will_topic")]
    pub will_retain: bool,
    /// Print debug messages (connection events) on stderr.
    #[arg(short = 'd', long = "debug")]
    pub debug: bool,
    /// Print help.
    #[arg(long = "help", action = ArgAction::Help)]
    pub help: Option<bool>,
}

/// v5 properties collected from -D and --user-property, by the packet they belong to.
#[derive(Debug, Default)]
pub(crate) struct V5Properties {
    pub connect: Properties,
    pub publish: Properties,
    pub subscribe: Properties,
    pub will: Properties,
}

impl ConnArgs {
    /// The protocol version: -V, or v5 if v5 properties were given, else 3.1.1.
    pub(crate) fn version(&self) -> ProtocolVersion {
        match self.version {
            Some(v) => v,
            None if !self.property.is_empty() || !self.user_properties.is_empty() => ProtocolVersion::V5,
            None => ProtocolVersion::V3_1_1,
        }
    }

    /// -D and --user-property, `user_properties_to` naming the packet --user-property goes on.
    pub(crate) fn v5_properties(&self, user_properties_to: &str) -> Result<V5Properties, String> {
        let mut p = V5Properties::default();
        if (!self.property.is_empty() || !self.user_properties.is_empty()) && !self.version().is_v5() {
            return Err("properties (-D, --user-property) need MQTT v5 (-V 5)".into());
        }
        for d in group_properties(&self.property)? {
            let (command, rest) = d.split_first().ok_or("-D needs COMMAND IDENTIFIER VALUE")?;
            let target = match command.as_str() {
                "connect" => &mut p.connect,
                "publish" => &mut p.publish,
                "subscribe" => &mut p.subscribe,
                "will" => &mut p.will,
                other => return Err(format!("-D {other}: properties of this packet are not supported")),
            };
            set_property(target, rest).map_err(|e| format!("-D {}: {e}", d.join(" ")))?;
        }
        let target = if user_properties_to == "publish" { &mut p.publish } else { &mut p.subscribe };
        for (k, v) in &self.user_properties {
            target.user_properties.push((k.as_str().into(), v.as_str().into()));
        }
        Ok(p)
    }

    /// Client options for these flags; `prefix` names the default client id.
    pub(crate) fn options(&self, prefix: &str, props: &V5Properties) -> Result<ClientOptions, String> {
        let version = self.version();
        if self.persistent && self.id.is_none() {
            return Err("you must provide a client id (-i) if you are using -c".into());
        }
        if self.session_expiry.is_some() && !version.is_v5() {
            return Err("-x (session expiry) needs MQTT v5 (-V 5)".into());
        }
        let mut o = ClientOptions::new(self.host.clone(), self.port.unwrap_or(self.transport.default_port()));
        o.transport = self.transport.transport();
        o.version = version;
        o.client_id = self.id.clone().unwrap_or_else(|| format!("{prefix}-{:08x}", random_u64() as u32));
        o.clean_start = !self.persistent;
        o.keep_alive = self.keepalive;
        o.username = self.username.clone();
        o.password = self.password.clone().map(Bytes::from);
        o.session_expiry = match (self.session_expiry, self.persistent && version.is_v5()) {
            (Some(x), _) => Some(x),
            // As mosquitto: -c means the session does not expire.
            (None, true) => Some(u32::MAX),
            (None, false) => None,
        };
        o.connect_properties = props.connect.clone();
        if let Some(topic) = &self.will_topic {
            o.will = Some(Will {
                topic: topic.clone(),
                payload: self.will_payload.clone().map(Bytes::from).unwrap_or_default(),
                qos: qos(self.will_qos),
                retain: self.will_retain,
                properties: props.will.clone(),
            });
        }
        Ok(o)
    }

    /// Logs to stderr: warnings, or debug with -d.
    pub(crate) fn init_logging(&self) {
        let level = if self.debug { "braid_client=debug,braid=debug" } else { "warn" };
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(level))
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .try_init();
    }
}

/// Splits the values of every -D back into `COMMAND IDENTIFIER VALUE [VALUE]` groups: clap
/// hands them over as one list, and only `user-property` takes two values.
fn group_properties(flat: &[String]) -> Result<Vec<&[String]>, String> {
    let mut groups = Vec::new();
    let mut rest = flat;
    while !rest.is_empty() {
        let n = if rest.get(1).is_some_and(|i| i == "user-property") { 4 } else { 3 };
        if rest.len() < n {
            return Err(format!("-D {}: expected COMMAND IDENTIFIER VALUE", rest.join(" ")));
        }
        let (group, tail) = rest.split_at(n);
        groups.push(group);
        rest = tail;
    }
    Ok(groups)
}

/// Sets one property from `IDENTIFIER VALUE [VALUE]`.
fn set_property(p: &mut Properties, args: &[String]) -> Result<(), String> {
    let (ident, values) = args.split_first().ok_or("missing identifier")?;
    let one = || -> Result<&str, String> {
        match values {
            [v] => Ok(v.as_str()),
            _ => Err(format!("{ident} takes one value")),
        }
    };
    let num =
        |v: &str| -> Result<u32, String> { v.parse().map_err(|_| format!("{ident}: {v:?} is not a number")) };
    let small = |v: &str| -> Result<u16, String> {
        v.parse().map_err(|_| format!("{ident}: {v:?} is not a number up to 65535"))
    };
    let byte =
        |v: &str| -> Result<u8, String> { v.parse().map_err(|_| format!("{ident}: {v:?} is not 0 or 1")) };
    match ident.as_str() {
        "user-property" => match values {
            [k, v] => p.user_properties.push((k.as_str().into(), v.as_str().into())),
            _ => return Err("user-property takes a key and a value".into()),
        },
        "content-type" => p.content_type = Some(one()?.into()),
        "correlation-data" => p.correlation_data = Some(Bytes::from(one()?.to_owned())),
        "response-topic" => p.response_topic = Some(one()?.into()),
        "payload-format-indicator" => p.payload_format_indicator = Some(byte(one()?)?),
        "message-expiry-interval" => p.message_expiry_interval = Some(num(one()?)?),
        "session-expiry-interval" => p.session_expiry_interval = Some(parse_expiry(one()?)?),
        "will-delay-interval" => p.will_delay_interval = Some(num(one()?)?),
        "receive-maximum" => p.receive_maximum = Some(small(one()?)?),
        "maximum-packet-size" => p.maximum_packet_size = Some(num(one()?)?),
        "topic-alias-maximum" => p.topic_alias_maximum = Some(small(one()?)?),
        "request-problem-information" => p.request_problem_information = Some(byte(one()?)?),
        "request-response-information" => p.request_response_information = Some(byte(one()?)?),
        "subscription-identifier" => p.subscription_identifiers.push(num(one()?)?),
        other => return Err(format!("unknown or unsupported property {other:?}")),
    }
    Ok(())
}

/// QoS from a validated 0..=2.
pub(crate) fn qos(q: u8) -> QoS {
    QoS::from_u8(q).unwrap_or(QoS::AtMostOnce)
}

fn parse_version(s: &str) -> Result<ProtocolVersion, String> {
    match s.to_ascii_lowercase().as_str() {
        "31" | "3.1" | "mqttv31" | "3" => Ok(ProtocolVersion::V3_1),
        "311" | "3.1.1" | "mqttv311" | "4" => Ok(ProtocolVersion::V3_1_1),
        "5" | "5.0" | "mqttv5" | "mqttv50" => Ok(ProtocolVersion::V5),
        _ => Err("expected 31, 311 or 5 (or mqttv31, mqttv311, mqttv5)".into()),
    }
}

fn parse_expiry(s: &str) -> Result<u32, String> {
    match s {
        "-1" | "inf" | "infinity" | "∞" => Ok(u32::MAX),
        _ => s.parse().map_err(|_| format!("{s:?} is not 0..4294967295 or -1")),
    }
}

fn parse_user_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// Retain Handling from 0/1/2 or a name.
pub(crate) fn parse_retain_handling(s: &str) -> Result<RetainHandling, String> {
    match s.to_ascii_lowercase().as_str() {
        "0" | "send" | "send-at-subscribe" | "always" => Ok(RetainHandling::SendAtSubscribe),
        "1" | "send-if-new" | "new" => Ok(RetainHandling::SendIfNew),
        "2" | "never" | "do-not-send" => Ok(RetainHandling::DoNotSend),
        _ => Err("expected 0 (send), 1 (send-if-new) or 2 (never)".into()),
    }
}

/// A pseudo-random number from the std hasher's random keys (no extra dependency).
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// "Not authorized (0x87)".
pub(crate) fn reason(r: ReasonCode) -> String {
    format!("{} (0x{:02X})", r.description(), r as u8)
}

/// An error message for a failed connect, naming the broker.
pub(crate) fn connect_error(o: &ClientOptions, e: &Error) -> String {
    match e {
        Error::Refused(r) => format!("connection refused by {}:{}: {}", o.host, o.port, reason(*r)),
        Error::Timeout => format!("no CONNACK from {}:{} within {:?}", o.host, o.port, o.connect_timeout),
        other => format!("cannot connect to {}:{}: {other}", o.host, o.port),
    }
}

/// Prints `braid <cmd>: <msg>` and returns the error exit code.
pub(crate) fn fail(cmd: &str, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("braid {cmd}: {msg}");
    ExitCode::from(EXIT_ERROR)
}

/// A single-threaded runtime for the CLI clients.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}
