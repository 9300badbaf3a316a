//! Connecting many clients through braid-client, and `braid bench conn`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_client::{Client, ClientOptions, ReasonCode};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::args::{CommonArgs, ConnArgs};
use super::report::{self, Latency, Summary, Ticker};
use super::stats::{Counter, Stats};

/// One connected client.
pub(crate) struct Conn {
    /// Client sequence number (`%i`).
    pub seq: u64,
    /// Client id (`%c`).
    pub client_id: String,
    /// The handle.
    pub client: Client,
}

/// What a connect phase achieved.
pub(crate) struct Connected {
    /// The clients that got CONNACK, in sequence order.
    pub clients: Vec<Conn>,
    /// Seconds from the first CONNECT to the last answer.
    pub secs: f64,
}

/// Client options for one bench client.
pub(crate) fn options(
    common: &CommonArgs,
    client_id: String,
    receive_maximum: u16,
    max_inflight: u16,
) -> ClientOptions {
    let mut o =
        ClientOptions::new(common.host.clone(), common.port.unwrap_or(common.transport.default_port()));
    o.transport = common.transport.transport();
    o.version = common.protocol();
    o.client_id = client_id;
    o.clean_start = common.clean;
    o.keep_alive = common.keepalive;
    o.session_expiry = common.session_expiry;
    o.username = common.username.clone();
    o.password = common.password.clone().map(|p| p.into_bytes().into());
    o.receive_maximum = receive_maximum;
    o.max_inflight = max_inflight;
    o
}

/// `PREFIX_bench_KIND_N`
pub(crate) fn client_id(common: &CommonArgs, kind: &str, seq: u64) -> String {
    format!("{}_bench_{kind}_{seq}", common.prefix)
}

/// Opens `count` connections of `kind` ("conn", "sub", "pub") with sequence numbers
/// `first_seq..`, `-i` ms apart and at most `--max-connecting` at once.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn connect_many(
    common: &CommonArgs,
    kind: &str,
    first_seq: u64,
    count: u32,
    receive_maximum: u16,
    max_inflight: u16,
    stats: &Arc<Stats>,
    stop: &Stop,
) -> Connected {
    let gate = Arc::new(Semaphore::new(common.max_connecting.max(1)));
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    let interval = Duration::from_millis(common.interval_ms);
    for n in 0..count as u64 {
        if stop.is_set() {
            break;
        }
        if n > 0 && !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
        let Ok(permit) = gate.clone().acquire_owned().await else { break };
        let seq = first_seq + n;
        let id = client_id(common, kind, seq);
        let opts = options(common, id.clone(), receive_maximum, max_inflight);
        let stats = stats.clone();
        tasks.spawn(async move {
            let t0 = Instant::now();
            let result = Client::connect(opts).await;
            drop(permit);
            match result {
                Ok((client, _connack)) => {
                    stats.record_connect(t0.elapsed().as_nanos() as u64);
                    stats.inc(Counter::ConnectSucc);
                    Some(Conn { seq, client_id: id, client })
                }
                Err(e) => {
                    stats.inc(Counter::ConnectFail);
                    eprintln!("client({seq}): connect error - {e}");
                    None
                }
            }
        });
    }
    let mut clients = Vec::with_capacity(count as usize);
    while let Some(r) = tasks.join_next().await {
        if let Ok(Some(c)) = r {
            clients.push(c);
        }
    }
    clients.sort_by_key(|c| c.seq);
    Connected { clients, secs: start.elapsed().as_secs_f64() }
}

/// Disconnects every client (normal disconnection), concurrently.
pub(crate) async fn disconnect_all(clients: impl IntoIterator<Item = Client>) {
    let mut tasks = JoinSet::new();
    for c in clients {
        tasks.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), c.disconnect(ReasonCode::Success)).await;
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// The run's stop signal: Ctrl-C, `--duration`, or the end of the work.
#[derive(Clone)]
pub(crate) struct Stop {
    flag: Arc<AtomicBool>,
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Stop {
    fn default() -> Self {
        Stop::new()
    }
}

impl Stop {
    /// Not stopped yet.
    pub(crate) fn new() -> Stop {
        Stop { flag: Arc::new(AtomicBool::new(false)), tx: Arc::new(watch::channel(false).0) }
    }

    /// Stops.
    pub(crate) fn set(&self) {
        self.flag.store(true, Ordering::Relaxed);
        self.tx.send_replace(true);
    }

    /// Whether stopped (one relaxed load).
    #[inline]
    pub(crate) fn is_set(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// Resolves once stopped.
    pub(crate) async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Sets the flag on Ctrl-C.
    pub(crate) fn on_ctrl_c(&self) {
        let stop = self.clone();
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("interrupted: stopping");
            stop.set();
        });
    }

    /// Sets the flag `duration` seconds from now (when > 0).
    pub(crate) fn after(&self, duration: f64) {
        if duration > 0.0 {
            let stop = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs_f64(duration)).await;
                stop.set();
            });
        }
    }
}

/// Builds the tokio runtime for a bench run.
pub(crate) fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if threads > 0 {
        b.worker_threads(threads);
    }
    b.enable_all().build()
}

/// Summary fields every mode fills the same way.
pub(crate) fn base_summary(mode: &str, common: &CommonArgs, stats: &Stats, connect_secs: f64) -> Summary {
    let succ = stats.get(Counter::ConnectSucc);
    Summary {
        mode: mode.into(),
        version: common.version,
        connect_succ: succ,
        connect_fail: stats.get(Counter::ConnectFail),
        connect_secs,
        connect_rate: report::rate(succ, connect_secs),
        connect_latency_ns: Latency::of(&stats.connect_latency()),
        sub: stats.get(Counter::Sub),
        sub_fail: stats.get(Counter::SubFail),
        published: stats.get(Counter::Pub),
        pub_fail: stats.get(Counter::PubFail),
        received: stats.get(Counter::Recv),
        disconnected: stats.get(Counter::Disconnected),
        ..Default::default()
    }
}

/// Prints the summary as text or JSON.
pub(crate) fn print_summary(s: &Summary, json: bool) {
    use std::io::Write as _;
    let text = if json { s.to_json() + "\n" } else { s.to_text() };
    // A closed stdout (`| head`) is not worth a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// Counts connections that end while the run goes on (a connection-only client has no other
/// reader of its events).
fn watch_disconnects(client: Client, stats: Arc<Stats>) {
    tokio::spawn(async move {
        while let Some(ev) = client.recv().await {
            if let braid_client::Event::Disconnected(_) = ev {
                stats.inc(Counter::Disconnected);
            }
        }
    });
}

/// `braid bench conn`: connect -c clients and hold them until --duration or Ctrl-C.
pub(crate) async fn run(args: ConnArgs) -> Summary {
    let common = &args.common;
    let stats = Arc::new(Stats::new());
    let start = Instant::now();
    let _ticker = Ticker::start(stats.clone(), start, common.json, common.quiet);
    let stop = Stop::new();
    stop.on_ctrl_c();
    let connected = connect_many(
        common,
        "conn",
        common.start_number as u64,
        common.count,
        u16::MAX,
        u16::MAX,
        &stats,
        &stop,
    )
    .await;
    // --duration: how long to hold the connections once they are all open.
    stop.after(common.duration);
    for c in &connected.clients {
        watch_disconnects(c.client.clone(), stats.clone());
    }
    stop.wait().await;
    let mut s = base_summary("conn", common, &stats, connected.secs);
    disconnect_all(connected.clients.into_iter().map(|c| c.client)).await;
    s.elapsed_secs = start.elapsed().as_secs_f64();
    s
}
