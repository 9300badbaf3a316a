//! Packet traces, as EMQX's `/trace`: every packet of one client id, or every PUBLISH,
//! SUBSCRIBE and UNSUBSCRIBE of topics one filter matches, written as text lines to a file of
//! its own while the trace runs (started and stopped through the admin API, ended at its
//! deadline). While no trace runs, a connection pays one relaxed atomic load per batch of
//! packets. Lines carry the wall-clock time, read here: a trace is an I/O concern, outside the
//! protocol logic.
//!
//! A connection only formats a line and hands it to the trace's writer, a thread of its own fed
//! by a bounded queue ([`QUEUE`] lines): no file is written on a connection's packet path. When
//! the queue is full (the file is slower than the traced traffic) the line is dropped and
//! counted ([`Trace::dropped`]) instead of holding the connection up.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};
use time::format_description::FormatItem;
use time::macros::format_description;
use time::OffsetDateTime;

use braid_proto::topic::matches;
use braid_proto::{decode, BytesMut, Packet, ProtocolVersion};

/// What a trace records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Every packet of this client id, both ways.
    Client(String),
    /// Every PUBLISH whose topic this filter matches, and every SUBSCRIBE and UNSUBSCRIBE that
    /// names a filter it matches or equals, of any client, both ways.
    Topic(String),
}

/// Which way a packet went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the broker.
    In,
    /// From the broker to the client.
    Out,
}

/// Lines a trace's writer may have waiting; a line that finds the queue full is dropped.
pub const QUEUE: usize = 4096;

/// What a trace's writer is handed.
enum Line {
    /// A line to append.
    Text(String),
    /// The trace stopped: flush and end.
    Stop,
}

/// One running trace.
#[derive(Debug)]
pub struct Trace {
    /// Its name (unique among running traces).
    pub name: String,
    /// What it records.
    pub target: Target,
    /// The file it writes.
    pub path: PathBuf,
    /// When it ends by itself.
    pub until: Instant,
    /// Packets recorded so far (handed to the writer; in the file once the trace has stopped).
    pub packets: AtomicU64,
    /// Packets not recorded because the writer's queue was full.
    pub dropped: AtomicU64,
    queue: SyncSender<Line>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl Trace {
    fn wants(&self, client_id: &str, p: &Packet) -> bool {
        match &self.target {
            Target::Client(id) => id == client_id,
            Target::Topic(filter) => match p {
                Packet::Publish(p) => matches(filter, &p.topic),
                Packet::Subscribe(s) => s.filters.iter().any(|(f, _)| f == filter || matches(filter, f)),
                Packet::Unsubscribe(u) => u.filters.iter().any(|f| f == filter || matches(filter, f)),
                _ => false,
            },
        }
    }

    /// Hands `line` to the writer, or counts it dropped if the writer is behind.
    fn push(&self, line: &str) {
        match self.queue.try_send(Line::Text(line.to_string())) {
            Ok(()) => {
                self.packets.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            // The writer is gone (the trace stopped): nothing to record into.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// A trace's writer: appends the lines it is handed to `file`, flushing whenever it has caught
/// up (so the file can be read while the trace runs), until [`Line::Stop`] or the trace is gone.
fn write_lines(mut file: BufWriter<File>, lines: Receiver<Line>) {
    while let Ok(mut line) = lines.recv() {
        loop {
            match line {
                Line::Text(text) => {
                    let _ = file.write_all(text.as_bytes());
                }
                Line::Stop => {
                    let _ = file.flush();
                    return;
                }
            }
            match lines.try_recv() {
                Ok(next) => line = next,
                Err(_) => break,
            }
        }
        let _ = file.flush();
    }
    let _ = file.flush();
}

/// The running traces.
#[derive(Debug, Default)]
pub struct Tracer {
    active: AtomicBool,
    traces: RwLock<Vec<Arc<Trace>>>,
}

impl Tracer {
    /// True while a trace runs: only then do connections hand their packets over.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Starts trace `name` of `target` into a new file under `dir`, until `until`, with a
    /// writer thread of its own.
    pub fn start(
        &self,
        name: &str,
        target: Target,
        dir: &Path,
        until: Instant,
    ) -> Result<Arc<Trace>, String> {
        let running = |traces: &[Arc<Trace>]| traces.iter().any(|t| t.name == name);
        if running(&self.traces.read()) {
            return Err(format!("a trace named {name:?} is running"));
        }
        // The file and the writer thread are made before the write lock, which every packet's
        // connection reads while a trace runs.
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let path = dir.join(format!("{name}-{secs}.log"));
        let file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut file = BufWriter::new(file);
        let _ = writeln!(file, "# braid trace {name:?} of {target:?}");
        let _ = file.flush();
        let (queue, lines) = sync_channel(QUEUE);
        let writer = std::thread::Builder::new()
            .name("braid-trace".into())
            .spawn(move || write_lines(file, lines))
            .map_err(|e| format!("cannot start the trace's writer: {e}"))?;
        let trace = Arc::new(Trace {
            name: name.to_string(),
            target,
            path,
            until,
            packets: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            queue,
            writer: Mutex::new(Some(writer)),
        });
        let mut traces = self.traces.write();
        if running(&traces) {
            // Another start of the same name won meanwhile: this one's writer ends with it.
            drop(traces);
            let _ = trace.queue.send(Line::Stop);
            let _ = std::fs::remove_file(&trace.path);
            return Err(format!("a trace named {name:?} is running"));
        }
        traces.push(trace.clone());
        self.active.store(true, Ordering::Relaxed);
        Ok(trace)
    }

    /// Stops trace `name`; None if none runs by that name. Returns once its writer has written
    /// what it was handed and closed the file.
    pub fn stop(&self, name: &str) -> Option<Arc<Trace>> {
        let trace = {
            let mut traces = self.traces.write();
            let i = traces.iter().position(|t| t.name == name)?;
            let trace = traces.remove(i);
            self.active.store(!traces.is_empty(), Ordering::Relaxed);
            trace
        };
        // No connection reaches the trace any more: Stop comes after every line handed over.
        let _ = trace.queue.send(Line::Stop);
        if let Some(writer) = trace.writer.lock().take() {
            let _ = writer.join();
        }
        Some(trace)
    }

    /// The running traces.
    pub fn list(&self) -> Vec<Arc<Trace>> {
        self.traces.read().clone()
    }

    /// Records `packet`, which went `direction` on `client_id`'s connection, in every trace that
    /// wants it: hands its line to each one's writer, never waiting for one.
    pub fn record(&self, client_id: &str, direction: Direction, packet: &Packet) {
        let traces = self.traces.read();
        let mut line = None;
        for t in traces.iter().filter(|t| t.wants(client_id, packet)) {
            t.push(line.get_or_insert_with(|| format_line(client_id, direction, packet)));
        }
    }

    /// Records every packet in `bytes` (whole packets of `version`, as encoded for sending).
    pub fn record_bytes(
        &self,
        client_id: &str,
        direction: Direction,
        bytes: &[u8],
        version: ProtocolVersion,
    ) {
        let mut buf = BytesMut::from(bytes);
        while let Ok(Some(p)) = decode(&mut buf, version, u32::MAX) {
            self.record(client_id, direction, &p);
        }
    }
}

/// `2026-11-26T22:40:01.123456Z client=ID in PUBLISH ...`: a PUBLISH with its topic, flags and
/// at most 64 bytes of its payload; other packets as the codec shows them.
fn format_line(client_id: &str, direction: Direction, packet: &Packet) -> String {
    let way = match direction {
        Direction::In => "in",
        Direction::Out => "out",
    };
    let mut line = format!("{} client={client_id:?} {way} ", rfc3339_micros(SystemTime::now()));
    match packet {
        Packet::Publish(p) => {
            let shown = &p.payload[..p.payload.len().min(64)];
            let _ = write!(
                line,
                "PUBLISH topic={:?} qos={} retain={} dup={} id={} bytes={} payload={:?}",
                &*p.topic,
                p.qos as u8,
                p.retain,
                p.dup,
                p.packet_id,
                p.payload.len(),
                String::from_utf8_lossy(shown)
            );
        }
        other => {
            let _ = write!(line, "{other:?}");
        }
    }
    line.push('\n');
    line
}

/// `at` as RFC 3339 in UTC with microseconds: `YYYY-MM-DDTHH:MM:SS.uuuuuuZ`.
fn rfc3339_micros(at: SystemTime) -> String {
    const FORMAT: &[FormatItem<'_>] =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z");
    // Formatting a UTC date into a String fails only for years past 9999.
    OffsetDateTime::from(at).format(FORMAT).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::{encode, ByteString, Bytes, Publish, QoS};

    fn publish(topic: &str) -> Packet {
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: ByteString::from(topic),
            packet_id: 7,
            properties: Default::default(),
            payload: Bytes::from_static(b"hello"),
        })
    }

    #[test]
    fn a_topic_trace_keeps_matching_publishes_and_stops_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let tracer = Tracer::default();
        assert!(!tracer.is_active());
        let t = tracer.start("t1", Target::Topic("a/#".into()), dir.path(), Instant::now()).unwrap();
        assert!(tracer.start("t1", Target::Client("x".into()), dir.path(), Instant::now()).is_err());
        assert!(tracer.is_active());
        let mut bytes = BytesMut::new();
        encode(&publish("a/b"), ProtocolVersion::V5, &mut bytes).unwrap();
        encode(&publish("z/b"), ProtocolVersion::V5, &mut bytes).unwrap();
        encode(&publish("a/c"), ProtocolVersion::V5, &mut bytes).unwrap();
        tracer.record_bytes("c1", Direction::Out, &bytes, ProtocolVersion::V5);
        assert_eq!(t.packets.load(Ordering::Relaxed), 2);
        assert!(tracer.stop("t1").is_some() && !tracer.is_active());
        let text = std::fs::read_to_string(&t.path).unwrap();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].ends_with("client=\"c1\" out PUBLISH topic=\"a/b\" qos=1 retain=false dup=false id=7 bytes=5 payload=\"hello\""), "{}", lines[0]);
    }

    #[test]
    fn a_record_reaches_the_file_through_the_writer_while_the_trace_runs() {
        let dir = tempfile::tempdir().unwrap();
        let tracer = Tracer::default();
        let t = tracer.start("w", Target::Client("c2".into()), dir.path(), Instant::now()).unwrap();
        tracer.record("c2", Direction::In, &publish("x/y"));
        tracer.record("other", Direction::In, &publish("x/y"));
        assert_eq!(t.packets.load(Ordering::Relaxed), 1);
        // The connection only handed the line over; the writer appends and flushes it.
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let text = loop {
            let text = std::fs::read_to_string(&t.path).unwrap();
            if text.lines().count() == 2 {
                break text;
            }
            assert!(Instant::now() < deadline, "the writer did not write the line: {text:?}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert!(text.lines().nth(1).unwrap().contains("client=\"c2\" in PUBLISH topic=\"x/y\""), "{text}");
        assert!(tracer.stop("w").is_some());
        tracer.record("c2", Direction::In, &publish("x/y"));
        assert_eq!(t.packets.load(Ordering::Relaxed), 1, "a stopped trace records nothing");
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let (queue, lines) = sync_channel(2);
        let t = Trace {
            name: "slow".into(),
            target: Target::Topic("#".into()),
            path: PathBuf::new(),
            until: Instant::now(),
            packets: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            queue,
            writer: Mutex::new(None),
        };
        for _ in 0..5 {
            t.push("line\n");
        }
        assert_eq!((t.packets.load(Ordering::Relaxed), t.dropped.load(Ordering::Relaxed)), (2, 3));
        drop(lines);
    }

    #[test]
    fn times_are_utc_rfc3339() {
        let at = |secs, micros: u32| UNIX_EPOCH + std::time::Duration::new(secs, micros * 1000);
        assert_eq!(rfc3339_micros(at(0, 0)), "1970-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339_micros(at(1_795_731_530, 42)), "2026-11-26T22:18:50.000042Z");
        assert_eq!(rfc3339_micros(at(951_782_400, 1)), "2000-02-29T00:00:00.000001Z");
        assert_eq!(
            rfc3339_micros(at(951_782_400, 999_999) + std::time::Duration::from_nanos(999)),
            "2000-02-29T00:00:00.999999Z",
            "truncated, not rounded"
        );
    }
}
