//! `braid sub`: subscribe and print what arrives, like mosquitto_sub.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};

use braid_client::{
    Client, Event, Properties, Publish, ReasonCode, Reconnect, RetainHandling, SubscriptionOptions,
};
use braid_proto::topic::valid_topic_filter;

use super::{connect_error, fail, parse_retain_handling, qos, reason, runtime, ConnArgs, EXIT_TIMEOUT};

/// Subscribe and print messages, like mosquitto_sub.
#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub(crate) struct SubArgs {
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Topic filter to subscribe to; repeatable.
    #[arg(short = 't', long = "topic", required = true)]
    pub topics: Vec<String>,
    /// QoS of the subscriptions.
    #[arg(short = 'q', long = "qos", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub qos: u8,
    /// Exit after receiving this many messages.
    #[arg(short = 'C', value_name = "COUNT", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Print the topic before the payload: `topic payload`.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// Print the v5 properties of each message, one `  name: value` line each, after it.
    #[arg(long = "verbose-properties")]
    pub verbose_properties: bool,
    /// Do not add an end of line after the payload.
    #[arg(short = 'N')]
    pub no_eol: bool,
    /// Do not print stale (retained) messages; also asks the server not to send them.
    #[arg(short = 'R')]
    pub no_retained: bool,
    /// Exit with status 27 if this many seconds pass before -C messages arrived (or at all).
    #[arg(short = 'W', value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: Option<u64>,
    /// Exit once the subscriptions are acknowledged.
    #[arg(short = 'E')]
    pub exit_after_subscribe: bool,
    /// v5 No Local: do not receive messages this client publishes.
    #[arg(long = "no-local")]
    pub no_local: bool,
    /// v5 Retain As Published: keep the retain flag of live messages.
    #[arg(long = "retain-as-published")]
    pub retain_as_published: bool,
    /// v5 Retain Handling: 0 send retained messages at subscribe, 1 only if the subscription
    /// is new, 2 never.
    #[arg(long = "retain-handling", value_name = "0|1|2", value_parser = parse_retain_handling)]
    pub retain_handling: Option<RetainHandling>,
}

/// Runs `braid sub`.
pub(crate) fn run(args: SubArgs) -> ExitCode {
    args.conn.init_logging();
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return fail("sub", format!("cannot start the runtime: {e}")),
    };
    rt.block_on(subscribe(args))
}

async fn subscribe(args: SubArgs) -> ExitCode {
    // Installed first, so a signal at any point ends the subscriber cleanly.
    let mut stop = match StopSignals::new() {
        Ok(s) => s,
        Err(e) => return fail("sub", format!("cannot install signal handlers: {e}")),
    };
    let props = match args.conn.v5_properties("subscribe") {
        Ok(p) => p,
        Err(e) => return fail("sub", e),
    };
    let mut opts = match args.conn.options("braid-sub", &props) {
        Ok(o) => o,
        Err(e) => return fail("sub", e),
    };
    let v5 = opts.version.is_v5();
    if !v5 && (args.no_local || args.retain_as_published || args.retain_handling.is_some()) {
        return fail("sub", "--no-local, --retain-as-published and --retain-handling need MQTT v5 (-V 5)");
    }
    if let Some(bad) = args.topics.iter().find(|t| !valid_topic_filter(t)) {
        return fail("sub", format!("invalid topic filter {bad:?}: are all '+' and '#' wildcards correct?"));
    }
    // Like mosquitto_sub, stay subscribed across lost connections.
    opts.reconnect =
        Some(Reconnect { initial_delay: Duration::from_secs(1), max_delay: Duration::from_secs(30) });
    let deadline = args.timeout.map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let timer = tokio::time::sleep_until(deadline.unwrap_or_else(|| tokio::time::Instant::now() + FOREVER));
    tokio::pin!(timer);

    let client = tokio::select! {
        connected = Client::connect(opts.clone()) => match connected {
            Ok((c, _)) => c,
            Err(e) => return fail("sub", connect_error(&opts, &e)),
        },
        () = &mut timer => return timed_out(),
        () = stop.recv() => return ExitCode::SUCCESS,
    };

    let options = SubscriptionOptions {
        qos: qos(args.qos),
        no_local: args.no_local,
        retain_as_published: args.retain_as_published,
        retain_handling: match (args.retain_handling, args.no_retained) {
            (Some(rh), _) => rh,
            (None, true) => RetainHandling::DoNotSend,
            (None, false) => RetainHandling::SendAtSubscribe,
        },
    };
    let filters = args.topics.iter().map(|t| (t.clone(), options)).collect();
    // The SUBACK must come on this connection: a server that closes it instead would otherwise
    // see the SUBSCRIBE again after every reconnect. Messages of a resumed session may arrive
    // first; they are kept and printed after.
    let subscribing = client.subscribe(filters, props.subscribe.clone());
    tokio::pin!(subscribing);
    let mut early = Vec::new();
    let reasons = loop {
        tokio::select! {
            r = &mut subscribing => match r {
                Ok(r) => break r,
                Err(e) => return fail("sub", format!("subscribe failed: {e}")),
            },
            ev = client.recv() => match ev {
                Some(Event::Disconnected(r)) => {
                    let _ = client.disconnect(ReasonCode::Success).await;
                    let why = r.map_or_else(|| "connection closed".to_owned(), reason);
                    return fail("sub", format!("disconnected before the subscription was acknowledged: {why}"));
                }
                Some(ev) => early.push(ev),
                None => return fail("sub", "connection closed"),
            },
            () = &mut timer => {
                let _ = client.disconnect(ReasonCode::Success).await;
                return timed_out();
            }
            () = stop.recv() => {
                let _ = client.disconnect(ReasonCode::Success).await;
                return ExitCode::SUCCESS;
            }
        }
    };
    for (topic, r) in args.topics.iter().zip(&reasons) {
        if r.is_error() {
            eprintln!("braid sub: subscription to {topic:?} refused: {}", reason(*r));
        } else {
            tracing::debug!("subscribed to {topic:?}: {}", reason(*r));
        }
    }
    if reasons.iter().all(|r| r.is_error()) {
        let _ = client.disconnect(ReasonCode::Success).await;
        return fail("sub", "all subscription requests were denied");
    }
    if args.exit_after_subscribe {
        let _ = client.disconnect(ReasonCode::Success).await;
        return ExitCode::SUCCESS;
    }

    let mut received = 0u64;
    let mut early = early.into_iter();
    loop {
        let event = match early.next() {
            Some(ev) => Some(ev),
            None => tokio::select! {
                ev = client.recv() => ev,
                () = &mut timer => {
                    let _ = client.disconnect(ReasonCode::Success).await;
                    return timed_out();
                }
                () = stop.recv() => {
                    let _ = client.disconnect(ReasonCode::Success).await;
                    return ExitCode::SUCCESS;
                }
            },
        };
        match event {
            Some(Event::Message(p)) => {
                if args.no_retained && p.retain {
                    continue;
                }
                if let Err(e) = print_message(&args, &p) {
                    // A closed pipe (e.g. `| head`) ends the subscriber quietly.
                    let _ = client.disconnect(ReasonCode::Success).await;
                    return if e.kind() == std::io::ErrorKind::BrokenPipe {
                        ExitCode::SUCCESS
                    } else {
                        fail("sub", format!("cannot write to stdout: {e}"))
                    };
                }
                received += 1;
                if args.count == Some(received) {
                    let _ = client.disconnect(ReasonCode::Success).await;
                    return ExitCode::SUCCESS;
                }
            }
            Some(Event::Disconnected(Some(ReasonCode::SessionTakenOver))) => {
                // Reconnecting would take the session back and start a tug of war.
                let _ = client.disconnect(ReasonCode::Success).await;
                return fail("sub", format!("disconnected: {}", reason(ReasonCode::SessionTakenOver)));
            }
            Some(Event::Disconnected(r)) => {
                let why = r.map_or_else(|| "connection lost".to_owned(), reason);
                eprintln!("braid sub: disconnected ({why}); reconnecting");
            }
            Some(Event::Connected(c)) => {
                tracing::debug!(session_present = c.session_present, "reconnected");
            }
            None => return fail("sub", "connection closed"),
        }
    }
}

const FOREVER: Duration = Duration::from_secs(86_400 * 365 * 10);

fn timed_out() -> ExitCode {
    eprintln!("Timed out");
    ExitCode::from(EXIT_TIMEOUT)
}

/// SIGINT and SIGTERM, registered when created.
struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    fn new() -> std::io::Result<StopSignals> {
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Resolves on the next SIGINT or SIGTERM.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

fn print_message(args: &SubArgs, p: &Publish) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    if args.verbose {
        out.write_all(p.topic.as_bytes())?;
        out.write_all(b" ")?;
    }
    out.write_all(&p.payload)?;
    if !args.no_eol {
        out.write_all(b"\n")?;
    }
    if args.verbose_properties {
        for line in property_lines(&p.properties) {
            writeln!(out, "  {line}")?;
        }
    }
    out.flush()
}

/// `name: value` for each property set, in the spec's order.
fn property_lines(p: &Properties) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(v) = p.payload_format_indicator {
        lines.push(format!("payload-format-indicator: {v}"));
    }
    if let Some(v) = p.message_expiry_interval {
        lines.push(format!("message-expiry-interval: {v}"));
    }
    if let Some(v) = &p.content_type {
        lines.push(format!("content-type: {v}"));
    }
    if let Some(v) = &p.response_topic {
        lines.push(format!("response-topic: {v}"));
    }
    if let Some(v) = &p.correlation_data {
        lines.push(format!("correlation-data: {}", String::from_utf8_lossy(v)));
    }
    for id in &p.subscription_identifiers {
        lines.push(format!("subscription-identifier: {id}"));
    }
    if let Some(v) = p.topic_alias {
        lines.push(format!("topic-alias: {v}"));
    }
    for (k, v) in &p.user_properties {
        lines.push(format!("user-property: {k}={v}"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_are_listed_in_spec_order() {
        let p = Properties::from(braid_proto::PropertyValues {
            message_expiry_interval: Some(30),
            content_type: Some("text/plain".into()),
            user_properties: vec![("a".into(), "1".into()), ("b".into(), "2".into())],
            ..Default::default()
        });
        assert_eq!(
            property_lines(&p),
            [
                "message-expiry-interval: 30",
                "content-type: text/plain",
                "user-property: a=1",
                "user-property: b=2"
            ]
        );
        assert!(property_lines(&Properties::default()).is_empty());
    }
}
