//! Publishers: `braid bench pub`, optionally with `--sub N` subscribers in the same process.
//!
//! Every client connects first; publishing starts for all of them at once, so the measured
//! interval holds only publishing. Each publisher is one task that builds stamped payloads out
//! of a shared buffer, keeps its QoS 1/2 completions in a ring of `-F` handles (publisher-confirm
//! pipelining: it waits for the oldest only when the window is full), and stops at `-L`,
//! `--duration` or Ctrl-C. With `--sub`, the run then waits until the subscribers got every
//! message (or no progress for `--drain-timeout`), and reports end-to-end figures with exact loss
//! accounting, since the subscribers know what each publisher sent.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use braid_client::{Client, Message, Properties, PublishHandle};
use tokio::task::JoinSet;

use super::args::{default_sub_filter, PubArgs};
use super::conn::{self, Conn, Stop};
use super::payload::{self, Clock, PayloadBuilder};
use super::report::{self, Summary, Ticker};
use super::spec::{RenderedTopic, TopicSpec, Vars};
use super::stats::{Counter, Stats};
use super::sub::{self, Subscribers};

/// `-L`: messages left to publish over all clients.
struct Limit {
    left: AtomicU64,
    unlimited: bool,
}

impl Limit {
    #[inline]
    fn take(&self) -> bool {
        self.unlimited
            || self.left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1)).is_ok()
    }
}

/// What one publisher did.
struct PubResult {
    /// Publisher id as written in the stamps.
    wire_id: u32,
    /// Messages handed to the client successfully.
    sent: u64,
    /// When the last publish completed (ns since the epoch).
    last_ns: u64,
    /// The topic it published on (-t rendered for it; empty with --topics-payload).
    topic: String,
}

/// QoS 1/2 completions not yet awaited, at most `window`.
struct Pending {
    handles: VecDeque<PublishHandle>,
    window: usize,
}

impl Pending {
    fn new(window: usize) -> Pending {
        Pending { handles: VecDeque::with_capacity(window.min(1024)), window }
    }

    async fn complete_oldest(&mut self, stats: &Stats) {
        if let Some(h) = self.handles.pop_front() {
            count(h.await, stats);
        }
    }

    /// Counts the completions that already arrived, without waiting, so the per-second `pub`
    /// line moves even while the window is not full.
    fn reap(&mut self, stats: &Stats) {
        let mut cx = Context::from_waker(noop_waker());
        while let Some(front) = self.handles.front_mut() {
            match Pin::new(front).poll(&mut cx) {
                Poll::Ready(r) => {
                    self.handles.pop_front();
                    count(r, stats);
                }
                Poll::Pending => break,
            }
        }
    }

    /// Waits until one more publish fits the window.
    async fn make_room(&mut self, stats: &Stats) {
        while self.handles.len() >= self.window {
            self.complete_oldest(stats).await;
        }
    }

    async fn drain(&mut self, stats: &Stats) {
        while !self.handles.is_empty() {
            self.complete_oldest(stats).await;
        }
    }
}

fn count(r: Result<braid_client::ReasonCode, braid_client::Error>, stats: &Stats) {
    match r {
        Ok(code) if !code.is_error() => stats.inc(Counter::Pub),
        _ => stats.inc(Counter::PubFail),
    }
}

struct NoopWake;

impl Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

/// A waker that does nothing, for polling completions that may already be there.
fn noop_waker() -> &'static Waker {
    static WAKER: OnceLock<Waker> = OnceLock::new();
    WAKER.get_or_init(|| Waker::from(Arc::new(NoopWake)))
}

/// Publishes one message; returns false when the client is gone.
async fn publish(
    client: &Client,
    msg: Message,
    pending: &mut Pending,
    stats: &Stats,
    sent: &mut u64,
) -> bool {
    let qos0 = msg.qos == braid_client::QoS::AtMostOnce;
    match client.publish(msg).await {
        Ok(h) => {
            *sent += 1;
            if qos0 {
                stats.inc(Counter::Pub);
            } else {
                pending.handles.push_back(h);
                pending.reap(stats);
            }
            true
        }
        Err(e) => {
            stats.inc(Counter::PubFail);
            !matches!(e, braid_client::Error::Closed | braid_client::Error::Io(_))
        }
    }
}

struct Plain {
    topic: String,
    qos: braid_client::QoS,
    retain: bool,
    size: usize,
    interval: Duration,
    window: usize,
}

async fn run_plain(
    conn: Conn,
    wire_id: u32,
    p: Arc<Plain>,
    limit: Arc<Limit>,
    stats: Arc<Stats>,
    stop: Stop,
) -> PubResult {
    let clock = Clock::global();
    let mut builder = PayloadBuilder::new(p.size, wire_id);
    let mut pending = Pending::new(p.window);
    let mut sent = 0;
    let mut tick = (!p.interval.is_zero()).then(|| tokio::time::interval(p.interval));
    loop {
        if let Some(t) = tick.as_mut() {
            tokio::select! {
                _ = t.tick() => {}
                _ = stop.wait() => break,
            }
        }
        if stop.is_set() || !limit.take() {
            break;
        }
        pending.make_room(&stats).await;
        let payload = builder.next(clock.now_ns());
        let msg = Message {
            topic: p.topic.clone(),
            payload,
            qos: p.qos,
            retain: p.retain,
            properties: Properties::default(),
        };
        if !publish(&conn.client, msg, &mut pending, &stats, &mut sent).await {
            break;
        }
    }
    pending.drain(&stats).await;
    PubResult { wire_id, sent, last_ns: clock.now_ns(), topic: p.topic.clone() }
}

/// The client each spec topic publishes with: over QUIC, a data stream per `stream` number
/// other than 0 (opened with the `stream_priority` of its first topic), stream 0 being the
/// control stream; over TCP, the connection itself.
async fn topic_clients(conn: &Conn, topics: &[RenderedTopic], quic: bool) -> Result<Vec<Client>, String> {
    let mut streams: Vec<(u64, Client)> = vec![(0, conn.client.clone())];
    let mut clients = Vec::with_capacity(topics.len());
    for t in topics {
        let stream = if quic { t.stream } else { 0 };
        let client = match streams.iter().find(|(n, _)| *n == stream) {
            Some((_, c)) => c.clone(),
            None => {
                let priority = t.stream_priority.unwrap_or(0).clamp(i32::MIN as i64, i32::MAX as i64) as i32;
                let c =
                    conn.client.open_stream(priority).await.map_err(|e| format!("stream {stream}: {e}"))?;
                streams.push((stream, c.clone()));
                c
            }
        };
        clients.push(client);
    }
    Ok(clients)
}

async fn run_spec(
    conn: Conn,
    clients: Vec<Client>,
    topics: Vec<RenderedTopic>,
    limit: Arc<Limit>,
    stats: Arc<Stats>,
    stop: Stop,
    window: usize,
) -> PubResult {
    let clock = Clock::global();
    let mut builder = PayloadBuilder::new(0, 0);
    // One window per topic: a big message's slow PUBACK must not hold back a small topic's
    // publishes (the tool's own head-of-line blocking).
    let mut pending: Vec<Pending> = topics.iter().map(|_| Pending::new(window)).collect();
    let mut sent = 0;
    let start = tokio::time::Instant::now();
    let mut due: Vec<tokio::time::Instant> = vec![start; topics.len()];
    loop {
        let (i, at) = due.iter().copied().enumerate().min_by_key(|(_, t)| *t).expect("a spec has topics");
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = stop.wait() => break,
        }
        if stop.is_set() || !limit.take() {
            break;
        }
        let t = &topics[i];
        due[i] = at + Duration::from_millis(t.interval_ms.max(1));
        pending[i].make_room(&stats).await;
        let now = clock.now_ns();
        let payload = builder.custom(t.approx_len(), |buf| t.write_payload(now, buf));
        let msg = Message {
            topic: t.topic.clone(),
            payload,
            qos: sub::qos(t.qos),
            retain: t.retain,
            properties: Properties::default(),
        };
        if !publish(&clients[i], msg, &mut pending[i], &stats, &mut sent).await {
            break;
        }
        for p in &mut pending {
            p.reap(&stats);
        }
    }
    for p in &mut pending {
        p.drain(&stats).await;
    }
    drop(conn);
    PubResult { wire_id: u32::MAX, sent, last_ns: clock.now_ns(), topic: String::new() }
}

/// Reads and checks `--topics-payload`.
fn load_spec(args: &PubArgs) -> Result<Option<TopicSpec>, String> {
    let Some(path) = &args.topics_payload else { return Ok(None) };
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let spec = TopicSpec::parse(&text)?;
    if spec.uses_streams() && !args.common.transport.quic {
        eprintln!(
            "warning: --topics-payload: \"stream\" and \"stream_priority\" select QUIC streams; this transport (TCP) has \
             one byte stream, so they are ignored"
        );
    }
    if spec.topics.iter().any(|t| t.payload_encoding == "eterm") {
        eprintln!("warning: --topics-payload: payload_encoding \"eterm\" is sent as JSON");
    }
    Ok(Some(spec))
}

/// `braid bench pub`
pub(crate) async fn run(args: PubArgs) -> Result<Summary, String> {
    let common = &args.common;
    let spec = load_spec(&args)?;
    let stats = Arc::new(Stats::new());
    let start = Instant::now();
    let _ticker = Ticker::start(stats.clone(), start, common.json, common.quiet);
    let stop = Stop::new();
    stop.on_ctrl_c();
    let window = if args.inflight == 0 { u16::MAX as u32 } else { args.inflight.min(u16::MAX as u32) };
    let sub_qos = args.sub_qos.unwrap_or(args.qos);

    // Subscribers first, so they see every message.
    let mut subs = None;
    if args.sub > 0 {
        let filters: Vec<String> = match (&args.sub_topic, &spec, &args.topic) {
            (Some(f), _, _) => vec![f.clone()],
            (None, Some(spec), _) => {
                let mut f: Vec<String> = spec.topics.iter().map(|t| default_sub_filter(&t.name)).collect();
                f.dedup();
                f
            }
            (None, None, Some(t)) => vec![default_sub_filter(t)],
            (None, None, None) => unreachable!("clap requires -t or --topics-payload"),
        };
        // Subscriber client ids must not collide with the publishers' (%i of both start at -n).
        let s = Subscribers::start(
            common,
            common.start_number as u64,
            args.sub,
            &filters,
            &[],
            sub_qos,
            args.receive_maximum,
            &stats,
            &stop,
        )
        .await;
        if s.len() == 0 {
            return Err("no subscriber could connect".into());
        }
        subs = Some(s);
    }

    let connected = conn::connect_many(
        common,
        "pub",
        common.start_number as u64,
        common.count,
        u16::MAX,
        window as u16,
        &stats,
        &stop,
    )
    .await;
    let n_pubs = connected.clients.len();
    let clients: Vec<Client> = connected.clients.iter().map(|c| c.client.clone()).collect();
    let limit = Arc::new(Limit { left: AtomicU64::new(args.limit), unlimited: args.limit == 0 });
    let username = common.username.clone().unwrap_or_default();
    let plain = Plain {
        topic: args.topic.clone().unwrap_or_default(),
        qos: sub::qos(args.qos),
        retain: args.retain,
        size: args.size,
        interval: Duration::from_millis(args.interval_of_msg),
        window: window as usize,
    };

    // Everyone starts publishing now; --duration counts from here.
    stop.after(common.duration);
    let clock = Clock::global();
    let pub_start_ns = clock.now_ns();
    let mut tasks = JoinSet::new();
    for c in connected.clients {
        let vars = Vars { seq: c.seq, client_id: &c.client_id, username: &username };
        match &spec {
            Some(spec) => {
                let topics: Vec<RenderedTopic> = spec.topics.iter().map(|t| t.render_for(vars)).collect();
                let clients = topic_clients(&c, &topics, common.transport.quic).await?;
                tasks.spawn(run_spec(
                    c,
                    clients,
                    topics,
                    limit.clone(),
                    stats.clone(),
                    stop.clone(),
                    window as usize,
                ));
            }
            None => {
                let p = Plain { topic: super::spec::render_topic(&plain.topic, vars), ..plain };
                // The id on the wire: the short stamp carries 16 bits.
                let wire_id =
                    if args.size >= payload::LONG_LEN { c.seq as u32 } else { c.seq as u32 & 0xFFFF };
                tasks.spawn(run_plain(c, wire_id, Arc::new(p), limit.clone(), stats.clone(), stop.clone()));
            }
        }
    }
    let mut results = Vec::with_capacity(n_pubs);
    while let Some(r) = tasks.join_next().await {
        if let Ok(r) = r {
            results.push(r);
        }
    }
    let pub_end_ns = results.iter().map(|r| r.last_ns).max().unwrap_or(pub_start_ns);
    let published = stats.get(Counter::Pub);
    let sent_total: u64 = results.iter().map(|r| r.sent).sum();

    let sub_connect_secs = subs.as_ref().map_or(0.0, |s| s.connect_secs);
    let mut s = conn::base_summary("pub", common, &stats, connected.secs + sub_connect_secs);
    s.publishers = n_pubs as u64;
    s.qos = spec.as_ref().map_or(args.qos, |t| t.topics.iter().map(|t| t.qos).max().unwrap_or(0));
    s.payload_size = if spec.is_some() { 0 } else { args.size };
    s.spec_topics = spec.as_ref().map_or(0, |t| t.topics.len());
    s.inflight = window;
    s.receive_maximum = args.receive_maximum;
    s.pub_secs = pub_end_ns.saturating_sub(pub_start_ns) as f64 / 1e9;
    s.pub_rate = report::rate(published, s.pub_secs);

    if let Some(subs) = subs {
        let n_subs = subs.len() as u64;
        // With -t, each subscriber expects what the publishers sent on topics its filters match
        // (all of it for `bench/+`, its own publisher's for `bench/p/%i`); with a spec, all.
        let per_sub = spec.is_none().then(|| {
            let pubs: Vec<(u32, u64, &str)> =
                results.iter().map(|r| (r.wire_id, r.sent, r.topic.as_str())).collect();
            expected_per_subscriber(&subs.filters, &pubs)
        });
        let expected = match &per_sub {
            Some(per_sub) => per_sub.iter().flat_map(|e| e.iter()).map(|&(_, n)| n).sum(),
            None => sent_total * n_subs,
        };
        // Wait for the deliveries still under way.
        let drain = Duration::from_secs_f64(args.drain_timeout.max(0.0));
        let mut last = (stats.get(Counter::Recv), Instant::now());
        while last.0 < expected && last.1.elapsed() < drain {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = stats.get(Counter::Recv);
            if now != last.0 {
                last = (now, Instant::now());
            }
        }
        conn::disconnect_all(clients).await;
        let sub_results = subs.finish().await;
        let sent = per_sub.filter(|_| args.size >= payload::SHORT_LEN);
        s.subscribers = n_subs;
        s.expected = expected;
        sub::fill_receive(&mut s, &sub_results, &stats, sent.as_deref(), pub_start_ns);
        if sent.is_none() {
            // No sequence numbers: whatever did not arrive is lost.
            s.lost = expected.saturating_sub(s.received);
        }
    } else {
        conn::disconnect_all(clients).await;
    }
    s.connect_succ = stats.get(Counter::ConnectSucc);
    s.elapsed_secs = start.elapsed().as_secs_f64();
    Ok(s)
}

/// What each subscriber should receive, from its rendered filters (`filters[i]`, subscriber i's)
/// and the publishers' (wire id, messages sent, topic): every publisher whose topic one of its
/// filters matches. Subscribers with the same filters share one list.
fn expected_per_subscriber(filters: &[Vec<String>], pubs: &[(u32, u64, &str)]) -> Vec<sub::Expected> {
    let mut lists: std::collections::HashMap<&[String], sub::Expected> = std::collections::HashMap::new();
    filters
        .iter()
        .map(|f| {
            lists
                .entry(f.as_slice())
                .or_insert_with(|| {
                    pubs.iter()
                        .filter(|(_, _, topic)| f.iter().any(|f| braid_proto::topic::matches(f, topic)))
                        .map(|&(id, n, _)| (id, n))
                        .collect()
                })
                .clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribers_expect_what_their_filters_match() {
        let pubs = [(0, 10, "bench/p/0"), (1, 20, "bench/p/1"), (2, 30, "bench/p/2")];
        // --sub-topic bench/p/%i: subscriber i hears publisher i alone.
        let pairs: Vec<Vec<String>> = (0..3).map(|i| vec![format!("bench/p/{i}")]).collect();
        let e = expected_per_subscriber(&pairs, &pubs);
        assert_eq!(
            e.iter().map(|e| e.to_vec()).collect::<Vec<_>>(),
            [vec![(0, 10)], vec![(1, 20)], vec![(2, 30)]]
        );
        // A wildcard filter: everyone hears everything, one shared list.
        let fan = vec![vec!["bench/#".to_string()]; 2];
        let e = expected_per_subscriber(&fan, &pubs);
        assert_eq!(e[0].iter().map(|&(_, n)| n).sum::<u64>(), 60);
        assert!(Arc::ptr_eq(&e[0], &e[1]));
        // No match, nothing expected.
        assert!(expected_per_subscriber(&[vec!["other".to_string()]], &pubs)[0].is_empty());
    }
}
