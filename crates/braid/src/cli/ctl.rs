//! `braid ctl`: a thin command line over the HTTP admin API (`docs/api.md`), as `emqx ctl` is
//! over EMQX's: each command is one request; lists print as aligned columns, `--json` prints
//! the API's JSON as it came.

use std::process::ExitCode;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use braid_client::TlsOptions;

/// `braid ctl [--url URL] [--key KEY] COMMAND`.
#[derive(clap::Args, Debug)]
pub(crate) struct CtlArgs {
    /// The admin listener: http://HOST:PORT or https://HOST:PORT.
    #[arg(long, env = "BRAID_CTL_URL", default_value = "http://127.0.0.1:18083")]
    url: String,
    /// An API key (`braid apikey add`), when the broker asks for one.
    #[arg(long, env = "BRAID_API_KEY", hide_env_values = true)]
    key: Option<String>,
    /// CA certificate (PEM) that signed an https:// listener's certificate.
    #[arg(long)]
    cafile: Option<std::path::PathBuf>,
    /// Print the API's JSON instead of columns.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(clap::Subcommand, Debug)]
enum CtlCommand {
    /// The main counters (`GET /api/v1/stats`).
    Status,
    /// Sessions, connected or not.
    Clients {
        /// Client ids starting with this.
        #[arg(long)]
        prefix: Option<String>,
        /// connected or offline.
        #[arg(long)]
        state: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One client's detail, its subscriptions included.
    Client {
        /// The client id.
        id: String,
    },
    /// Close a client's connection (v5: DISCONNECT 0x98 Administrative action).
    Kick {
        /// The client id.
        id: String,
    },
    /// Subscriptions, of one client or of one filter.
    Subs {
        /// Only this client's.
        #[arg(long)]
        client: Option<String>,
        /// Only this filter.
        #[arg(long)]
        filter: Option<String>,
    },
    /// Subscribe a client's session to a filter.
    Subscribe {
        /// The client id.
        id: String,
        /// The topic filter.
        filter: String,
        /// QoS 0, 1 or 2.
        #[arg(short, long, default_value_t = 0)]
        qos: u8,
    },
    /// Unsubscribe a client's session from a filter.
    Unsubscribe {
        /// The client id.
        id: String,
        /// The topic filter.
        filter: String,
    },
    /// Retained messages matching a filter, or clear one (`--delete TOPIC`).
    Retained {
        /// Topic filter.
        #[arg(default_value = "#")]
        filter: String,
        /// Clear the retained message of this topic instead.
        #[arg(long, value_name = "TOPIC")]
        delete: Option<String>,
    },
    /// Publish a message.
    Publish {
        /// Topic.
        topic: String,
        /// Payload (text).
        message: String,
        /// QoS 0, 1 or 2.
        #[arg(short, long, default_value_t = 0)]
        qos: u8,
        /// Retain it.
        #[arg(short, long)]
        retain: bool,
    },
    /// The cluster's nodes, with their connections and drains.
    Nodes,
    /// Drain a cluster node: its clients go to the other nodes.
    ///
    /// The node refuses new connections and sends its clients away at the rate (v5: DISCONNECT
    /// 0x9C with a Server Reference), then stays drained until it is stopped or the drain is
    /// cancelled.
    Drain {
        /// The node's name (`cluster.node`).
        node: String,
        /// Connections per second it sends away [default: 100].
        #[arg(long)]
        rate: Option<u32>,
        /// End the node's drain instead: it accepts connections again.
        #[arg(long, conflicts_with = "rate")]
        cancel: bool,
    },
    /// Even the cluster nodes' connections out.
    ///
    /// Each node above the average sends its excess to the least loaded nodes at the rate,
    /// until the nodes are within 15% of each other or the timeout passes.
    Rebalance {
        /// Connections per second each node sends away [default: 100].
        #[arg(long)]
        rate: Option<u32>,
        /// The longest it lasts, in seconds [default: 300].
        #[arg(long)]
        timeout_secs: Option<u64>,
    },
    /// Reload what can be reloaded (as SIGHUP).
    Reload,
    /// The listeners and their connections.
    Listeners,
    /// The Prometheus metrics, as scraped.
    Metrics,
    /// The rules, with their counters; made, changed and deleted (those made here are kept
    /// across restarts; those of the configuration file are changed in the file).
    Rules {
        #[command(subcommand)]
        command: Option<RulesCommand>,
    },
    /// The sinks of the rules, with their state and counters; made, changed and deleted.
    Sinks {
        #[command(subcommand)]
        command: Option<SinksCommand>,
    },
}

#[derive(clap::Subcommand, Debug)]
enum RulesCommand {
    /// Make a rule: `braid ctl rules add hot 'SELECT ... FROM "s/#"' -a republish:alerts`.
    Add {
        /// Its name.
        name: String,
        /// `SELECT ... FROM ... [WHERE ...]`.
        sql: String,
        /// An action: `republish:TOPIC` or a sink's name (repeatable).
        #[arg(short, long = "action", required = true)]
        actions: Vec<String>,
    },
    /// Change a rule (its SQL and actions).
    Set {
        /// Its name.
        name: String,
        /// `SELECT ... FROM ... [WHERE ...]`.
        sql: String,
        /// An action: `republish:TOPIC` or a sink's name (repeatable).
        #[arg(short, long = "action", required = true)]
        actions: Vec<String>,
    },
    /// Delete a rule.
    Delete {
        /// Its name.
        name: String,
    },
}

#[derive(clap::Subcommand, Debug)]
enum SinksCommand {
    /// Make a sink from its settings as JSON (the keys of `[[sinks]]`):
    /// `braid ctl sinks add '{"name": "hook", "type": "http", "url": "http://127.0.0.1:8080/in"}'`.
    Add {
        /// The sink's settings, a JSON object.
        #[arg(value_parser = json_object)]
        settings: Value,
    },
    /// Change a sink (its settings as JSON, whole).
    Set {
        /// Its name.
        name: String,
        /// The sink's settings, a JSON object.
        #[arg(value_parser = json_object)]
        settings: Value,
    },
    /// Delete a sink that no rule names.
    Delete {
        /// Its name.
        name: String,
    },
}

/// A command-line argument that must be a JSON object.
fn json_object(text: &str) -> Result<Value, String> {
    match serde_json::from_str(text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err("expected a JSON object, {...}".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// Runs `braid ctl`: exit status 0, 1 on an error reply or a failed request.
pub(crate) fn run(args: CtlArgs) -> ExitCode {
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(e) => return super::fail("ctl", e),
    };
    match rt.block_on(ctl(&args)) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => super::fail("ctl", e),
    }
}

/// The request a command makes: method, path and query, body.
fn request_of(command: &CtlCommand) -> (&'static str, String, Option<Value>) {
    let q = |s: &str| urlencoding::encode(s).into_owned();
    match command {
        CtlCommand::Status => ("GET", "/api/v1/stats".into(), None),
        CtlCommand::Clients { prefix, state, limit } => {
            let mut path = format!("/api/v1/clients?limit={limit}");
            if let Some(p) = prefix {
                path += &format!("&prefix={}", q(p));
            }
            if let Some(s) = state {
                path += &format!("&state={}", q(s));
            }
            ("GET", path, None)
        }
        CtlCommand::Client { id } => ("GET", format!("/api/v1/clients/{}", q(id)), None),
        CtlCommand::Kick { id } => ("DELETE", format!("/api/v1/clients/{}", q(id)), None),
        CtlCommand::Subs { client, filter } => {
            let mut path = "/api/v1/subscriptions?limit=1000".to_string();
            if let Some(c) = client {
                path += &format!("&client_id={}", q(c));
            }
            if let Some(f) = filter {
                path += &format!("&filter={}", q(f));
            }
            ("GET", path, None)
        }
        CtlCommand::Subscribe { id, filter, qos } => (
            "POST",
            format!("/api/v1/clients/{}/subscriptions", q(id)),
            Some(json!({ "filter": filter, "qos": qos })),
        ),
        CtlCommand::Unsubscribe { id, filter } => {
            ("DELETE", format!("/api/v1/clients/{}/subscriptions?filter={}", q(id), q(filter)), None)
        }
        CtlCommand::Retained { delete: Some(topic), .. } => {
            let path: Vec<String> = topic.split('/').map(q).collect();
            ("DELETE", format!("/api/v1/retained/{}", path.join("/")), None)
        }
        CtlCommand::Retained { filter, delete: None } => {
            ("GET", format!("/api/v1/retained?limit=1000&filter={}", q(filter)), None)
        }
        CtlCommand::Publish { topic, message, qos, retain } => (
            "POST",
            "/api/v1/publish".into(),
            Some(json!({ "topic": topic, "payload": message, "qos": qos, "retain": retain })),
        ),
        CtlCommand::Nodes => ("GET", "/api/v1/nodes".into(), None),
        CtlCommand::Drain { node, cancel: true, .. } => {
            ("DELETE", format!("/api/v1/nodes/{}/drain", q(node)), None)
        }
        CtlCommand::Drain { node, rate, cancel: false } => (
            "POST",
            format!("/api/v1/nodes/{}/drain", q(node)),
            Some(settings(&[("rate", rate.map(u64::from))])),
        ),
        CtlCommand::Rebalance { rate, timeout_secs } => (
            "POST",
            "/api/v1/cluster/rebalance".into(),
            Some(settings(&[("rate", rate.map(u64::from)), ("timeout_secs", *timeout_secs)])),
        ),
        CtlCommand::Reload => ("POST", "/api/v1/reload".into(), None),
        CtlCommand::Listeners => ("GET", "/api/v1/listeners".into(), None),
        CtlCommand::Metrics => ("GET", "/metrics".into(), None),
        CtlCommand::Rules { command: None } => ("GET", "/api/v1/rules".into(), None),
        CtlCommand::Rules { command: Some(RulesCommand::Add { name, sql, actions }) } => {
            ("POST", "/api/v1/rules".into(), Some(json!({"name": name, "sql": sql, "actions": actions})))
        }
        CtlCommand::Rules { command: Some(RulesCommand::Set { name, sql, actions }) } => {
            ("PUT", format!("/api/v1/rules/{}", q(name)), Some(json!({"sql": sql, "actions": actions})))
        }
        CtlCommand::Rules { command: Some(RulesCommand::Delete { name }) } => {
            ("DELETE", format!("/api/v1/rules/{}", q(name)), None)
        }
        CtlCommand::Sinks { command: None } => ("GET", "/api/v1/sinks".into(), None),
        CtlCommand::Sinks { command: Some(SinksCommand::Add { settings }) } => {
            ("POST", "/api/v1/sinks".into(), Some(settings.clone()))
        }
        CtlCommand::Sinks { command: Some(SinksCommand::Set { name, settings }) } => {
            ("PUT", format!("/api/v1/sinks/{}", q(name)), Some(settings.clone()))
        }
        CtlCommand::Sinks { command: Some(SinksCommand::Delete { name }) } => {
            ("DELETE", format!("/api/v1/sinks/{}", q(name)), None)
        }
    }
}

/// A JSON object of the settings given (those None are left to the API's defaults).
fn settings(given: &[(&str, Option<u64>)]) -> Value {
    Value::Object(given.iter().filter_map(|(k, v)| Some((k.to_string(), json!((*v)?)))).collect())
}

async fn ctl(args: &CtlArgs) -> Result<String, String> {
    let (method, path, body) = request_of(&args.command);
    let (status, text) = call(args, method, &path, body).await?;
    if !(200..300).contains(&status) {
        let why = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(text);
        return Err(format!("{method} {path}: {status}: {why}"));
    }
    if matches!(args.command, CtlCommand::Metrics) || args.json {
        return Ok(if text.ends_with('\n') || text.is_empty() { text } else { text + "\n" });
    }
    let v: Value = match text.is_empty() {
        true => Value::Null,
        false => serde_json::from_str(&text).map_err(|e| format!("the reply is not JSON: {e}"))?,
    };
    let (shown, count) = (v["data"].as_array().map_or(0, Vec::len), v["meta"]["count"].as_u64().unwrap_or(0));
    if count > shown as u64 {
        eprintln!("braid ctl: {shown} of {count} shown (--limit for more)");
    }
    Ok(render(&args.command, &v))
}

/// A reply as columns (lists) or `key: value` lines.
fn render(command: &CtlCommand, v: &Value) -> String {
    let columns: &[&str] = match command {
        CtlCommand::Clients { .. } => &[
            "client_id",
            "connected",
            "transport",
            "peer",
            "username",
            "protocol",
            "queued",
            "subscriptions",
        ],
        CtlCommand::Subs { .. } => &["client_id", "filter", "qos", "no_local", "retain_as_published"],
        CtlCommand::Retained { delete: None, .. } => &["topic", "qos", "payload_bytes", "payload"],
        CtlCommand::Listeners => &["transport", "address", "connected", "accepted"],
        CtlCommand::Nodes => &["name", "state", "connections", "draining", "link", "this_node"],
        CtlCommand::Rules { command: None } => {
            &["name", "source", "matched", "passed", "failed", "last_error"]
        }
        CtlCommand::Sinks { command: None } => {
            &["name", "kind", "source", "state", "sent", "retried", "failed", "dropped", "queued"]
        }
        CtlCommand::Rules { command: Some(RulesCommand::Delete { name }) } => {
            return format!("deleted rule {name}\n")
        }
        CtlCommand::Sinks { command: Some(SinksCommand::Delete { name }) } => {
            return format!("deleted sink {name}\n")
        }
        CtlCommand::Kick { id } => return format!("kicked {id}\n"),
        CtlCommand::Retained { delete: Some(t), .. } => {
            return format!("cleared the retained message of {t}\n")
        }
        CtlCommand::Unsubscribe { id, filter } => return format!("unsubscribed {id} from {filter}\n"),
        _ => return lines(v, ""),
    };
    table(columns, v["data"].as_array().map(Vec::as_slice).unwrap_or_default())
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn table(columns: &[&str], rows: &[Value]) -> String {
    let cells: Vec<Vec<String>> =
        rows.iter().map(|r| columns.iter().map(|c| cell(&r[*c])).collect()).collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| cells.iter().map(|r| r[i].chars().count()).chain([c.len()]).max().unwrap_or(0))
        .collect();
    let line = |items: Vec<String>| {
        let padded: Vec<String> = items.iter().zip(&widths).map(|(s, w)| format!("{s:<w$}")).collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(columns.iter().map(|c| c.to_string()).collect());
    for r in cells {
        out += &line(r);
    }
    out
}

/// `key: value` lines, nested objects with dotted keys.
fn lines(v: &Value, prefix: &str) -> String {
    match v {
        Value::Object(map) => map
            .iter()
            .map(|(k, x)| lines(x, &if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }))
            .collect(),
        Value::Null if prefix.is_empty() => String::new(),
        other if prefix.is_empty() => format!("{}\n", cell(other)),
        other => format!("{prefix}: {}\n", cell(other)),
    }
}

/// One request on a connection of its own; returns the status and the body as text.
async fn call(
    args: &CtlArgs,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, String), String> {
    let (tls, rest) = match args.url.split_once("://") {
        Some(("http", rest)) => (false, rest),
        Some(("https", rest)) => (true, rest),
        _ => return Err(format!("--url {:?}: expected http://HOST:PORT or https://HOST:PORT", args.url)),
    };
    let authority = rest.trim_end_matches('/');
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h).trim_matches(['[', ']']);
    let addr = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:{}", if tls { 443 } else { 80 })
    };
    let stream = TcpStream::connect(&addr).await.map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let mut request = Request::builder().method(method).uri(path).header(hyper::header::HOST, authority);
    if let Some(key) = &args.key {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let body = match body {
        Some(v) => {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
            Full::new(Bytes::from(v.to_string()))
        }
        None => Full::new(Bytes::new()),
    };
    let request = request.body(body).map_err(|e| e.to_string())?;
    if tls {
        let opts = TlsOptions { ca_file: args.cafile.clone(), ..Default::default() };
        let stream = braid_client::tls_connect(stream, host, &opts)
            .await
            .map_err(|e| format!("TLS to {addr}: {e}"))?;
        exchange(stream, request).await
    } else {
        exchange(stream, request).await
    }
}

async fn exchange(
    stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    request: Request<Full<Bytes>>,
) -> Result<(u16, String), String> {
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}
