//! Packet traces, as EMQX's `/trace`: every packet of one client id, or every PUBLISH,
//! SUBSCRIBE and UNSUBSCRIBE of topics one filter matches, written as text lines to a file of
//! its own while the trace runs (started and stopped through the admin API, ended at its
//! deadline). While no trace runs, a connection pays one relaxed atomic load per batch of
//! packets. Lines carry the wall-clock time, read here: a trace is an I/O concern, outside the
//! protocol logic.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};

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
    /// Packets written so far.
    pub packets: AtomicU64,
    file: Mutex<BufWriter<File>>,
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

    /// Starts trace `name` of `target` into a new file under `dir`, until `until`.
    pub fn start(
        &self,
        name: &str,
        target: Target,
        dir: &Path,
        until: Instant,
    ) -> Result<Arc<Trace>, String> {
        let mut traces = self.traces.write();
        if traces.iter().any(|t| t.name == name) {
            return Err(format!("a trace named {name:?} is running"));
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let path = dir.join(format!("{name}-{secs}.log"));
        let file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut file = BufWriter::new(file);
        let _ = writeln!(file, "# braid trace {name:?} of {target:?}");
        let trace = Arc::new(Trace {
            name: name.to_string(),
            target,
            path,
            until,
            packets: AtomicU64::new(0),
            file: Mutex::new(file),
        });
        traces.push(trace.clone());
        self.active.store(true, Ordering::Relaxed);
        Ok(trace)
    }

    /// Stops trace `name` (its file flushed and closed); None if none runs by that name.
    pub fn stop(&self, name: &str) -> Option<Arc<Trace>> {
        let mut traces = self.traces.write();
        let i = traces.iter().position(|t| t.name == name)?;
        let trace = traces.remove(i);
        self.active.store(!traces.is_empty(), Ordering::Relaxed);
        let _ = trace.file.lock().flush();
        Some(trace)
    }

    /// The running traces.
    pub fn list(&self) -> Vec<Arc<Trace>> {
        self.traces.read().clone()
    }

    /// Records `packet`, which went `direction` on `client_id`'s connection, in every trace that
    /// wants it.
    pub fn record(&self, client_id: &str, direction: Direction, packet: &Packet) {
        let traces = self.traces.read();
        let mut line = None;
        for t in traces.iter().filter(|t| t.wants(client_id, packet)) {
            let line = line.get_or_insert_with(|| format_line(client_id, direction, packet));
            let mut file = t.file.lock();
            let _ = file.write_all(line.as_bytes());
            // Flushed as it goes: the file can be read while the trace runs.
            let _ = file.flush();
            t.packets.fetch_add(1, Ordering::Relaxed);
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
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let way = match direction {
        Direction::In => "in",
        Direction::Out => "out",
    };
    let mut line =
        format!("{} client={client_id:?} {way} ", rfc3339_micros(now.as_secs(), now.subsec_micros()));
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

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SS.uuuuuuZ` (UTC; civil-from-days).
fn rfc3339_micros(secs: u64, micros: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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
    fn times_are_utc_rfc3339() {
        assert_eq!(rfc3339_micros(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339_micros(1_795_731_530, 42), "2026-11-26T22:18:50.000042Z");
        assert_eq!(rfc3339_micros(951_782_400, 1), "2000-02-29T00:00:00.000001Z");
    }
}
