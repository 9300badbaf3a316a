//! Braid's durable-session workload against three stores: fjall (LSM), redb (B-tree) and an
//! append-only segment log of our own.
//!
//! Phase 1 (throughput): SESSIONS sessions each get MSGS queued 1 KiB messages, appended in
//! batches of BATCH with one fsync per batch (group commit); then every message is acked
//! (deleted), again in fsynced batches.
//! Phase 2 (recovery): the same SESSIONS x MSGS messages are appended and left queued; the
//! store is closed and reopened, and every queued message's key is read back into an index
//! (what a broker needs to resume delivery). Time to open and index is the restart time.
//!
//! Usage: braid-store-bench DIR [SESSIONS] [MSGS] [BATCH]

use redb::ReadableTable;
use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

const PAYLOAD: usize = 1024;

fn key(session: u32, seq: u32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&session.to_be_bytes());
    k[4..].copy_from_slice(&seq.to_be_bytes());
    k
}

trait Candidate {
    fn name(&self) -> &'static str;
    fn append(&mut self, batch: &[(u32, u32)], payload: &[u8]);
    fn ack(&mut self, batch: &[(u32, u32)]);
    /// Reopens the store and returns how many queued messages it found.
    fn reopen_and_index(&mut self) -> usize;
}

struct Fjall {
    dir: PathBuf,
    ks: Option<fjall::Keyspace>,
    part: Option<fjall::PartitionHandle>,
}

impl Fjall {
    fn open(dir: &Path) -> Fjall {
        let ks = fjall::Config::new(dir).open().unwrap();
        let part = ks.open_partition("queue", fjall::PartitionCreateOptions::default()).unwrap();
        Fjall { dir: dir.into(), ks: Some(ks), part: Some(part) }
    }
}

impl Candidate for Fjall {
    fn name(&self) -> &'static str {
        "fjall 2"
    }
    fn append(&mut self, batch: &[(u32, u32)], payload: &[u8]) {
        let ks = self.ks.as_ref().unwrap();
        let mut b = ks.batch();
        for &(s, q) in batch {
            b.insert(self.part.as_ref().unwrap(), key(s, q), payload);
        }
        b.commit().unwrap();
        ks.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    fn ack(&mut self, batch: &[(u32, u32)]) {
        let ks = self.ks.as_ref().unwrap();
        let mut b = ks.batch();
        for &(s, q) in batch {
            b.remove(self.part.as_ref().unwrap(), key(s, q));
        }
        b.commit().unwrap();
        ks.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    fn reopen_and_index(&mut self) -> usize {
        self.part = None;
        self.ks = None;
        let reopened = Fjall::open(&self.dir);
        let n = reopened.part.as_ref().unwrap().keys().count();
        *self = reopened;
        n
    }
}

struct Redb {
    path: PathBuf,
    db: Option<redb::Database>,
}

const TABLE: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("queue");

impl Redb {
    fn open(path: &Path) -> Redb {
        Redb { path: path.into(), db: Some(redb::Database::create(path).unwrap()) }
    }
}

impl Candidate for Redb {
    fn name(&self) -> &'static str {
        "redb 2"
    }
    fn append(&mut self, batch: &[(u32, u32)], payload: &[u8]) {
        let tx = self.db.as_ref().unwrap().begin_write().unwrap();
        {
            let mut t = tx.open_table(TABLE).unwrap();
            for &(s, q) in batch {
                t.insert(u64::from_be_bytes(key(s, q)), payload).unwrap();
            }
        }
        tx.commit().unwrap();
    }
    fn ack(&mut self, batch: &[(u32, u32)]) {
        let tx = self.db.as_ref().unwrap().begin_write().unwrap();
        {
            let mut t = tx.open_table(TABLE).unwrap();
            for &(s, q) in batch {
                t.remove(u64::from_be_bytes(key(s, q))).unwrap();
            }
        }
        tx.commit().unwrap();
    }
    fn reopen_and_index(&mut self) -> usize {
        self.db = None;
        let reopened = Redb::open(&self.path);
        let n = {
            let tx = reopened.db.as_ref().unwrap().begin_read().unwrap();
            let t = tx.open_table(TABLE).unwrap();
            t.iter().unwrap().count()
        };
        *self = reopened;
        n
    }
}

/// Append-only log: records `[len u32][crc32 u32][kind u8][session u32][seq u32][payload]`,
/// 64 MiB segments, one write + fdatasync per batch.
struct Log {
    dir: PathBuf,
    file: File,
    seg: u32,
    size: u64,
    buf: Vec<u8>,
}

const SEGMENT: u64 = 64 << 20;

impl Log {
    fn open(dir: &Path) -> Log {
        fs::create_dir_all(dir).unwrap();
        let file = Self::segment(dir, 0);
        Log { dir: dir.into(), file, seg: 0, size: 0, buf: Vec::new() }
    }
    fn segment(dir: &Path, n: u32) -> File {
        OpenOptions::new().create(true).append(true).open(dir.join(format!("{n:08}.log"))).unwrap()
    }
    fn record(&mut self, kind: u8, s: u32, q: u32, payload: &[u8]) {
        let mut body = Vec::with_capacity(9 + payload.len());
        body.push(kind);
        body.extend_from_slice(&key(s, q));
        body.extend_from_slice(payload);
        self.buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        self.buf.extend_from_slice(&body);
    }
    fn commit(&mut self) {
        self.file.write_all(&self.buf).unwrap();
        self.file.sync_data().unwrap();
        self.size += self.buf.len() as u64;
        self.buf.clear();
        if self.size > SEGMENT {
            self.seg += 1;
            self.size = 0;
            self.file = Self::segment(&self.dir, self.seg);
        }
    }
}

impl Candidate for Log {
    fn name(&self) -> &'static str {
        "segment log"
    }
    fn append(&mut self, batch: &[(u32, u32)], payload: &[u8]) {
        for &(s, q) in batch {
            self.record(1, s, q, payload);
        }
        self.commit();
    }
    fn ack(&mut self, batch: &[(u32, u32)]) {
        for &(s, q) in batch {
            self.record(2, s, q, &[]);
        }
        self.commit();
    }
    fn reopen_and_index(&mut self) -> usize {
        let mut live = std::collections::HashMap::<u64, (u32, u64)>::new();
        let mut names: Vec<_> = fs::read_dir(&self.dir).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        for (n, path) in names.iter().enumerate() {
            let mut r = BufReader::with_capacity(1 << 20, File::open(path).unwrap());
            let mut head = [0u8; 8];
            let mut body = Vec::new();
            let mut off = 0u64;
            while r.read_exact(&mut head).is_ok() {
                let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
                body.resize(len, 0);
                r.read_exact(&mut body).unwrap();
                assert_eq!(crc32fast::hash(&body), u32::from_le_bytes(head[4..].try_into().unwrap()));
                let k = u64::from_be_bytes(body[1..9].try_into().unwrap());
                if body[0] == 1 {
                    live.insert(k, (n as u32, off));
                } else {
                    live.remove(&k);
                }
                off += 8 + len as u64;
            }
        }
        live.len()
    }
}

fn run(c: &mut dyn Candidate, sessions: u32, msgs: u32, batch: usize, payload: &[u8]) {
    let keys: Vec<(u32, u32)> = (0..msgs).flat_map(|q| (0..sessions).map(move |s| (s, q))).collect();
    let n = keys.len() as f64;
    let t = Instant::now();
    for b in keys.chunks(batch) {
        c.append(b, payload);
    }
    let append = n / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for b in keys.chunks(batch) {
        c.ack(b);
    }
    let ack = n / t.elapsed().as_secs_f64();
    // Recovery: the same messages again, left queued.
    for b in keys.chunks(batch.max(1000)) {
        c.append(b, payload);
    }
    let t = Instant::now();
    let found = c.reopen_and_index();
    let reopen = t.elapsed();
    assert_eq!(found, keys.len());
    println!(
        "| {} | {:.0} | {:.0} | {:.2} s |",
        c.name(),
        append,
        ack,
        reopen.as_secs_f64()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).expect("usage: braid-store-bench DIR [SESSIONS] [MSGS] [BATCH]"));
    let sessions: u32 = args.get(2).map_or(100_000, |s| s.parse().unwrap());
    let msgs: u32 = args.get(3).map_or(10, |s| s.parse().unwrap());
    let batch: usize = args.get(4).map_or(256, |s| s.parse().unwrap());
    let only = std::env::var("ONLY").ok();
    let payload = vec![0x5a; PAYLOAD];
    println!("{sessions} sessions x {msgs} messages of {PAYLOAD} B, fsync per batch of {batch}");
    println!("| store | append msg/s | ack msg/s | reopen + index {} msgs |", sessions * msgs);
    println!("| --- | --- | --- | --- |");
    let _ = fs::remove_dir_all(&dir);
    let want = |name: &str| only.as_deref().map_or(true, |o| o == name);
    if want("log") {
        run(&mut Log::open(&dir.join("log")), sessions, msgs, batch, &payload);
    }
    if want("fjall") {
        run(&mut Fjall::open(&dir.join("fjall")), sessions, msgs, batch, &payload);
    }
    if want("redb") {
        fs::create_dir_all(&dir).unwrap();
        run(&mut Redb::open(&dir.join("redb.db")), sessions, msgs, batch, &payload);
    }
    let _ = fs::remove_dir_all(&dir);
}
