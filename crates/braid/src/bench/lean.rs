//! `braid bench conn` over plain TCP without braid-client, so that one process holds as many
//! connections as it has file descriptors at about 1 KB of its own memory each: one small task
//! per connection on a raw socket, packets encoded and decoded by braid-proto.
//!
//! Reads go into one scratch buffer per worker thread; whole packets are handled from it and only
//! a packet split across reads is copied into a buffer of the connection's own, freed as soon as
//! the packet is complete. An idle connection therefore holds no read buffer at all. Each client
//! sends PINGREQ every keep alive, optionally publishes a stamped message to its own topic every
//! `-I` ms, counts the PUBLISHes it receives (broadcast filters apart) with their latency, and
//! takes part in reconnect storms.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use braid_proto::{
    decode, encode, packet_size, topic, ByteString, BytesMut, Connect, DecodeError, Disconnect, Packet,
    Properties, ProtocolVersion, Publish, QoS, ReasonCode, Subscribe, SubscriptionOptions,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, Semaphore};

use super::args::{CommonArgs, ConnArgs};
use super::conn::{self, Stop};
use super::payload::{self, Clock};
use super::report::{Latency, Summary, Ticker};
use super::spec::{has_client_variable, render_topic, Vars};
use super::stats::{Counter, Stats};

/// Bytes of the per-thread scratch read buffer.
const SCRATCH: usize = 64 * 1024;
/// Time allowed for TCP connect, CONNACK and SUBACK.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts of a client to come back after a reconnect storm.
const STORM_ATTEMPTS: u32 = 20;
/// The control value that ends the run; any other value is the number of storms so far.
const STOP: u32 = u32::MAX;

thread_local! {
    static BUF: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH].into_boxed_slice());
}

/// What the clients are told: a number that changes at each reconnect storm ([`STOP`] ends the
/// run), and a waker slot per client woken at each change. 24 bytes a client, where a watch
/// receiver would put a 120-byte future in every task.
struct Control {
    value: AtomicU32,
    wakers: Vec<Mutex<Option<Waker>>>,
}

impl Control {
    fn new(clients: usize) -> Control {
        Control { value: AtomicU32::new(0), wakers: (0..clients).map(|_| Mutex::new(None)).collect() }
    }

    fn get(&self) -> u32 {
        self.value.load(Ordering::SeqCst)
    }

    /// Sets the value and wakes every client.
    fn set(&self, value: u32) {
        self.value.store(value, Ordering::SeqCst);
        for w in &self.wakers {
            if let Some(w) = w.lock().unwrap_or_else(|e| e.into_inner()).take() {
                w.wake();
            }
        }
    }

    /// Ready with the value once it differs from `seen`; client `slot` is woken at the change.
    fn poll_changed(&self, slot: usize, seen: u32, cx: &mut Context<'_>) -> Poll<u32> {
        let v = self.get();
        if v != seen {
            return Poll::Ready(v);
        }
        let mut w = self.wakers[slot].lock().unwrap_or_else(|e| e.into_inner());
        match &mut *w {
            Some(w) => w.clone_from(cx.waker()),
            None => *w = Some(cx.waker().clone()),
        }
        drop(w);
        let v = self.get();
        if v != seen {
            Poll::Ready(v)
        } else {
            Poll::Pending
        }
    }
}

/// Everything the clients share.
struct Plan {
    addr: SocketAddr,
    ifaddrs: Vec<IpAddr>,
    version: ProtocolVersion,
    common: CommonArgs,
    /// -t templates.
    filters: Vec<String>,
    /// The -t filters without a variable: their messages are broadcast.
    broadcast: Vec<String>,
    pub_interval: Duration,
    filler: Vec<u8>,
    gate: Semaphore,
    start: Instant,
    stats: Arc<Stats>,
    /// Broadcast messages: `Recv` and latency.
    bcast: Stats,
    /// Clients connected and subscribed now.
    connected: AtomicU64,
    /// Clients that finished their first handshake, failed or not.
    settled: AtomicU64,
    /// ns from `start` to the last first-time CONNACK/SUBACK.
    last_ready_ns: AtomicU64,
    /// Clients back after the current storm, failed to come back, and when the last came back.
    storm_back: AtomicU64,
    storm_failed: AtomicU64,
    storm_last_ns: AtomicU64,
    /// Client tasks alive.
    live: AtomicU64,
    control: Control,
}

impl Plan {
    fn since_start_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn client_id(&self, seq: u64) -> String {
        conn::client_id(&self.common, "conn", seq)
    }

    fn topics(&self, seq: u64) -> Vec<String> {
        let id = self.client_id(seq);
        let vars =
            Vars { seq, client_id: &id, username: self.common.username.as_deref().unwrap_or_default() };
        self.filters.iter().map(|f| render_topic(f, vars)).collect()
    }
}

/// Why a connection ended.
enum End {
    Stop,
    Storm,
    Lost,
}

/// The encoding of `packet`.
fn encoded(packet: &Packet, version: ProtocolVersion) -> io::Result<BytesMut> {
    let mut buf = BytesMut::new();
    encode(packet, version, &mut buf).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(buf)
}

/// Encodes `packet` and writes it.
async fn send(stream: &mut TcpStream, packet: &Packet, version: ProtocolVersion) -> io::Result<()> {
    stream.write_all(&encoded(packet, version)?).await
}

/// The next packet a holding client sends: its `published`-th stamped message to its own topic
/// (`publish`), or PINGREQ. Encoded here, so that no packet lives in the task while it writes.
fn tick(plan: &Plan, seq: u64, publish: bool, published: u64) -> io::Result<BytesMut> {
    let packet = if publish {
        let mut payload = BytesMut::with_capacity(plan.filler.len());
        payload::write_stamped(&mut payload, &plan.filler, seq as u32, published, Clock::global().now_ns());
        let topic = plan.topics(seq).swap_remove(0);
        Packet::Publish(Publish { topic: topic.into(), payload: payload.freeze(), ..Default::default() })
    } else {
        Packet::PingReq
    };
    encoded(&packet, plan.version)
}

/// Reads until one packet is decoded from `buf` (which may keep bytes that followed it).
async fn next_packet(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    version: ProtocolVersion,
) -> io::Result<Packet> {
    loop {
        if let Some(p) = decode(buf, version, u32::MAX).map_err(|e| io::Error::other(e.to_string()))? {
            return Ok(p);
        }
        buf.reserve(256);
        if stream.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// A connected and subscribed client: its socket, the bytes read past SUBACK, its keep alive.
struct Session {
    stream: TcpStream,
    carry: BytesMut,
    keep_alive: u16,
}

/// A failed [`open`]: why, and whether CONNACK had come (the subscription failed).
struct OpenError {
    why: String,
    acked: bool,
}

/// A `--max-connecting` permit, taken and forgotten ([`tokio::sync::SemaphorePermit::forget`]),
/// given back when dropped: the ramp takes it before it spawns a client, so that only clients
/// connecting or connected exist.
struct Slot<'a>(&'a Semaphore);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.add_permits(1);
    }
}

/// Takes a `--max-connecting` permit, to be given back by a [`Slot`].
async fn take_slot(gate: &Semaphore) {
    if let Ok(p) = gate.acquire().await {
        p.forget();
    }
}

/// TCP connect, CONNECT/CONNACK and SUBSCRIBE/SUBACK, holding a `--max-connecting` permit that
/// it gives back. `first` records the CONNACK time and the counters of the ramp.
async fn open(plan: &Plan, seq: u64, first: bool) -> Result<Session, OpenError> {
    let acked = std::sync::atomic::AtomicBool::new(false);
    open_counted(plan, seq, first, &acked)
        .await
        .map_err(|why| OpenError { why, acked: acked.load(Ordering::Relaxed) })
}

async fn open_counted(
    plan: &Plan,
    seq: u64,
    first: bool,
    acked: &std::sync::atomic::AtomicBool,
) -> Result<Session, String> {
    let _slot = Slot(&plan.gate);
    let socket = if plan.addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }
        .map_err(|e| e.to_string())?;
    if !plan.ifaddrs.is_empty() {
        let local = plan.ifaddrs[seq as usize % plan.ifaddrs.len()];
        socket.bind(SocketAddr::new(local, 0)).map_err(|e| format!("bind {local}: {e}"))?;
    }
    let t0 = Instant::now();
    let version = plan.version;
    let handshake = async {
        let mut stream = socket.connect(plan.addr).await.map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let c = &plan.common;
        let mut properties = Properties::default();
        if let Some(e) = c.session_expiry.filter(|_| version.is_v5()) {
            properties.session_expiry_interval = Some(e);
        }
        let connect = Connect {
            protocol: version,
            clean_start: c.clean,
            keep_alive: c.keepalive,
            properties,
            client_id: plan.client_id(seq).into(),
            will: None,
            username: c.username.clone().map(ByteString::from),
            password: c.password.clone().map(|p| p.into_bytes().into()),
        };
        send(&mut stream, &Packet::Connect(Box::new(connect)), version).await.map_err(|e| e.to_string())?;
        let mut buf = BytesMut::new();
        let mut keep_alive = c.keepalive;
        match next_packet(&mut stream, &mut buf, version).await.map_err(|e| e.to_string())? {
            Packet::ConnAck(a) if !a.reason.is_error() => {
                keep_alive = a.properties.server_keep_alive.unwrap_or(keep_alive);
            }
            Packet::ConnAck(a) => return Err(format!("refused: {:?}", a.reason)),
            p => return Err(format!("{} instead of CONNACK", p.name())),
        }
        acked.store(true, Ordering::Relaxed);
        if first {
            plan.stats.record_connect(t0.elapsed().as_nanos() as u64);
            plan.stats.inc(Counter::ConnectSucc);
        }
        if !plan.filters.is_empty() {
            let opts = SubscriptionOptions { qos: QoS::AtMostOnce, ..Default::default() };
            let filters = plan.topics(seq).into_iter().map(|t| (ByteString::from(t), opts)).collect();
            let sub = Subscribe { packet_id: 1, properties: Properties::default(), filters };
            send(&mut stream, &Packet::Subscribe(sub), version).await.map_err(|e| e.to_string())?;
            let ok = match next_packet(&mut stream, &mut buf, version).await.map_err(|e| e.to_string())? {
                Packet::SubAck(a) => a.reasons.iter().all(|r| !r.is_error()),
                p => return Err(format!("{} instead of SUBACK", p.name())),
            };
            if first {
                plan.stats.inc(if ok { Counter::Sub } else { Counter::SubFail });
            }
            if !ok {
                return Err("subscription refused".into());
            }
        }
        // Keep the handshake's buffer only if bytes followed SUBACK.
        let carry = if buf.is_empty() { BytesMut::new() } else { buf };
        Ok(Session { stream, carry, keep_alive })
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(r) => r,
        Err(_) => Err("timed out".into()),
    }
}

/// Handles the whole packets at the front of `buf`; returns the bytes used. An error (a
/// malformed packet, or DISCONNECT from the broker) ends the connection.
fn consume(plan: &Plan, seq: u64, buf: &[u8]) -> Result<usize, DecodeError> {
    let mut pos = 0;
    while let Some(size) = packet_size(&buf[pos..])? {
        if buf.len() - pos < size {
            break;
        }
        let mut frame = BytesMut::from(&buf[pos..pos + size]);
        pos += size;
        match decode(&mut frame, plan.version, u32::MAX)? {
            Some(Packet::Publish(p)) => received(plan, seq, &p),
            Some(Packet::Disconnect(_)) => return Err(DecodeError::Malformed("DISCONNECT from the broker")),
            _ => {}
        }
    }
    Ok(pos)
}

/// Counts one message and its latency (own topic or broadcast).
fn received(plan: &Plan, seq: u64, p: &Publish) {
    let now = Clock::global().now_ns();
    plan.stats.inc(Counter::Recv);
    let broadcast = plan.broadcast.iter().any(|f| topic::matches(f, &p.topic));
    let stats = if broadcast { &plan.bcast } else { &*plan.stats };
    if broadcast {
        stats.inc(Counter::Recv);
    }
    let latency = match payload::parse(&p.payload) {
        Some(stamp) => stamp.latency_ns(now),
        None => payload::parse_json_timestamp(&p.payload).and_then(|sent| now.checked_sub(sent)),
    };
    if let Some(ns) = latency {
        stats.record_latency(seq as usize, ns);
    }
}

/// One read, once the socket is readable. `Ok(false)` at end of stream.
fn read_some(plan: &Plan, seq: u64, s: &mut Session) -> io::Result<bool> {
    let invalid = |e: DecodeError| io::Error::new(io::ErrorKind::InvalidData, e.to_string());
    if !s.carry.is_empty() {
        // The rest of a split packet: into the connection's own buffer.
        s.carry.reserve(4096);
        match s.stream.try_read_buf(&mut s.carry) {
            Ok(0) => return Ok(false),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) => return Err(e),
        }
        let used = consume(plan, seq, &s.carry).map_err(invalid)?;
        let _ = s.carry.split_to(used);
        if s.carry.is_empty() {
            s.carry = BytesMut::new();
        }
        return Ok(true);
    }
    BUF.with_borrow_mut(|buf| {
        let n = match s.stream.try_read(buf) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) => return Err(e),
        };
        let used = consume(plan, seq, &buf[..n]).map_err(invalid)?;
        s.carry.extend_from_slice(&buf[used..n]);
        Ok(true)
    })
}

/// Holds a connection: reads, PINGREQ every keep alive, publishes every `-I`, until the end of
/// the run, a storm or the loss of the connection.
async fn hold(plan: &Plan, seq: u64, s: &mut Session, seen: u32) -> End {
    // Bytes read with SUBACK (a retained message, say).
    if !s.carry.is_empty() {
        match consume(plan, seq, &s.carry) {
            Ok(used) => {
                let _ = s.carry.split_to(used);
            }
            Err(_) => return End::Lost,
        }
    }
    let far = Duration::from_secs(86_400 * 365);
    let keep_alive = if s.keep_alive > 0 { Duration::from_secs(s.keep_alive as u64) } else { far };
    let now = tokio::time::Instant::now();
    let mut next_ping = now + keep_alive;
    // Publishers spread over one interval.
    let mut next_pub = if plan.pub_interval.is_zero() {
        now + far
    } else {
        now + plan.pub_interval.mul_f64((seq % 1000) as f64 / 1000.0)
    };
    let mut published = 0u64;
    loop {
        tokio::select! {
            // poll_read_ready: the waker waits in the socket's registration, not in this task.
            r = poll_fn(|cx| s.stream.poll_read_ready(cx)) => {
                match r.and_then(|()| read_some(plan, seq, s)) {
                    Ok(true) => {}
                    _ => return End::Lost,
                }
            }
            _ = tokio::time::sleep_until(next_ping.min(next_pub)) => {
                let now = tokio::time::Instant::now();
                let publish = now >= next_pub;
                let Ok(buf) = tick(plan, seq, publish, published) else { return End::Lost };
                if s.stream.write_all(&buf).await.is_err() {
                    return End::Lost;
                }
                if publish {
                    next_pub += plan.pub_interval;
                    published += 1;
                    plan.stats.inc(Counter::Pub);
                }
                next_ping = now + keep_alive;
            }
            v = poll_fn(|cx| plan.control.poll_changed(slot(plan, seq), seen, cx)) => {
                return if v == STOP { End::Stop } else { End::Storm };
            }
        }
    }
}

/// The control slot of client `seq`.
fn slot(plan: &Plan, seq: u64) -> usize {
    (seq - plan.common.start_number as u64) as usize
}

/// One client, from its first connect (with the permit the ramp took for it) to the end of
/// the run.
async fn client(plan: Arc<Plan>, seq: u64) {
    let mut first = true;
    'run: loop {
        let mut attempt = 0;
        let mut session = loop {
            if !first || attempt > 0 {
                take_slot(&plan.gate).await;
            }
            // Boxed: the handshake's state does not stay in the task for the connection's life.
            match Box::pin(open(&plan, seq, first)).await {
                Ok(s) => break s,
                Err(e) if first => {
                    if !e.acked {
                        plan.stats.inc(Counter::ConnectFail);
                    }
                    plan.settled.fetch_add(1, Ordering::Relaxed);
                    eprintln!("client({seq}): connect error - {}", e.why);
                    break 'run;
                }
                Err(e) => {
                    attempt += 1;
                    if attempt == STORM_ATTEMPTS || plan.control.get() == STOP {
                        plan.storm_failed.fetch_add(1, Ordering::Relaxed);
                        eprintln!("client({seq}): reconnect error - {}", e.why);
                        break 'run;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        };
        let at = plan.since_start_ns();
        if first {
            plan.last_ready_ns.fetch_max(at, Ordering::Relaxed);
            plan.settled.fetch_add(1, Ordering::Relaxed);
            first = false;
        } else {
            plan.storm_last_ns.fetch_max(at, Ordering::Relaxed);
            plan.storm_back.fetch_add(1, Ordering::Relaxed);
        }
        plan.connected.fetch_add(1, Ordering::Relaxed);
        let seen = plan.control.get();
        let end = if seen == STOP { End::Stop } else { hold(&plan, seq, &mut session, seen).await };
        plan.connected.fetch_sub(1, Ordering::Relaxed);
        match end {
            End::Storm => drop(session),
            End::Stop => {
                let bye = Packet::Disconnect(Disconnect {
                    reason: ReasonCode::Success,
                    properties: Properties::default(),
                });
                if let Ok(bye) = encoded(&bye, plan.version) {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), session.stream.write_all(&bye)).await;
                }
                break;
            }
            End::Lost => {
                plan.stats.inc(Counter::Disconnected);
                break;
            }
        }
    }
    plan.live.fetch_sub(1, Ordering::Relaxed);
}

/// VmRSS of this process in bytes (0 where /proc is missing).
fn rss_bytes() -> u64 {
    braid_broker::limits::resident_memory().unwrap_or(0)
}

/// Polls `done` every 20 ms until it holds or the run stops.
async fn until(stop: &Stop, done: impl Fn() -> bool) {
    while !done() && !stop.is_set() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints a progress line (to stderr when stdout carries JSON).
fn say(json: bool, line: String) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// `braid bench conn` over plain TCP.
pub(crate) async fn run(args: ConnArgs) -> Result<Summary, String> {
    let common = args.common;
    let port = common.port.unwrap_or(common.transport.default_port());
    let addr = tokio::net::lookup_host((common.host.as_str(), port))
        .await
        .map_err(|e| format!("{}: {e}", common.host))?
        .next()
        .ok_or_else(|| format!("{}: no address", common.host))?;
    let version = common.protocol();
    let broadcast = args.topics.iter().filter(|t| !has_client_variable(t)).cloned().collect();
    if args.interval_of_msg > 0 && args.topics.is_empty() {
        return Err("-I needs a -t topic to publish to".into());
    }
    let stats = Arc::new(Stats::new());
    let start = Instant::now();
    let plan = Arc::new(Plan {
        addr,
        ifaddrs: args.ifaddr,
        version,
        filters: args.topics,
        broadcast,
        pub_interval: Duration::from_millis(args.interval_of_msg),
        filler: vec![b'a'; args.size],
        gate: Semaphore::new(common.max_connecting.max(1)),
        start,
        stats: stats.clone(),
        bcast: Stats::new(),
        connected: AtomicU64::new(0),
        settled: AtomicU64::new(0),
        last_ready_ns: AtomicU64::new(0),
        storm_back: AtomicU64::new(0),
        storm_failed: AtomicU64::new(0),
        storm_last_ns: AtomicU64::new(0),
        live: AtomicU64::new(0),
        control: Control::new(common.count as usize),
        common: common.clone(),
    });
    let json = common.json;
    let _ticker = Ticker::start(stats.clone(), start, json, common.quiet);
    let stop = Stop::new();
    stop.on_ctrl_c();
    let rss_start = rss_bytes();

    // The ramp.
    let interval = Duration::from_millis(common.interval_ms);
    let mut spawned = 0u64;
    for n in 0..common.count as u64 {
        if stop.is_set() {
            break;
        }
        if n > 0 && !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
        take_slot(&plan.gate).await;
        plan.live.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(client(plan.clone(), common.start_number as u64 + n));
        spawned += 1;
    }
    until(&stop, || plan.settled.load(Ordering::Relaxed) >= spawned).await;
    let connect_secs = plan.last_ready_ns.load(Ordering::Relaxed) as f64 / 1e9;
    let rss = rss_bytes();
    let ok = plan.connected.load(Ordering::Relaxed).max(1);
    say(
        json,
        format!(
            "connected: {} ok, {} failed in {connect_secs:.2}s; tool RSS {} B per connection",
            stats.get(Counter::ConnectSucc),
            stats.get(Counter::ConnectFail),
            rss / ok
        ),
    );

    // Holding, with storms on request.
    stop.after(common.duration);
    let (storm_tx, mut storm_rx) = mpsc::channel::<()>(1);
    if let Some(after) = args.storm_after {
        let tx = storm_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(after)).await;
            let _ = tx.send(()).await;
        });
    }
    #[cfg(unix)]
    if let Ok(mut usr1) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()) {
        tokio::spawn(async move {
            while usr1.recv().await.is_some() {
                let _ = storm_tx.try_send(());
            }
        });
    }
    let (mut storm_clients, mut storm_back, mut storm_secs) = (0, 0, 0.0);
    loop {
        tokio::select! {
            _ = stop.wait() => break,
            Some(()) = storm_rx.recv() => {
                storm_clients = plan.connected.load(Ordering::Relaxed);
                plan.storm_back.store(0, Ordering::Relaxed);
                plan.storm_failed.store(0, Ordering::Relaxed);
                let t0 = plan.since_start_ns();
                plan.storm_last_ns.store(t0, Ordering::Relaxed);
                say(json, format!("storm: {storm_clients} clients drop their connection"));
                plan.control.set(plan.control.get() + 1);
                until(&stop, || {
                    plan.storm_back.load(Ordering::Relaxed) + plan.storm_failed.load(Ordering::Relaxed)
                        >= storm_clients
                })
                .await;
                storm_back = plan.storm_back.load(Ordering::Relaxed);
                storm_secs = plan.storm_last_ns.load(Ordering::Relaxed).saturating_sub(t0) as f64 / 1e9;
                say(json, format!("storm: {storm_back} of {storm_clients} back in {storm_secs:.2}s"));
            }
        }
    }
    // The clients say DISCONNECT and close; the counts are taken once they are done.
    plan.control.set(STOP);
    let closing = Instant::now();
    while plan.live.load(Ordering::Relaxed) > 0 && closing.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut s = conn::base_summary("conn", &common, &stats, connect_secs);
    s.latency_ns = Latency::of(&stats.latency());
    s.broadcast_received = plan.bcast.get(Counter::Recv);
    s.broadcast_latency_ns = Latency::of(&plan.bcast.latency());
    s.tool_rss_bytes = rss;
    s.tool_rss_per_conn_bytes = rss / ok;
    s.tool_rss_added_per_conn_bytes = rss.saturating_sub(rss_start) / ok;
    (s.storm_clients, s.storm_back, s.storm_secs) = (storm_clients, storm_back, storm_secs);
    s.elapsed_secs = start.elapsed().as_secs_f64();
    Ok(s)
}
