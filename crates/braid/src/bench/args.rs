//! `braid bench conn|sub|pub` flags, emqtt_bench-compatible where that makes sense. `-h` is the
//! host, as in emqtt_bench, so help is `--help` only.

use std::path::PathBuf;

use clap::{ArgAction, Args, Subcommand};

use crate::transport_args::TransportArgs;

/// `braid bench ...`
#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// What to run.
    #[command(subcommand)]
    pub command: Box<BenchCommand>,
}

/// The three load shapes.
#[derive(Subcommand, Debug)]
pub(crate) enum BenchCommand {
    /// Open -c connections and hold them idle (connect rate, broker footprint).
    #[command(disable_help_flag = true)]
    Conn(ConnArgs),
    /// -c subscribers on -t: receive rate, end-to-end latency, lost/duplicated/out-of-order.
    #[command(disable_help_flag = true)]
    Sub(SubArgs),
    /// -c publishers on -t (optionally with --sub N subscribers in the same process).
    #[command(disable_help_flag = true)]
    Pub(PubArgs),
}

/// Connection flags shared by every mode.
#[derive(Args, Debug, Clone)]
pub(crate) struct CommonArgs {
    /// Print help.
    #[arg(long, action = ArgAction::Help)]
    pub help: Option<bool>,
    /// Broker host name or IP address.
    #[arg(short = 'h', long, default_value = "127.0.0.1")]
    pub host: String,
    /// Broker port. Default 1883; 8883 with TLS, 8083 with --ws, 8084 with both.
    #[arg(short = 'p', long)]
    pub port: Option<u16>,
    #[command(flatten)]
    pub transport: TransportArgs,
    /// MQTT version: 3 (3.1), 4 (3.1.1) or 5.
    #[arg(short = 'V', long = "version", default_value_t = 5, value_parser = clap::value_parser!(u8).range(3..=5))]
    pub version: u8,
    /// Number of clients.
    #[arg(short = 'c', long = "count", default_value_t = 200)]
    pub count: u32,
    /// First client sequence number (%i).
    #[arg(short = 'n', long = "startnumber", default_value_t = 0)]
    pub start_number: u32,
    /// Milliseconds between two connects (0: as fast as --max-connecting allows).
    #[arg(short = 'i', long = "interval", default_value_t = 10)]
    pub interval_ms: u64,
    /// Connects in progress at once.
    #[arg(long, default_value_t = 100)]
    pub max_connecting: usize,
    /// Username.
    #[arg(short = 'u', long)]
    pub username: Option<String>,
    /// Password.
    #[arg(short = 'P', long)]
    pub password: Option<String>,
    /// Keep alive in seconds.
    #[arg(short = 'k', long = "keepalive", default_value_t = 300)]
    pub keepalive: u16,
    /// Clean start: true or false.
    #[arg(short = 'C', long = "clean", default_value_t = true, action = ArgAction::Set)]
    pub clean: bool,
    /// Session Expiry Interval in seconds (v5).
    #[arg(short = 'x', long = "session-expiry")]
    pub session_expiry: Option<u32>,
    /// Client id prefix: ids are PREFIX_bench_{conn,sub,pub}_N.
    #[arg(long, default_value = "braid")]
    pub prefix: String,
    /// Seconds to run once connected (pub: publishing; sub: receiving; conn: holding); 0 = no limit.
    #[arg(long, default_value_t = 0.0)]
    pub duration: f64,
    /// Print the final summary as JSON on stdout (per-second lines go to stderr).
    #[arg(long)]
    pub json: bool,
    /// No per-second lines.
    #[arg(long)]
    pub quiet: bool,
    /// Tokio worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

impl CommonArgs {
    /// The protocol `-V` names.
    pub(crate) fn protocol(&self) -> braid_proto::ProtocolVersion {
        match self.version {
            3 => braid_proto::ProtocolVersion::V3_1,
            4 => braid_proto::ProtocolVersion::V3_1_1,
            _ => braid_proto::ProtocolVersion::V5,
        }
    }
}

/// `braid bench conn`. Over plain TCP each client is a small task on a raw socket (about 1 KB
/// of this process's memory); TLS, WebSocket, QUIC and --full-client go through braid-client
/// (about 26 KB each) and support none of -t, -I, --ifaddr and --storm-after.
#[derive(Args, Debug)]
pub(crate) struct ConnArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Topic filter each client subscribes to at QoS 0 (repeatable; %i client sequence, %c
    /// client id, %u username). Messages on filters without a variable count as broadcast.
    #[arg(short = 't', long = "topic")]
    pub topics: Vec<String>,
    /// Milliseconds between two stamped QoS 0 publishes of each client to its first -t topic
    /// (0: none).
    #[arg(short = 'I', long = "interval_of_msg", alias = "interval-of-msg", default_value_t = 0)]
    pub interval_of_msg: u64,
    /// Payload size of those publishes (>= 18 B carries a ns timestamp).
    #[arg(short = 's', long = "size", default_value_t = 18)]
    pub size: usize,
    /// Local addresses to connect from, client N from the (N mod count)-th (e.g.
    /// 127.0.0.1,127.0.0.2): each one has its own ephemeral ports.
    #[arg(long, value_delimiter = ',')]
    pub ifaddr: Vec<std::net::IpAddr>,
    /// Reconnect storm this many seconds after every client connected: all drop their
    /// connection at once and reconnect (SIGUSR1 starts one at any time as well).
    #[arg(long)]
    pub storm_after: Option<f64>,
    /// Use braid-client for every connection, as over TLS, WebSocket and QUIC.
    #[arg(long)]
    pub full_client: bool,
}

/// `braid bench sub`
#[derive(Args, Debug)]
pub(crate) struct SubArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Topic filter to subscribe to (repeatable; %i client sequence, %c client id, %u username).
    #[arg(short = 't', long = "topic", required = true)]
    pub topics: Vec<String>,
    /// Subscription QoS.
    #[arg(short = 'q', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub qos: u8,
    /// Receive Maximum the subscribers announce (v5): unacknowledged QoS 1/2 deliveries at once.
    #[arg(long, default_value_t = 65535, value_parser = clap::value_parser!(u16).range(1..))]
    pub receive_maximum: u16,
    /// Stop after receiving this many messages in total (0: no limit).
    #[arg(short = 'L', long = "limit", default_value_t = 0)]
    pub limit: u64,
    /// Stop when no message arrived for this many seconds after the first one (0: never).
    #[arg(long, default_value_t = 0.0)]
    pub idle_timeout: f64,
    /// QUIC: subscribe each -t filter on a data stream of its own, sending at this priority
    /// (repeatable, one per -t, in order). Counts and latency are the first filter's; the other
    /// streams' messages are received, acknowledged and counted apart.
    #[arg(long = "stream-priority", allow_negative_numbers = true)]
    pub stream_priorities: Vec<i32>,
}

/// `braid bench pub`
#[derive(Args, Debug)]
pub(crate) struct PubArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Topic to publish to (%i client sequence, %c client id, %u username).
    #[arg(short = 't', long = "topic", required_unless_present = "topics_payload")]
    pub topic: Option<String>,
    /// Milliseconds between two publishes of one client (0: as fast as possible).
    #[arg(short = 'I', long = "interval_of_msg", alias = "interval-of-msg", default_value_t = 1000)]
    pub interval_of_msg: u64,
    /// Payload size in bytes (>= 10 carries a timestamp and sequence; >= 18 with ns resolution).
    #[arg(short = 's', long = "size", default_value_t = 256)]
    pub size: usize,
    /// Publish QoS.
    #[arg(short = 'q', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub qos: u8,
    /// Retain flag.
    #[arg(short = 'r', long, default_value_t = false, action = ArgAction::Set)]
    pub retain: bool,
    /// Messages to publish in total over all clients (0: unlimited).
    #[arg(short = 'L', long = "limit", default_value_t = 0)]
    pub limit: u64,
    /// Unacknowledged QoS 1/2 publishes per client, per topic with --topics-payload (0: 65535).
    /// Capped by the broker's Receive Maximum.
    #[arg(short = 'F', long = "inflight", default_value_t = 1)]
    pub inflight: u32,
    /// emqtt_bench topic spec (JSON) instead of -t/-s/-q/-I.
    #[arg(long = "topics-payload")]
    pub topics_payload: Option<PathBuf>,
    /// Also run N subscribers in this process, on --sub-topic, for end-to-end figures.
    #[arg(long = "sub", default_value_t = 0)]
    pub sub: u32,
    /// Filter for --sub (default: -t with each level holding %i, %c or %u replaced by +).
    #[arg(long)]
    pub sub_topic: Option<String>,
    /// QoS of the --sub subscriptions (default: -q).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub sub_qos: Option<u8>,
    /// Receive Maximum the --sub subscribers announce (v5).
    #[arg(long, default_value_t = 65535, value_parser = clap::value_parser!(u16).range(1..))]
    pub receive_maximum: u16,
    /// After publishing ends, wait up to this many seconds without progress for the --sub
    /// subscribers to receive everything.
    #[arg(long, default_value_t = 5.0)]
    pub drain_timeout: f64,
}

/// The default --sub filter for a publish topic template: every level that holds a variable
/// becomes `+`.
pub(crate) fn default_sub_filter(topic: &str) -> String {
    topic
        .split('/')
        .map(|level| if super::spec::has_client_variable(level) { "+" } else { level })
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Top {
        #[command(subcommand)]
        bench: BenchCommand,
    }

    fn parse(args: &[&str]) -> Result<BenchCommand, clap::Error> {
        Top::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|t| t.bench)
    }

    #[test]
    fn emqtt_bench_style_pub_flags() {
        let cmd = parse(&[
            "pub",
            "-h",
            "10.0.0.1",
            "-p",
            "1884",
            "-c",
            "1000",
            "-i",
            "0",
            "-I",
            "5",
            "-q",
            "2",
            "-s",
            "1024",
            "-t",
            "bench/%i",
            "-L",
            "1000000",
            "-F",
            "100",
            "-k",
            "30",
            "-C",
            "false",
            "-x",
            "60",
            "-V",
            "4",
            "--prefix",
            "x",
            "-u",
            "user",
            "-P",
            "pw",
            "--sub",
            "1",
            "--duration",
            "2.5",
            "--json",
        ])
        .unwrap();
        let BenchCommand::Pub(p) = cmd else { panic!("pub") };
        let c = &p.common;
        assert_eq!((c.host.as_str(), c.port, c.count, c.interval_ms), ("10.0.0.1", Some(1884), 1000, 0));
        assert_eq!((c.keepalive, c.clean, c.session_expiry, c.version), (30, false, Some(60), 4));
        assert_eq!(
            (c.prefix.as_str(), c.username.as_deref(), c.password.as_deref()),
            ("x", Some("user"), Some("pw"))
        );
        assert!(c.json);
        assert_eq!(c.duration, 2.5);
        assert_eq!(
            (p.interval_of_msg, p.qos, p.size, p.limit, p.inflight, p.sub),
            (5, 2, 1024, 1_000_000, 100, 1)
        );
        assert_eq!(p.topic.as_deref(), Some("bench/%i"));
    }

    #[test]
    fn defaults_follow_emqtt_bench() {
        let BenchCommand::Pub(p) = parse(&["pub", "-t", "t"]).unwrap() else { panic!() };
        assert_eq!(
            (p.common.count, p.common.interval_ms, p.interval_of_msg, p.size, p.qos, p.inflight),
            (200, 10, 1000, 256, 0, 1)
        );
        assert!(p.common.clean);
        assert_eq!(p.common.version, 5);
        let BenchCommand::Sub(s) =
            parse(&["sub", "-t", "a/#", "-t", "b", "-q", "1", "--receive-maximum", "10"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(s.topics, ["a/#", "b"]);
        assert_eq!((s.qos, s.receive_maximum), (1, 10));
        assert!(matches!(parse(&["conn", "-c", "10000"]).unwrap(), BenchCommand::Conn(_)));
    }

    #[test]
    fn rejects_bad_values() {
        assert!(parse(&["pub"]).is_err(), "-t or --topics-payload is required");
        assert!(parse(&["pub", "--topics-payload", "spec.json"]).is_ok());
        assert!(parse(&["pub", "-t", "t", "-q", "3"]).is_err());
        assert!(parse(&["pub", "-t", "t", "-V", "6"]).is_err());
        assert!(parse(&["sub"]).is_err());
        assert!(parse(&["sub", "-t", "t", "--receive-maximum", "0"]).is_err());
        assert!(parse(&["pub", "-t", "t", "-C", "maybe"]).is_err());
        let help = parse(&["pub", "--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
    }

    #[test]
    fn sub_filter_from_topic_template() {
        assert_eq!(default_sub_filter("bench/%i"), "bench/+");
        assert_eq!(default_sub_filter("a/c-%c/x/%i-y"), "a/+/x/+");
        assert_eq!(default_sub_filter("fixed/topic"), "fixed/topic");
    }
}
