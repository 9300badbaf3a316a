//! The disk store: an append-only log of records in segment files (64 MiB by default) under
//! `data_dir`, written by one thread that takes every change submitted since its last write as
//! one batch, writes it and (sync durability) fsyncs it before announcing the batch durable:
//! group commit. An index in memory maps each live record to its place on disk; a segment
//! whose records are all dead is deleted, oldest first, and the oldest segment is compacted
//! (its few live records copied to the head) when it holds mostly dead ones.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::watch;
use tracing::{error, info, warn};

use braid_proto::ByteString;

use super::backend::{Op, Recovered, RecoveredSession, Stage, Store, StoreError, StoreStats, Stored, Ticket};
use super::record::{self, kind, UnixClock};
use super::record_error::RecordError;
use crate::config::{Durability, StoreConfig};
use crate::message::Message;
use crate::metrics::Histogram;

/// Marks a directory as a Braid store and names the format version.
const MARKER: &str = "braid-store";
const MARKER_TEXT: &str = "braid store format 1\n";
/// First bytes of every segment file.
const SEGMENT_MAGIC: &[u8; 16] = b"BRAID-SEGMENT-1\n";
/// Encoded records written out once the batch buffer holds this many bytes.
const MAX_BUFFER: usize = 4 << 20;
/// A segment is closed once it is larger than this, unless the store is opened with another
/// size ([`DiskStore::open_with_segment_size`]).
const SEGMENT_SIZE: u64 = 64 << 20;

/// Place of one record.
#[derive(Debug, Clone, Copy)]
struct Loc {
    seg: u32,
    off: u64,
    len: u32,
}

#[derive(Debug)]
struct Msg {
    loc: Loc,
    stage: Stage,
}

#[derive(Debug, Default)]
struct SessionIndex {
    meta: Option<Loc>,
    msgs: BTreeMap<u64, Msg>,
    qos2: HashMap<u16, Loc>,
    max_seq: u64,
}

#[derive(Debug)]
struct Segment {
    file: File,
    size: u64,
    live: u64,
}

/// Live records by place, with live bytes per segment.
#[derive(Debug, Default)]
struct Index {
    sessions: HashMap<u64, SessionIndex>,
    retained: HashMap<ByteString, Loc>,
    max_session: u64,
}

struct Pending {
    ops: Vec<Op>,
    next: Ticket,
    closed: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    /// How long each fsync took.
    syncs: Histogram,
    /// The segments' bytes, after the last batch.
    disk_bytes: AtomicU64,
}

/// The disk store (see the module documentation).
pub struct DiskStore {
    shared: Arc<Shared>,
    sync: bool,
    durable: watch::Receiver<Ticket>,
    recovered: Mutex<Option<Recovered>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for DiskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskStore").field("sync", &self.sync).finish()
    }
}

impl DiskStore {
    /// Opens (creating if needed) the store in `config.data_dir`, reads it back and starts the
    /// writer. A foreign or damaged directory is refused with the file and the problem. The
    /// times records keep are converted by `clock`.
    pub fn open(config: &StoreConfig, clock: UnixClock) -> Result<DiskStore, StoreError> {
        DiskStore::open_with_segment_size(config, clock, SEGMENT_SIZE)
    }

    /// [`DiskStore::open`], closing a segment once it is larger than `segment_size` bytes
    /// instead of 64 MiB: small segments make rollover and compaction happen in tests.
    pub fn open_with_segment_size(
        config: &StoreConfig,
        clock: UnixClock,
        segment_size: u64,
    ) -> Result<DiskStore, StoreError> {
        let started = Instant::now();
        let dir = config.data_dir.clone();
        let lock = prepare_dir(&dir)?;
        let mut log = Log::open(&dir, lock, clock, segment_size)?;
        let recovered = log.recover()?;
        info!(
            dir = %dir.display(),
            sessions = recovered.sessions.len(),
            queued = recovered.sessions.iter().map(|s| s.queued.len()).sum::<usize>(),
            retained = recovered.retained.len(),
            "store opened in {:.2}s",
            started.elapsed().as_secs_f64()
        );
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending { ops: Vec::new(), next: 0, closed: false }),
            wake: Condvar::new(),
            syncs: Histogram::new(Histogram::LATENCY_US),
            disk_bytes: AtomicU64::new(log.segs.values().map(|s| s.size).sum()),
        });
        let (tx, durable) = watch::channel(0);
        let sync = config.durability == Durability::Sync;
        let interval = Duration::from_millis(config.flush_interval_ms);
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("braid-store".into())
            .spawn(move || log.run(&writer_shared, &tx, sync, interval))
            .map_err(StoreError::Thread)?;
        Ok(DiskStore {
            shared,
            sync,
            durable,
            recovered: Mutex::new(Some(recovered)),
            writer: Mutex::new(Some(writer)),
        })
    }
}

impl Store for DiskStore {
    fn persistent(&self) -> bool {
        true
    }

    fn sync(&self) -> bool {
        self.sync
    }

    fn submit(&self, op: Op) -> Ticket {
        let mut p = self.shared.pending.lock();
        p.next += 1;
        p.ops.push(op);
        if p.ops.len() == 1 {
            self.shared.wake.notify_one();
        }
        p.next
    }

    fn durable(&self) -> watch::Receiver<Ticket> {
        self.durable.clone()
    }

    fn take_recovered(&self) -> Recovered {
        self.recovered.lock().take().unwrap_or_default()
    }

    fn close(&self) {
        self.shared.pending.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(writer) = self.writer.lock().take() {
            let _ = writer.join();
        }
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            disk_bytes: Some(self.shared.disk_bytes.load(Ordering::Relaxed)),
            syncs: Some(self.shared.syncs.snapshot()),
        }
    }
}

impl Drop for DiskStore {
    fn drop(&mut self) {
        self.close();
    }
}

/// Creates `dir` or checks it is a Braid store; takes its lock so no second broker opens it.
fn prepare_dir(dir: &Path) -> Result<File, StoreError> {
    let marker = dir.join(MARKER);
    fs::create_dir_all(dir).map_err(io_error(dir, "cannot create the data directory"))?;
    match fs::read_to_string(&marker) {
        Ok(text) if text == MARKER_TEXT => {}
        Ok(_) => return Err(StoreError::UnknownFormat { marker }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let foreign = fs::read_dir(dir)
                .map_err(io_error(dir, "cannot list the data directory"))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| n != "lost+found");
            if let Some(found) = foreign {
                return Err(StoreError::Foreign { dir: dir.into(), marker: MARKER, found });
            }
            fs::write(&marker, MARKER_TEXT).map_err(io_error(&marker, "cannot write the store marker"))?;
        }
        Err(e) => return Err(io_error(&marker, "cannot read the store marker")(e)),
    }
    let lock = File::open(&marker).map_err(io_error(&marker, "cannot open the store marker"))?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(fs::TryLockError::WouldBlock) => Err(StoreError::InUse { dir: dir.into() }),
        Err(fs::TryLockError::Error(e)) => Err(io_error(&marker, "cannot lock the data directory")(e)),
    }
}

/// What turns the error of `what` on `path` into a [`StoreError::Io`].
fn io_error<'a>(path: &'a Path, what: &'static str) -> impl Fn(io::Error) -> StoreError + Copy + 'a {
    move |source| StoreError::Io { path: path.into(), what, source }
}

fn segment_name(n: u32) -> String {
    format!("{n:08}.seg")
}

/// The log: segment files, the index of live records and the batch being written.
struct Log {
    dir: PathBuf,
    segs: BTreeMap<u32, Segment>,
    head: u32,
    /// The head is closed once it is larger than this.
    segment_size: u64,
    /// Encoded records not yet written; they belong at the end of the head segment.
    buf: Vec<u8>,
    index: Index,
    /// Converts the expiries records keep.
    clock: UnixClock,
    _lock: File,
}

impl Log {
    fn open(dir: &Path, lock: File, clock: UnixClock, segment_size: u64) -> Result<Log, StoreError> {
        Ok(Log {
            dir: dir.into(),
            segs: BTreeMap::new(),
            head: 0,
            segment_size,
            buf: Vec::new(),
            index: Index::default(),
            clock,
            _lock: lock,
        })
    }

    fn path(&self, seg: u32) -> PathBuf {
        self.dir.join(segment_name(seg))
    }

    /// Reads every segment, rebuilding the index. A damaged record in the last segment is
    /// the tail of a write the crash interrupted: it is cut off and reported. Damage anywhere
    /// else refuses the start, naming the file and offset.
    fn recover(&mut self) -> Result<Recovered, StoreError> {
        let mut numbers = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_error(&self.dir, "cannot list the data directory"))? {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(n) = name.strip_suffix(".seg") {
                match n.parse::<u32>() {
                    Ok(n) if name == segment_name(n) => numbers.push(n),
                    _ => {
                        return Err(StoreError::NotSegment { path: entry.path(), problem: "unexpected name" })
                    }
                }
            }
        }
        numbers.sort_unstable();
        let mut retained: HashMap<ByteString, (Loc, Vec<u8>)> = HashMap::new();
        let mut metas: HashMap<u64, Vec<u8>> = HashMap::new();
        for (i, &n) in numbers.iter().enumerate() {
            let last = i + 1 == numbers.len();
            let path = self.path(n);
            let data = fs::read(&path).map_err(io_error(&path, "cannot read the segment"))?;
            let file = OpenOptions::new()
                .read(true)
                .append(true)
                .open(&path)
                .map_err(io_error(&path, "cannot open the segment"))?;
            if data.len() < SEGMENT_MAGIC.len() || &data[..SEGMENT_MAGIC.len()] != SEGMENT_MAGIC {
                if last && data.len() < SEGMENT_MAGIC.len() && SEGMENT_MAGIC.starts_with(&data) {
                    // Created but its header not written when the broker stopped: empty.
                    let header = io_error(&path, "cannot write the segment header");
                    file.set_len(0).map_err(header)?;
                    (&file).write_all(SEGMENT_MAGIC).map_err(header)?;
                    self.segs.insert(n, Segment { file, size: SEGMENT_MAGIC.len() as u64, live: 0 });
                    continue;
                }
                return Err(StoreError::NotSegment { path, problem: "bad header" });
            }
            self.segs.insert(n, Segment { file, size: data.len() as u64, live: 0 });
            let mut off = SEGMENT_MAGIC.len();
            while off < data.len() {
                let (k, body, len) = match record::unframe(&data[off..]) {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(why) if last && torn_tail(&data[off..]) => {
                        let lost = data.len() - off;
                        warn!(
                            file = %path.display(),
                            "cut off {lost} bytes at offset {off}: {why} (the tail of a write interrupted by \
                             a crash; with sync durability nothing in it was acknowledged)"
                        );
                        let seg = self.segs.get_mut(&n).expect("inserted above");
                        let cut = io_error(&path, "cannot cut off the torn tail");
                        seg.file.set_len(off as u64).map_err(cut)?;
                        seg.file.sync_all().map_err(cut)?;
                        seg.size = off as u64;
                        break;
                    }
                    Err(why) => return Err(self.damaged(n, off as u64, why)),
                };
                let loc = Loc { seg: n, off: off as u64, len: len as u32 };
                self.replay(k, body, loc, &mut retained, &mut metas)
                    .map_err(|why| self.damaged(n, loc.off, why))?;
                off += len;
            }
        }
        if numbers.is_empty() {
            self.new_segment(1).map_err(io_error(&self.path(1), "cannot create the first segment"))?;
        }
        self.head = *self.segs.keys().next_back().unwrap_or(&1);
        self.rebuild(retained, metas)
    }

    /// Applies one record read at start.
    fn replay(
        &mut self,
        k: u8,
        body: &[u8],
        loc: Loc,
        retained: &mut HashMap<ByteString, (Loc, Vec<u8>)>,
        metas: &mut HashMap<u64, Vec<u8>>,
    ) -> Result<(), RecordError> {
        let idx = &mut self.index;
        match k {
            kind::SESSION => {
                let id = record::Reader(body).u64()?;
                idx.max_session = idx.max_session.max(id);
                let s = idx.sessions.entry(id).or_default();
                if let Some(old) = s.meta.replace(loc) {
                    live(&mut self.segs, old, false);
                }
                live(&mut self.segs, loc, true);
                metas.insert(id, body.to_vec());
            }
            kind::END_SESSION => {
                let id = record::Reader(body).u64()?;
                idx.max_session = idx.max_session.max(id);
                if let Some(s) = idx.sessions.remove(&id) {
                    drop_session(&mut self.segs, s);
                }
                metas.remove(&id);
            }
            kind::APPEND => {
                let (id, seq) = record::session_seq(body)?;
                idx.max_session = idx.max_session.max(id);
                let s = idx.sessions.entry(id).or_default();
                s.max_seq = s.max_seq.max(seq);
                if let Some(old) = s.msgs.insert(seq, Msg { loc, stage: Stage::Queued }) {
                    live(&mut self.segs, old.loc, false);
                }
                live(&mut self.segs, loc, true);
            }
            kind::STAGE => {
                let (id, seq) = record::session_seq(body)?;
                let stage = record::read_stage(body)?;
                if let Some(m) = idx.sessions.get_mut(&id).and_then(|s| s.msgs.get_mut(&seq)) {
                    m.stage = stage;
                }
            }
            kind::DONE => {
                let (id, seq) = record::session_seq(body)?;
                if let Some(m) = idx.sessions.get_mut(&id).and_then(|s| s.msgs.remove(&seq)) {
                    live(&mut self.segs, m.loc, false);
                }
            }
            kind::QOS2 => {
                let (id, packet_id, pending) = record::read_qos2(body)?;
                let s = idx.sessions.entry(id).or_default();
                let old = if pending { s.qos2.insert(packet_id, loc) } else { s.qos2.remove(&packet_id) };
                if let Some(old) = old {
                    live(&mut self.segs, old, false);
                }
                if pending {
                    live(&mut self.segs, loc, true);
                }
            }
            kind::RETAIN => {
                let msg = record::read_retain(body, &self.clock)?;
                if let Some((old, _)) = retained.remove(&msg.topic) {
                    live(&mut self.segs, old, false);
                }
                if !msg.payload.is_empty() {
                    live(&mut self.segs, loc, true);
                    retained.insert(msg.topic.clone(), (loc, body.to_vec()));
                }
            }
            other => return Err(RecordError::UnknownKind(other)),
        }
        Ok(())
    }

    /// The recovered state, from the index built by [`Log::replay`].
    fn rebuild(
        &mut self,
        retained: HashMap<ByteString, (Loc, Vec<u8>)>,
        metas: HashMap<u64, Vec<u8>>,
    ) -> Result<Recovered, StoreError> {
        let now = std::time::Instant::now();
        let mut out = Recovered { next_session_id: self.index.max_session + 1, ..Default::default() };
        for (topic, (loc, body)) in retained {
            let msg =
                record::read_retain(&body, &self.clock).map_err(|e| self.damaged(loc.seg, loc.off, e))?;
            if msg.is_expired(now) {
                // Purged now, with a clearing record, so it is not read again next time.
                live(&mut self.segs, loc, false);
                self.put(
                    kind::RETAIN,
                    &record::retain(&Message::internal(topic, Default::default(), true), &self.clock),
                );
            } else {
                self.index.retained.insert(topic, loc);
                out.retained.push(msg);
            }
        }
        let mut orphans = Vec::new();
        for (&id, s) in &self.index.sessions {
            let Some(body) = metas.get(&id) else {
                orphans.push(id);
                continue;
            };
            let meta = s.meta.expect("meta");
            let record = record::read_session(body).map_err(|e| self.damaged(meta.seg, meta.off, e))?;
            let queued = s.msgs.iter().map(|(seq, m)| (*seq, m.loc.len as usize)).collect();
            out.sessions.push(RecoveredSession {
                record,
                next_seq: s.max_seq + 1,
                queued,
                incoming_qos2: s.qos2.keys().copied().collect(),
                held_remote: Vec::new(),
                shared: Vec::new(),
            });
        }
        for id in orphans {
            // Deliveries of a session whose record is gone: cannot happen with records written
            // in order; said rather than kept.
            let s = self.index.sessions.remove(&id).expect("listed above");
            warn!("store: dropping {} deliveries of unknown session {id}", s.msgs.len());
            drop_session(&mut self.segs, s);
            self.end_session(id);
        }
        self.write().map_err(io_error(&self.path(self.head), "cannot write the segment"))?;
        Ok(out)
    }

    /// The record at `offset` of segment `seg` does not read back.
    fn damaged(&self, seg: u32, offset: u64, problem: RecordError) -> StoreError {
        StoreError::Damaged { segment: self.path(seg), offset, source: problem }
    }

    fn new_segment(&mut self, n: u32) -> io::Result<()> {
        let path = self.path(n);
        let mut file = OpenOptions::new().read(true).append(true).create_new(true).open(&path)?;
        file.write_all(SEGMENT_MAGIC)?;
        file.sync_all()?;
        File::open(&self.dir)?.sync_all()?;
        self.segs.insert(n, Segment { file, size: SEGMENT_MAGIC.len() as u64, live: 0 });
        self.head = n;
        Ok(())
    }

    /// Adds a record to the batch; returns where it will be.
    fn put(&mut self, k: u8, body: &[u8]) -> Loc {
        let size = self.segs.get(&self.head).map_or(0, |s| s.size);
        let off = size + self.buf.len() as u64;
        let len = record::frame(&mut self.buf, k, body) as u32;
        Loc { seg: self.head, off, len }
    }

    /// Reads the record at `loc` (from the batch if not yet written).
    fn read(&self, loc: Loc) -> io::Result<Vec<u8>> {
        let seg = self.segs.get(&loc.seg).ok_or_else(|| io::Error::other("segment gone"))?;
        let mut data = vec![0; loc.len as usize];
        if loc.seg == self.head && loc.off >= seg.size {
            let at = (loc.off - seg.size) as usize;
            let batch = self
                .buf
                .get(at..at + loc.len as usize)
                .ok_or_else(|| io::Error::other("record beyond the batch"))?;
            data.copy_from_slice(batch);
        } else {
            seg.file.read_exact_at(&mut data, loc.off)?;
        }
        Ok(data)
    }

    fn session_meta(&mut self, id: u64, body: &[u8]) {
        let loc = self.put(kind::SESSION, body);
        self.index.max_session = self.index.max_session.max(id);
        let s = self.index.sessions.entry(id).or_default();
        if let Some(old) = s.meta.replace(loc) {
            live(&mut self.segs, old, false);
        }
        live(&mut self.segs, loc, true);
    }

    fn end_session(&mut self, id: u64) {
        self.put(kind::END_SESSION, &id.to_le_bytes());
        if let Some(s) = self.index.sessions.remove(&id) {
            drop_session(&mut self.segs, s);
        }
    }

    fn retain(&mut self, msg: &Message) {
        let loc = self.put(kind::RETAIN, &record::retain(msg, &self.clock));
        let old = if msg.payload.is_empty() {
            self.index.retained.remove(&msg.topic)
        } else {
            live(&mut self.segs, loc, true);
            self.index.retained.insert(msg.topic.clone(), loc)
        };
        if let Some(old) = old {
            live(&mut self.segs, old, false);
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Session(r) => self.session_meta(r.id, &record::session(&r)),
            Op::EndSession(id) => self.end_session(id),
            Op::Append { session, seq, delivery } => {
                let loc = self.put(kind::APPEND, &record::append(session, seq, &delivery, &self.clock));
                live(&mut self.segs, loc, true);
                let s = self.index.sessions.entry(session).or_default();
                s.max_seq = s.max_seq.max(seq);
                s.msgs.insert(seq, Msg { loc, stage: Stage::Queued });
            }
            Op::Stage { session, seq, stage } => {
                self.put(kind::STAGE, &record::stage(session, seq, stage));
                if let Some(m) = self.index.sessions.get_mut(&session).and_then(|s| s.msgs.get_mut(&seq)) {
                    m.stage = stage;
                }
            }
            Op::Done { session, seq } => {
                if let Some(m) = self.index.sessions.get_mut(&session).and_then(|s| s.msgs.remove(&seq)) {
                    self.put(kind::DONE, &record::ids(session, seq));
                    live(&mut self.segs, m.loc, false);
                }
            }
            Op::IncomingQos2 { session, packet_id, pending } => {
                let loc = self.put(kind::QOS2, &record::qos2(session, packet_id, pending));
                let s = self.index.sessions.entry(session).or_default();
                let old = if pending { s.qos2.insert(packet_id, loc) } else { s.qos2.remove(&packet_id) };
                if pending {
                    live(&mut self.segs, loc, true);
                }
                if let Some(old) = old {
                    live(&mut self.segs, old, false);
                }
            }
            Op::Retain(msg) => self.retain(&msg),
            Op::Load { session, reply } => {
                let _ = reply.send(self.load(session));
            }
        }
    }

    fn load(&self, session: u64) -> Result<Vec<Stored>, StoreError> {
        let Some(s) = self.index.sessions.get(&session) else { return Ok(Vec::new()) };
        let mut out = Vec::with_capacity(s.msgs.len());
        for m in s.msgs.values() {
            let damaged = |problem: RecordError| self.damaged(m.loc.seg, m.loc.off, problem);
            let frame =
                self.read(m.loc).map_err(io_error(&self.path(m.loc.seg), "cannot read a queued delivery"))?;
            let Some((kind::APPEND, body, _)) = record::unframe(&frame).map_err(damaged)? else {
                return Err(damaged(RecordError::NotADelivery));
            };
            let (seq, delivery) = record::read_append(body, &self.clock).map_err(damaged)?;
            out.push(Stored { seq, stage: m.stage, delivery });
        }
        Ok(out)
    }

    /// Writes the batch to the head segment.
    fn write(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let seg = self.segs.get_mut(&self.head).ok_or_else(|| io::Error::other("no head segment"))?;
        seg.file.write_all(&self.buf)?;
        seg.size += self.buf.len() as u64;
        self.buf.clear();
        if self.buf.capacity() > MAX_BUFFER * 2 {
            self.buf.shrink_to(MAX_BUFFER);
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        match self.segs.get(&self.head) {
            Some(seg) => seg.file.sync_data(),
            None => Ok(()),
        }
    }

    /// After a batch: starts a new segment when the head is full, deletes dead segments from
    /// the oldest on, and compacts the oldest one when most of it is dead.
    fn maintain(&mut self) -> io::Result<()> {
        let head_size = self.segs.get(&self.head).map_or(0, |s| s.size);
        if head_size < self.segment_size {
            return Ok(());
        }
        self.sync()?;
        self.new_segment(self.head + 1)?;
        while let Some((&oldest, seg)) = self.segs.first_key_value() {
            if oldest == self.head {
                break;
            }
            if seg.live > 0 && seg.live * 4 > seg.size {
                break;
            }
            if seg.live > 0 {
                self.relocate(oldest)?;
            }
            self.segs.remove(&oldest);
            fs::remove_file(self.path(oldest))?;
        }
        Ok(())
    }

    /// Copies the live records of segment `n` to the head (written and synced before `n` is
    /// deleted). One pass over the index finds them, each with the key of its index entry, so
    /// a compaction costs that pass plus one lookup per record moved.
    fn relocate(&mut self, n: u32) -> io::Result<()> {
        let mut moves: Vec<(Loc, Owner)> = Vec::new();
        for (&id, s) in &self.index.sessions {
            moves.extend(s.meta.filter(|l| l.seg == n).map(|l| (l, Owner::Meta(id))));
            moves.extend(
                s.msgs
                    .iter()
                    .filter(|(_, m)| m.loc.seg == n)
                    .map(|(&seq, m)| (m.loc, Owner::Msg { session: id, seq, stage: m.stage })),
            );
            moves.extend(
                s.qos2
                    .iter()
                    .filter(|(_, l)| l.seg == n)
                    .map(|(&packet_id, l)| (*l, Owner::Qos2 { session: id, packet_id })),
            );
        }
        moves.extend(
            self.index
                .retained
                .iter()
                .filter(|(_, l)| l.seg == n)
                .map(|(t, l)| (*l, Owner::Retained(t.clone()))),
        );
        for (loc, owner) in moves {
            let frame = self.read(loc)?;
            let Some((k, body, _)) = record::unframe(&frame).map_err(io::Error::other)? else { continue };
            let new = self.put(k, body);
            live(&mut self.segs, loc, false);
            live(&mut self.segs, new, true);
            if let Owner::Msg { session, seq, stage } = owner {
                if stage != Stage::Queued {
                    self.put(kind::STAGE, &record::stage(session, seq, stage));
                }
            }
            self.relink(owner, new);
        }
        self.write()?;
        self.sync()
    }

    /// Points the index entry of `owner`, whose record was copied to `new`, there: a lookup by
    /// its key, not a search of the index.
    fn relink(&mut self, owner: Owner, new: Loc) {
        let idx = &mut self.index;
        let entry = match owner {
            Owner::Meta(id) => idx.sessions.get_mut(&id).and_then(|s| s.meta.as_mut()),
            Owner::Msg { session, seq, .. } => {
                idx.sessions.get_mut(&session).and_then(|s| s.msgs.get_mut(&seq)).map(|m| &mut m.loc)
            }
            Owner::Qos2 { session, packet_id } => {
                idx.sessions.get_mut(&session).and_then(|s| s.qos2.get_mut(&packet_id))
            }
            Owner::Retained(topic) => idx.retained.get_mut(&topic),
        };
        if let Some(loc) = entry {
            *loc = new;
        }
    }

    /// The writer loop: one batch per turn, fsynced per batch (sync) or every `interval`.
    fn run(mut self, shared: &Shared, durable: &watch::Sender<Ticket>, sync: bool, interval: Duration) {
        let mut last_sync = Instant::now();
        let mut dirty = false;
        loop {
            let (ops, last, closed) = {
                let mut p = shared.pending.lock();
                while p.ops.is_empty() && !p.closed {
                    if !dirty {
                        shared.wake.wait(&mut p);
                    } else if shared.wake.wait_until(&mut p, last_sync + interval).timed_out() {
                        break;
                    }
                }
                (std::mem::take(&mut p.ops), p.next, p.closed)
            };
            let mut result = Ok(());
            for op in ops {
                self.apply(op);
                // A large batch (a fan-out to many sessions) goes out in pieces, so the buffer
                // stays small.
                if self.buf.len() >= MAX_BUFFER && result.is_ok() {
                    result = self.write();
                }
            }
            let result = result.and_then(|()| self.write()).and_then(|()| {
                if sync || closed || last_sync.elapsed() >= interval {
                    let started = Instant::now();
                    self.sync()?;
                    shared.syncs.observe(started.elapsed());
                    last_sync = Instant::now();
                    dirty = false;
                } else {
                    dirty = true;
                }
                self.maintain()?;
                shared.disk_bytes.store(self.segs.values().map(|s| s.size).sum(), Ordering::Relaxed);
                Ok(())
            });
            match result {
                Ok(()) => {
                    durable.send_replace(last);
                }
                // Acknowledgements waiting for this batch stay held: nothing is confirmed
                // that is not on disk.
                Err(e) => error!(dir = %self.dir.display(), "store write failed: {e}"),
            }
            if closed && shared.pending.lock().ops.is_empty() {
                return;
            }
        }
    }
}

/// True if `rest`, from a record that does not read back to the end of the last segment,
/// looks like a write the crash cut short: nothing but zeros follows the bad record's end
/// (it runs past the end of the file, or the file ends in zeros, space the file system
/// allocated but never wrote, which may begin inside the record or before it). Anything else
/// is damage, and the store refuses to start rather than drop what follows.
fn torn_tail(rest: &[u8]) -> bool {
    if rest.len() < record::FRAME_HEADER {
        return true;
    }
    let len = u32::from_le_bytes(rest[..4].try_into().unwrap_or_default()) as usize;
    let written = rest.iter().rposition(|b| *b != 0).map_or(0, |last| last + 1);
    written <= record::FRAME_HEADER + len
}

/// The index entry of a record being relocated.
enum Owner {
    /// A session's metadata.
    Meta(u64),
    /// A delivery, with its stage (rewritten after the copy unless queued).
    Msg { session: u64, seq: u64, stage: Stage },
    /// An inbound QoS 2 packet id.
    Qos2 { session: u64, packet_id: u16 },
    /// A retained message.
    Retained(ByteString),
}

/// Counts a record as live (or no longer) in its segment.
fn live(segs: &mut BTreeMap<u32, Segment>, loc: Loc, on: bool) {
    if let Some(seg) = segs.get_mut(&loc.seg) {
        if on {
            seg.live += u64::from(loc.len);
        } else {
            seg.live = seg.live.saturating_sub(u64::from(loc.len));
        }
    }
}

fn drop_session(segs: &mut BTreeMap<u32, Segment>, s: SessionIndex) {
    for loc in s.meta.into_iter().chain(s.msgs.into_values().map(|m| m.loc)).chain(s.qos2.into_values()) {
        live(segs, loc, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Delivery;
    use crate::store::{SessionRecord, SubscriptionRecord};
    use braid_proto::{Bytes, LastWill, QoS, SubscriptionOptions};

    fn config(dir: &Path) -> StoreConfig {
        StoreConfig { data_dir: dir.into(), ..Default::default() }
    }

    /// A delivery with Subscription Identifiers `ids`.
    fn delivery(payload: &'static str, ids: &[u32]) -> Delivery {
        let msg =
            Message::internal(ByteString::from_static("a/b"), Bytes::from_static(payload.as_bytes()), false);
        Delivery { sub_ids: ids.iter().copied().collect(), ..Delivery::of(msg, QoS::ExactlyOnce) }
    }

    #[test]
    fn reopened_store_has_sessions_deliveries_and_retained() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = DiskStore::open(&config(dir.path()), UnixClock::read()).unwrap();
            let will = LastWill {
                topic: ByteString::from_static("w"),
                payload: Bytes::from_static(b"bye"),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: Default::default(),
            };
            let options = SubscriptionOptions { qos: QoS::ExactlyOnce, ..Default::default() };
            store.submit(Op::Session(SessionRecord {
                id: 3,
                client_id: ByteString::from_static("c"),
                expiry_secs: 60,
                will: Some(will),
                subscriptions: vec![(
                    ByteString::from_static("a/#"),
                    SubscriptionRecord { options, sub_id: Some(7) },
                )],
                offline_since: Some(5),
            }));
            for (seq, p, ids) in [(1, "one", &[7][..]), (2, "two", &[7]), (3, "three", &[7, 9])] {
                store.submit(Op::Append { session: 3, seq, delivery: delivery(p, ids) });
            }
            store.submit(Op::Stage { session: 3, seq: 2, stage: Stage::Released });
            store.submit(Op::Done { session: 3, seq: 1 });
            store.submit(Op::IncomingQos2 { session: 3, packet_id: 9, pending: true });
            let retained = Message::internal(ByteString::from_static("r"), Bytes::from_static(b"kept"), true);
            store.submit(Op::Retain(retained));
            store.close();
        }
        let store = DiskStore::open(&config(dir.path()), UnixClock::read()).unwrap();
        let found = store.take_recovered();
        assert_eq!(found.next_session_id, 4);
        let s = &found.sessions[0];
        assert_eq!((s.record.client_id.as_ref(), s.record.expiry_secs), ("c", 60));
        assert_eq!(s.record.will.as_ref().map(|w| w.payload.clone()), Some(Bytes::from_static(b"bye")));
        assert_eq!(s.record.subscriptions[0].1.sub_id, Some(7));
        assert_eq!(s.queued.iter().map(|q| q.0).collect::<Vec<_>>(), [2, 3]);
        assert_eq!((s.next_seq, s.incoming_qos2.as_slice()), (4, &[9u16][..]));
        assert_eq!(&found.retained[0].payload[..], b"kept");
        let (tx, rx) = tokio::sync::oneshot::channel();
        store.submit(Op::Load { session: 3, reply: tx });
        let loaded = rx.blocking_recv().unwrap().unwrap();
        let got: Vec<_> = loaded.iter().map(|s| (s.seq, s.stage, s.delivery.msg.payload.clone())).collect();
        assert_eq!(
            got,
            [
                (2, Stage::Released, Bytes::from_static(b"two")),
                (3, Stage::Queued, Bytes::from_static(b"three"))
            ]
        );
        assert_eq!(
            (loaded[0].delivery.qos, loaded[0].delivery.sub_ids.as_slice()),
            (QoS::ExactlyOnce, &[7][..])
        );
        assert_eq!(loaded[1].delivery.sub_ids.as_slice(), [7, 9], "a merged delivery keeps every id");
    }

    /// A store directory holding two retained messages, closed.
    fn two_retained() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStore::open(&config(dir.path()), UnixClock::read()).unwrap();
        for topic in ["r/1", "r/2"] {
            let msg = Message::internal(ByteString::from_static(topic), Bytes::from_static(b"x"), true);
            store.submit(Op::Retain(msg));
        }
        store.close();
        dir
    }

    #[test]
    fn damage_is_reported_with_the_segment_and_offset() {
        let dir = two_retained();
        let segment = dir.path().join(segment_name(1));
        let mut data = fs::read(&segment).unwrap();
        let first = SEGMENT_MAGIC.len();
        data[first + record::FRAME_HEADER] ^= 0xFF;
        fs::write(&segment, data).unwrap();
        match DiskStore::open(&config(dir.path()), UnixClock::read()) {
            Err(StoreError::Damaged { segment: at, offset, source }) => {
                assert_eq!((at, offset), (segment, first as u64));
                assert!(matches!(source, RecordError::Checksum), "{source:?}");
                assert_eq!(source.to_string(), "record checksum mismatch");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_record_cut_short_into_zeros_is_cut_off() {
        let dir = two_retained();
        // The second record's first bytes reached the disk, the rest of it and more are zeros.
        let segment = dir.path().join(segment_name(1));
        let mut data = fs::read(&segment).unwrap();
        let second = SEGMENT_MAGIC.len() + record::unframe(&data[SEGMENT_MAGIC.len()..]).unwrap().unwrap().2;
        data.truncate(second + 6);
        data.resize(data.len() + 100, 0);
        fs::write(&segment, data).unwrap();
        let store = DiskStore::open(&config(dir.path()), UnixClock::read()).unwrap();
        let found = store.take_recovered();
        let topics: Vec<_> = found.retained.iter().map(|m| m.topic.to_string()).collect();
        assert_eq!(topics, ["r/1"]);
        assert_eq!(fs::metadata(&segment).unwrap().len(), second as u64);
    }

    #[test]
    fn a_foreign_or_busy_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        match DiskStore::open(&config(dir.path()), UnixClock::read()) {
            Err(StoreError::Foreign { dir: at, found, .. }) => {
                assert_eq!((at.as_path(), found.as_str()), (dir.path(), "notes.txt"))
            }
            other => panic!("{other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let _open = DiskStore::open(&config(dir.path()), UnixClock::read()).unwrap();
        match DiskStore::open(&config(dir.path()), UnixClock::read()) {
            Err(StoreError::InUse { dir: at }) => assert_eq!(at, dir.path()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_file_system_error_carries_the_path_and_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, "").unwrap();
        let data_dir = file.join("data");
        let err = DiskStore::open(&config(&data_dir), UnixClock::read()).unwrap_err();
        assert!(
            matches!(&err, StoreError::Io { path, what: "cannot create the data directory", .. } if *path == data_dir),
            "{err:?}"
        );
        let source = std::error::Error::source(&err).and_then(|e| e.downcast_ref::<io::Error>());
        assert!(source.is_some(), "{err:?}");
        assert!(err.to_string().starts_with(&format!("{}: cannot create", data_dir.display())), "{err}");
    }

    #[test]
    fn frame_header_is_length_and_crc() {
        let mut out = Vec::new();
        assert_eq!(record::frame(&mut out, kind::DONE, &[1, 2]), record::FRAME_HEADER + 3);
        assert_eq!(
            record::unframe(&out).unwrap().unwrap(),
            (kind::DONE, &[1u8, 2][..], record::FRAME_HEADER + 3)
        );
        out[9] ^= 1;
        assert!(record::unframe(&out).is_err());
    }
}
