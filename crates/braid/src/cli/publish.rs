//! `braid pub`: publish one message (or one per stdin line), like mosquitto_pub.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::ArgGroup;
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use braid_client::{Bytes, Client, Error, Event, Message, PublishHandle, ReasonCode};

use super::{connect_error, fail, qos, reason, runtime, ConnArgs};

/// Publish messages, like mosquitto_pub.
#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
#[command(group(ArgGroup::new("payload").required(true).args(["message", "file", "stdin_file", "stdin_line", "null_message"])))]
pub(crate) struct PubArgs {
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Topic to publish to.
    #[arg(short = 't', long = "topic")]
    pub topic: String,
    /// QoS of the message.
    #[arg(short = 'q', long = "qos", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub qos: u8,
    /// Retain the message.
    #[arg(short = 'r', long = "retain")]
    pub retain: bool,
    /// The message payload.
    #[arg(short = 'm', long = "message")]
    pub message: Option<String>,
    /// Send the contents of a file as the message.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Read the message from stdin, sending the entire input as one message.
    #[arg(short = 's', long = "stdin-file")]
    pub stdin_file: bool,
    /// Read messages from stdin, sending a separate message for each line.
    #[arg(short = 'l', long = "stdin-line")]
    pub stdin_line: bool,
    /// Send a null (zero length) message.
    #[arg(short = 'n', long = "null-message")]
    pub null_message: bool,
    /// Publish the message N times (with -m, -f, -s or -n).
    #[arg(long = "repeat", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// Seconds to wait between repeated publishes.
    #[arg(long = "repeat-delay", value_name = "SECS", default_value_t = 0.0)]
    pub repeat_delay: f64,
    /// Maximum QoS 1/2 messages in flight.
    #[arg(short = 'M', long = "max-inflight", default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_inflight: u16,
}

/// Runs `braid pub`.
pub(crate) fn run(args: PubArgs) -> ExitCode {
    args.conn.init_logging();
    if !(args.repeat_delay >= 0.0 && args.repeat_delay.is_finite()) {
        return fail("pub", "--repeat-delay must be a number of seconds >= 0");
    }
    // Like mosquitto, load the payload before connecting.
    let payload = if let Some(m) = &args.message {
        Some(Bytes::from(m.clone()))
    } else if let Some(path) = &args.file {
        match std::fs::read(path) {
            Ok(b) => Some(Bytes::from(b)),
            Err(e) => return fail("pub", format!("cannot read {}: {e}", path.display())),
        }
    } else if args.stdin_file {
        let mut buf = Vec::new();
        if let Err(e) = std::io::stdin().read_to_end(&mut buf) {
            return fail("pub", format!("cannot read stdin: {e}"));
        }
        Some(Bytes::from(buf))
    } else if args.null_message {
        Some(Bytes::new())
    } else {
        None // -l
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return fail("pub", format!("cannot start the runtime: {e}")),
    };
    rt.block_on(publish(args, payload))
}

async fn publish(args: PubArgs, payload: Option<Bytes>) -> ExitCode {
    let props = match args.conn.v5_properties("publish") {
        Ok(p) => p,
        Err(e) => return fail("pub", e),
    };
    let mut opts = match args.conn.options("braid-pub", &props) {
        Ok(o) => o,
        Err(e) => return fail("pub", e),
    };
    opts.max_inflight = args.max_inflight;
    let (client, _) = match Client::connect(opts.clone()).await {
        Ok(c) => c,
        Err(e) => return fail("pub", connect_error(&opts, &e)),
    };
    // Acks are awaited in order by a second task, so publishing pipelines up to the window.
    let (handles_tx, handles_rx) = mpsc::channel(1024);
    let checker = tokio::spawn(check_acks(handles_rx));
    let message = |payload: Bytes| Message {
        topic: args.topic.clone(),
        payload,
        qos: qos(args.qos),
        retain: args.retain,
        properties: props.publish.clone(),
    };
    let sent: Result<(), Error> = async {
        match payload {
            Some(payload) => {
                for i in 0..args.repeat {
                    if i > 0 && args.repeat_delay > 0.0 {
                        tokio::time::sleep(Duration::from_secs_f64(args.repeat_delay)).await;
                    }
                    let h = client.publish(message(payload.clone())).await?;
                    let _ = handles_tx.send(h).await;
                }
            }
            None => {
                let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
                let mut line = Vec::new();
                loop {
                    line.clear();
                    let n = stdin.read_until(b'\n', &mut line).await.map_err(Error::Io)?;
                    if n == 0 {
                        break;
                    }
                    if line.last() == Some(&b'\n') {
                        line.pop();
                    }
                    let h = client.publish(message(Bytes::copy_from_slice(&line))).await?;
                    let _ = handles_tx.send(h).await;
                }
            }
        }
        Ok(())
    }
    .await;
    drop(handles_tx);
    let acked = checker.await.unwrap_or(Err(Error::Closed));
    let outcome = sent.and(acked);
    match outcome {
        Ok(()) => {
            let _ = client.disconnect(ReasonCode::Success).await;
            ExitCode::SUCCESS
        }
        Err(Error::Rejected(r)) => {
            let _ = client.disconnect(ReasonCode::Success).await;
            fail("pub", format!("publish to {:?} rejected: {}", args.topic, reason(r)))
        }
        Err(Error::Closed) => fail("pub", lost_connection(&client).await),
        Err(e) => {
            let _ = client.disconnect(ReasonCode::Success).await;
            fail("pub", e)
        }
    }
}

/// Awaits every handle; the first failure, if any.
async fn check_acks(mut handles: mpsc::Receiver<PublishHandle>) -> Result<(), Error> {
    let mut first_error = None;
    while let Some(h) = handles.recv().await {
        if let Err(e) = h.await {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Why the connection went away, from the client's events.
async fn lost_connection(client: &Client) -> String {
    let wait = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(ev) = client.recv().await {
            if let Event::Disconnected(Some(r)) = ev {
                return Some(r);
            }
        }
        None
    });
    match wait.await {
        Ok(Some(r)) => format!("disconnected by the server: {}", reason(r)),
        _ => "connection lost".into(),
    }
}
