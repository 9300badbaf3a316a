//! Subscribers: `braid bench sub`, and the `--sub N` subscribers of `braid bench pub`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_client::{Client, Event, Properties, QoS, SubscriptionOptions};
use tokio::task::JoinSet;

use super::args::SubArgs;
use super::conn::{self, Conn, Stop};
use super::payload::{self, Clock};
use super::report::{self, Latency, Summary, Ticker};
use super::spec::{render_topic, Vars};
use super::stats::{self, Counter, LatencyBatch, SeqTracker, Stats};

/// What one subscriber saw.
#[derive(Default)]
pub(crate) struct SubResult {
    /// Per-publisher sequence state.
    pub tracker: SeqTracker,
    /// Messages without a stamp.
    pub unstamped: u64,
    /// Receive time of the first message (ns since the epoch; 0 = none).
    pub first_ns: u64,
    /// Receive time of the last message.
    pub last_ns: u64,
    /// The subscriber's place in connect order (its entry in `Subscribers::filters`).
    pub index: usize,
}

/// What one subscriber should receive: (publisher id, messages it sent) for every publisher
/// whose topic the subscriber's filters match.
pub(crate) type Expected = Arc<[(u32, u64)]>;

/// QoS from 0..=2.
pub(crate) fn qos(q: u8) -> QoS {
    QoS::from_u8(q).unwrap_or(QoS::AtMostOnce)
}

/// Subscribes `client` to `filters` (templates rendered for this client) and counts the outcome.
pub(crate) async fn subscribe(conn: &Conn, filters: &[String], q: u8, username: &str, stats: &Stats) -> bool {
    let vars = Vars { seq: conn.seq, client_id: &conn.client_id, username };
    let opts = SubscriptionOptions { qos: qos(q), ..Default::default() };
    let list = filters.iter().map(|f| (render_topic(f, vars), opts)).collect();
    match conn.client.subscribe(list, Properties::default()).await {
        Ok(codes) if codes.iter().all(|c| !c.is_error()) => {
            stats.inc(Counter::Sub);
            true
        }
        Ok(codes) => {
            stats.inc(Counter::SubFail);
            eprintln!("client({}): subscribe refused: {codes:?}", conn.seq);
            false
        }
        Err(e) => {
            stats.inc(Counter::SubFail);
            eprintln!("client({}): subscribe error - {e}", conn.seq);
            false
        }
    }
}

/// Receives until the client is disconnected: counts, latency into `stats`, sequence tracking.
pub(crate) async fn receive(client: Client, index: usize, stats: Arc<Stats>) -> SubResult {
    let clock = Clock::global();
    let mut lat = LatencyBatch::new(index);
    let mut r = SubResult { index, ..SubResult::default() };
    while let Some(ev) = client.recv().await {
        match ev {
            Event::Message(p) => {
                let now = clock.now_ns();
                stats.inc(Counter::Recv);
                if r.first_ns == 0 {
                    r.first_ns = now;
                }
                r.last_ns = now;
                if let Some(stamp) = payload::parse(&p.payload) {
                    r.tracker.observe(stamp.publisher, stamp.seq, stamp.seq_bits);
                    if let Some(ns) = stamp.latency_ns(now) {
                        lat.record(&stats, ns);
                    }
                } else if let Some(sent) = payload::parse_json_timestamp(&p.payload) {
                    r.unstamped += 1;
                    if let Some(ns) = now.checked_sub(sent) {
                        lat.record(&stats, ns);
                    }
                } else {
                    r.unstamped += 1;
                }
            }
            Event::Disconnected(_) => stats.inc(Counter::Disconnected),
            Event::Connected(_) => {}
        }
    }
    lat.flush(&stats);
    r
}

/// Running subscribers.
pub(crate) struct Subscribers {
    /// Their handles, to disconnect them.
    pub clients: Vec<Client>,
    /// What each receiving task saw; `false`: a stream whose messages are not measured.
    tasks: JoinSet<(bool, SubResult)>,
    /// Counts of the streams not measured (`--stream-priority` beyond the first filter).
    pub others: Arc<Stats>,
    /// Seconds the connect phase took.
    pub connect_secs: f64,
    /// The filters each subscriber subscribed to (the measured ones), rendered for it, in
    /// connect order (`SubResult::index`).
    pub filters: Vec<Vec<String>>,
}

impl Subscribers {
    /// Connects `count` subscribers, subscribes each to `filters` and starts receiving; with
    /// `priorities` (QUIC), filter i on a data stream of its own at priority i.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn start(
        common: &super::args::CommonArgs,
        first_seq: u64,
        count: u32,
        filters: &[String],
        priorities: &[i32],
        q: u8,
        receive_maximum: u16,
        stats: &Arc<Stats>,
        stop: &Stop,
    ) -> Subscribers {
        let connected =
            conn::connect_many(common, "sub", first_seq, count, receive_maximum, u16::MAX, stats, stop).await;
        let username = common.username.clone().unwrap_or_default();
        let mut tasks = JoinSet::new();
        let mut clients = Vec::with_capacity(connected.clients.len());
        // Measured: every filter, or with streams the first one's.
        let measured = if priorities.is_empty() { filters } else { &filters[..filters.len().min(1)] };
        let rendered: Vec<Vec<String>> = connected
            .clients
            .iter()
            .map(|c| {
                let vars = Vars { seq: c.seq, client_id: &c.client_id, username: &username };
                measured.iter().map(|f| render_topic(f, vars)).collect()
            })
            .collect();
        // Subscribe concurrently, a bounded number at a time.
        let mut pending = JoinSet::new();
        let gate = Arc::new(tokio::sync::Semaphore::new(common.max_connecting.max(1)));
        for (index, c) in connected.clients.into_iter().enumerate() {
            clients.push(c.client.clone());
            let (filters, priorities, username, stats, gate) =
                (filters.to_vec(), priorities.to_vec(), username.clone(), stats.clone(), gate.clone());
            pending.spawn(async move {
                let permit = gate.acquire_owned().await;
                let receivers = if priorities.is_empty() {
                    subscribe(&c, &filters, q, &username, &stats).await;
                    vec![(c.client, true)]
                } else {
                    subscribe_on_streams(&c, &filters, &priorities, q, &username, &stats).await
                };
                drop(permit);
                (index, receivers)
            });
        }
        let others = Arc::new(Stats::new());
        while let Some(r) = pending.join_next().await {
            let Ok((index, receivers)) = r else { continue };
            for (client, measured) in receivers {
                let into = if measured { stats.clone() } else { others.clone() };
                tasks.spawn(async move { (measured, receive(client, index, into).await) });
            }
        }
        Subscribers { clients, tasks, others, connect_secs: connected.secs, filters: rendered }
    }

    /// Number of connected subscribers.
    pub(crate) fn len(&self) -> usize {
        self.clients.len()
    }

    /// Disconnects them and collects what each saw.
    pub(crate) async fn finish(mut self) -> Vec<SubResult> {
        conn::disconnect_all(self.clients.drain(..)).await;
        let mut out = Vec::new();
        while let Some(r) = self.tasks.join_next().await {
            if let Ok((true, r)) = r {
                out.push(r);
            }
        }
        out
    }
}

/// QUIC: subscribes filter i of `filters` on a data stream of `conn` opened at `priorities[i]`;
/// returns the streams, the first one marked as the measured one.
async fn subscribe_on_streams(
    conn: &Conn,
    filters: &[String],
    priorities: &[i32],
    q: u8,
    username: &str,
    stats: &Stats,
) -> Vec<(Client, bool)> {
    let mut streams = Vec::with_capacity(filters.len());
    for (i, (filter, priority)) in filters.iter().zip(priorities).enumerate() {
        match conn.client.open_stream(*priority).await {
            Ok(client) => {
                let stream = Conn { seq: conn.seq, client_id: conn.client_id.clone(), client };
                subscribe(&stream, std::slice::from_ref(filter), q, username, stats).await;
                streams.push((stream.client, i == 0));
            }
            Err(e) => {
                stats.inc(Counter::SubFail);
                eprintln!("client({}): cannot open a stream for {filter} - {e}", conn.seq);
            }
        }
    }
    streams
}

/// Fills the receive side of a summary from the subscribers' results. `sent`: what each
/// subscriber should have received (by `SubResult::index`), as (publisher id, messages sent).
/// `since_ns` is the start of the measured interval (publish start; or, when 0, the first
/// message received).
pub(crate) fn fill_receive(
    s: &mut Summary,
    results: &[SubResult],
    stats: &Stats,
    sent: Option<&[Expected]>,
    since_ns: u64,
) {
    let expected = |r: &SubResult| sent.map(|sent| sent.get(r.index).map_or(&[][..], |e| &e[..]));
    let d = stats::delivery(results.iter().map(|r| (&r.tracker, expected(r))));
    s.lost = d.lost;
    s.duplicates = d.duplicates;
    s.out_of_order = d.out_of_order;
    s.unstamped = results.iter().map(|r| r.unstamped).sum();
    s.received = stats.get(Counter::Recv);
    let first = results.iter().map(|r| r.first_ns).filter(|&t| t > 0).min().unwrap_or(0);
    let last = results.iter().map(|r| r.last_ns).max().unwrap_or(0);
    let since = if since_ns > 0 { since_ns } else { first };
    s.recv_secs = if last > since { (last - since) as f64 / 1e9 } else { 0.0 };
    s.recv_rate = report::rate(s.received, s.recv_secs);
    s.latency_ns = Latency::of(&stats.latency());
}

/// `braid bench sub`
pub(crate) async fn run(args: SubArgs) -> Result<Summary, String> {
    let common = &args.common;
    let priorities = &args.stream_priorities;
    if !priorities.is_empty() && (!common.transport.quic || priorities.len() != args.topics.len()) {
        return Err("--stream-priority: QUIC only (--quic), one per -t filter".into());
    }
    let stats = Arc::new(Stats::new());
    let start = Instant::now();
    let _ticker = Ticker::start(stats.clone(), start, common.json, common.quiet);
    let stop = Stop::new();
    stop.on_ctrl_c();
    let subs = Subscribers::start(
        common,
        common.start_number as u64,
        common.count,
        &args.topics,
        priorities,
        args.qos,
        args.receive_maximum,
        &stats,
        &stop,
    )
    .await;
    // --duration counts from the moment every subscription is in place.
    stop.after(common.duration);
    // Stop conditions other than time and Ctrl-C: -L and --idle-timeout.
    let mut last = (0u64, Instant::now());
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            _ = stop.wait() => break,
            _ = tick.tick() => {}
        }
        let recv = stats.get(Counter::Recv);
        if args.limit > 0 && recv >= args.limit {
            break;
        }
        if recv != last.0 {
            last = (recv, Instant::now());
        } else if args.idle_timeout > 0.0 && recv > 0 && last.1.elapsed().as_secs_f64() >= args.idle_timeout {
            break;
        }
    }
    let mut s = conn::base_summary("sub", common, &stats, subs.connect_secs);
    s.subscribers = subs.len() as u64;
    s.qos = args.qos;
    s.receive_maximum = args.receive_maximum;
    let others = subs.others.clone();
    let results = subs.finish().await;
    fill_receive(&mut s, &results, &stats, None, 0);
    s.elapsed_secs = start.elapsed().as_secs_f64();
    if priorities.len() > 1 {
        eprintln!("the other streams received {} messages", others.get(Counter::Recv));
    }
    Ok(s)
}
