//! Stress: 2000 hostile connections (slow-loris, silent sockets, garbage after CONNECT,
//! connect/close churn) interleaved with a legitimate QoS 1 stream. The test asserts that the
//! stream loses nothing and is not starved: no message takes [`STARVED`] or longer. Its p99
//! next to a quiet run's (the bar: within 2x) is a benchmark, the ignored
//! [`p99_under_2000_hostile_connections`] (docs/security.md runs it): it depends on the machine
//! and on what else runs there, so it is measured on purpose, not in the test suite.
//!
//! The attackers run in a child process (this test binary again, running the ignored test
//! [`hostile_connections`] with `BRAID_STRESS_ATTACK` set), as they would on other machines:
//! their CPU is not the broker process's. They still share this machine's cores, so by default
//! the child runs at the lowest priority (nice 19): on a 2-core machine the CPU the attackers
//! burn themselves would otherwise be measured as well as what the broker does with their
//! connections. `BRAID_STRESS_ATTACKERS_NICE=0` runs them at normal priority instead (the
//! figures in docs/security.md give both). The broker logs at `info` as the binary does by
//! default (to a file here), so what it logs per hostile connection is paid for in the
//! measurement.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOSTILE: usize = 2000;
/// Messages per measured run (at ~1 kHz): the p99 is the 50th worst.
const MESSAGES: u32 = 5000;
/// Messages sent first and not measured: the first ones pay for cold caches and allocations.
const WARM_UP: u32 = 500;
/// `limits.max_connection_rate` for the run.
const RATE: u32 = 200;
/// The bound on each message of the stream under attack. A stream starved by the hostile
/// connections (a worker busy with them, clients waiting behind their handshakes) waits
/// seconds: a slow-loris CONNECT lasts `mqtt.connect_timeout_secs` (2 s here). Served, the
/// worst of 5000 messages takes a few ms, in a debug build on a busy 2-core machine too.
const STARVED: Duration = Duration::from_millis(500);
/// Set (to the broker's address) in the attackers' process.
const ATTACK_ENV: &str = "BRAID_STRESS_ATTACK";
/// The attackers stop by themselves after this, whatever happens to the test.
const ATTACK_DEADLINE: Duration = Duration::from_secs(120);
/// The attackers' nice value, if not 19 (the lowest priority, other machines' stand-in).
const NICE_ENV: &str = "BRAID_STRESS_ATTACKERS_NICE";

/// The nice value the attackers' process runs at.
fn attackers_nice() -> i32 {
    std::env::var(NICE_ENV).map_or(19, |n| n.parse().expect("BRAID_STRESS_ATTACKERS_NICE: a nice value"))
}

/// The legitimate publisher and subscriber, connected.
struct Legit {
    publisher: TestClient,
    /// Taken by the receiving task while a stream runs.
    sub: Option<TestClient>,
    base: Instant,
}

const TOPIC: &str = "legit/stream";

impl Legit {
    async fn connect(addr: SocketAddr) -> Legit {
        let (mut sub, _) = TestClient::connect_ok(addr, V5, connect_packet("legit-sub", true)).await;
        sub.subscribe(TOPIC, QoS::AtLeastOnce).await;
        let (publisher, _) = TestClient::connect_ok(addr, V5, connect_packet("legit-pub", true)).await;
        Legit { publisher, sub: Some(sub), base: Instant::now() }
    }

    /// Runs `count` messages of the QoS 1 stream; returns their sorted end-to-end latencies
    /// (asserting none was lost).
    async fn stream(&mut self, count: u32) -> Vec<Duration> {
        let base = self.base;
        let mut sub = self.sub.take().unwrap();
        let receiver = tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(count as usize);
            for expected in 0..count {
                let p = match sub.recv_within(Duration::from_secs(30)).await {
                    Recv::Packet(Packet::Publish(p)) => p,
                    other => panic!("message {expected}: {other:?}"),
                };
                let (seq, sent) = p.payload.split_at(4);
                assert_eq!(u32::from_be_bytes(seq.try_into().unwrap()), expected, "lost or reordered");
                let sent = Duration::from_nanos(u64::from_be_bytes(sent.try_into().unwrap()));
                latencies.push(base.elapsed() - sent);
                sub.send(Packet::PubAck(Ack::new(p.packet_id))).await;
            }
            (sub, latencies)
        });
        for seq in 0..count {
            let mut payload = seq.to_be_bytes().to_vec();
            payload.extend_from_slice(&(base.elapsed().as_nanos() as u64).to_be_bytes());
            let id = (seq % 60_000 + 1) as u16;
            self.publisher.publish_and_ack(TOPIC, QoS::AtLeastOnce, &payload, id).await;
            // A steady stream, not a saturating one: ~1000 messages/s.
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let (sub, mut latencies) = receiver.await.unwrap();
        self.sub = Some(sub);
        latencies.sort();
        latencies
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// The attackers' process, started and stopped by the stress test.
struct Attack {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Attack {
    /// Starts the attackers against `addr`; returns once they have opened [`HOSTILE`]
    /// connections (or after 10 s).
    fn start(addr: SocketAddr) -> Attack {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args(["--exact", "hostile_connections", "--ignored", "--nocapture", "--test-threads", "1"])
            .env(ATTACK_ENV, addr.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the attackers' process");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let ready = Attack::line(&mut stdout, "ready");
        assert!(ready.is_some(), "the attackers' process did not start");
        Attack { child, stdout }
    }

    /// What follows `attack: {what}` in the child's next such report (the harness may have
    /// printed on the same line before it).
    fn line(stdout: &mut BufReader<ChildStdout>, what: &str) -> Option<String> {
        let prefix = format!("attack: {what}");
        stdout
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.split_once(&prefix).map(|(_, rest)| rest.trim().to_string()))
    }

    /// Stops the attackers (closing their stdin); returns how many connections they opened.
    fn stop(mut self) -> u64 {
        drop(self.child.stdin.take());
        let total = Attack::line(&mut self.stdout, "opened").and_then(|n| n.parse().ok()).unwrap_or(0);
        let _ = self.child.wait();
        total
    }
}

/// The broker of the stress runs, logging at `info` to a file in the returned directory.
async fn stress_broker() -> (TestBroker, tempfile::TempDir) {
    let log_dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(log_dir.path().join("broker.log")).unwrap();
    // Once per process (the benchmark may run in the same one).
    let _ = tracing_subscriber::fmt().with_writer(std::sync::Mutex::new(log)).with_ansi(false).try_init();

    let mut config = Config::embedded();
    config.mqtt.connect_timeout_secs = 2;
    // The defence against connection churn: newcomers beyond this wait in the backlog.
    config.limits.max_connection_rate = RATE;
    (start(config).await, log_dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legitimate_qos1_stream_survives_2000_hostile_connections() {
    let (b, _log_dir) = stress_broker().await;
    let mut legit = Legit::connect(b.addr).await;
    legit.stream(WARM_UP).await;

    let addr = b.addr;
    let attack = tokio::task::spawn_blocking(move || Attack::start(addr)).await.unwrap();
    let hostile = legit.stream(MESSAGES).await;
    let total = tokio::task::spawn_blocking(move || attack.stop()).await.unwrap();

    // `stream` asserted that none was lost or reordered.
    let worst = *hostile.last().unwrap();
    println!(
        "QoS 1 stream, {MESSAGES} messages with {HOSTILE} hostile connections ({total} opened): p99 {:?}, worst {worst:?}",
        percentile(&hostile, 0.99)
    );
    assert!(worst < STARVED, "a message of the stream took {worst:?} under attack (bound {STARVED:?})");
}

/// A benchmark, not run by the test suite (docs/security.md has the command and figures): the
/// stream's p50 and p99 on a quiet broker, then next to [`HOSTILE`] hostile connections, and
/// the p99 ratio (the bar: within 2x). Best in a release build on an idle machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: cargo test --release -p braid-broker --test stress -- --ignored --nocapture p99"]
async fn p99_under_2000_hostile_connections() {
    let (b, log_dir) = stress_broker().await;
    let mut legit = Legit::connect(b.addr).await;
    legit.stream(WARM_UP).await;
    let quiet = legit.stream(MESSAGES).await;

    let addr = b.addr;
    let attack = tokio::task::spawn_blocking(move || Attack::start(addr)).await.unwrap();
    let hostile = legit.stream(MESSAGES).await;
    let total = tokio::task::spawn_blocking(move || attack.stop()).await.unwrap();
    let lines = std::fs::read_to_string(log_dir.path().join("broker.log")).unwrap().lines().count();

    let (q50, q99) = (percentile(&quiet, 0.5), percentile(&quiet, 0.99));
    let (h50, h99) = (percentile(&hostile, 0.5), percentile(&hostile, 0.99));
    println!(
        "QoS 1 stream, {MESSAGES} messages: quiet p50 {q50:?} p99 {q99:?}; with {HOSTILE} hostile connections \
         ({total} opened, {lines} log lines, attackers at nice {}) p50 {h50:?} p99 {h99:?}; p99 ratio {:.2} \
         (bar: within 2x)",
        attackers_nice(),
        h99.as_secs_f64() / q99.as_secs_f64()
    );
}

/// The attackers' process of the stress test (run by it with `BRAID_STRESS_ATTACK` set; does
/// nothing otherwise): [`HOSTILE`] hostile connections until its stdin closes. Reports
/// `attack: ready` once they are open and `attack: opened N` when stopped.
#[test]
#[ignore = "the attackers' process of the stress test, which runs it"]
fn hostile_connections() {
    let Ok(addr) = std::env::var(ATTACK_ENV) else { return };
    let addr: SocketAddr = addr.parse().expect("BRAID_STRESS_ATTACK: an address");
    // This thread runs the attackers; the threads it starts inherit its nice value.
    rustix::process::setpriority_process(None, attackers_nice()).expect("set the attackers' priority");
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    {
        let stop = stop.clone();
        // Stops on the parent's word (stdin closed) or at the deadline, whichever comes first.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        for i in 0..HOSTILE {
            tokio::spawn(attacker(addr, i, stop.clone(), opened.clone()));
        }
        let started = Instant::now();
        while (opened.load(Ordering::Relaxed) as usize) < HOSTILE
            && started.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("attack: ready");
        while !stop.load(Ordering::Relaxed) && started.elapsed() < ATTACK_DEADLINE {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    println!("attack: opened {}", opened.load(Ordering::Relaxed));
    // The attackers' sockets close with the process.
    std::process::exit(0);
}

/// One hostile connection, over and over until `stop`: kind `i % 4`.
async fn attacker(addr: SocketAddr, i: usize, stop: Arc<AtomicBool>, opened: Arc<AtomicU64>) {
    let connect = {
        let mut c = connect_packet(&format!("hostile-{i}"), true);
        c.protocol = V5;
        encode_packet(&Packet::Connect(Box::new(c)), V5)
    };
    let mut buf = [0u8; 256];
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        match i % 4 {
            // Slow-loris: one byte of CONNECT every 200 ms until the broker gives up.
            0 => {
                for b in connect.iter() {
                    if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            // Silent: connects, never speaks, waits to be closed.
            1 => {
                let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
            }
            // Garbage after a valid CONNECT.
            2 => {
                let _ = s.write_all(&connect).await;
                let _ = s.write_all(&[0xF0, 0x03, 0xDE, 0xAD, 0xBE]).await;
                let _ = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            // Churn: CONNECT, then drop the socket without DISCONNECT.
            _ => {
                let _ = s.write_all(&connect).await;
                let _ = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await;
                drop(s);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
