//! Model-based test of the disk store (`store::disk`): random sequences of store operations
//! (session records saved and ended, deliveries queued, staged and finished, inbound QoS 2 ids,
//! retained messages set and cleared) go to a store with 4 KiB segments, so that segments roll
//! over and get compacted, and to a model of what it keeps. At random points the store stops
//! and its last segment may be torn at a random byte, maybe followed by zeros (a write a
//! crash cut short); it is reopened and what it recovers is compared with the model.
//!
//! What is compared is what the store promises: every change it announced durable before the
//! crash comes back. Of the changes after that, a torn write keeps a prefix, whole records
//! only: the recovered state must be the model after some prefix of them. (`MemoryStore`
//! keeps nothing, so the model is this file's own.)

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use braid_broker::config::{Durability, StoreConfig};
use braid_broker::message::{Delivery, Message};
use braid_broker::store::disk::DiskStore;
use braid_broker::store::{Op, SessionRecord, Stage, Store, SubscriptionRecord, Ticket, UnixClock};
use braid_proto::{Bytes, QoS, SubscriptionOptions};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Small enough that a case's few kilobytes of records fill several segments.
const SEGMENT_SIZE: u64 = 4 << 10;

/// One thing the store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Meta(u64),
    Msg(u64, u64),
    Qos2(u64, u16),
    Retained(u8),
}

impl Key {
    fn session(self) -> Option<u64> {
        match self {
            Key::Meta(id) | Key::Msg(id, _) | Key::Qos2(id, _) => Some(id),
            Key::Retained(_) => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Val {
    Meta { expiry: u32, subs: u32 },
    Msg { stage: Stage, payload: Bytes },
    Qos2,
    Retained(Bytes),
}

/// What the store should hold.
type Model = BTreeMap<Key, Val>;

/// A store operation with everything resolved, applied alike to the store and the model.
#[derive(Clone, Debug)]
enum Cmd {
    Session { id: u64, expiry: u32, subs: u32 },
    End(u64),
    Append { session: u64, seq: u64, payload: Bytes },
    Stage { session: u64, seq: u64, stage: Stage },
    Done { session: u64, seq: u64 },
    Qos2 { session: u64, packet_id: u16, pending: bool },
    Retain { topic: u8, payload: Bytes },
}

impl Cmd {
    fn op(&self) -> Op {
        match self.clone() {
            Cmd::Session { id, expiry, subs } => Op::Session(SessionRecord {
                id,
                client_id: format!("c{id}").into(),
                expiry_secs: expiry,
                will: None,
                subscriptions: (0..subs)
                    .map(|i| {
                        let options = SubscriptionOptions { qos: QoS::AtLeastOnce, ..Default::default() };
                        (format!("f/{i}").into(), SubscriptionRecord { options, sub_id: Some(i + 1) })
                    })
                    .collect(),
                offline_since: Some(u64::from(expiry) + 1),
            }),
            Cmd::End(id) => Op::EndSession(id),
            Cmd::Append { session, seq, payload } => {
                let msg = Message::internal(format!("q/{session}").into(), payload, false);
                Op::Append { session, seq, delivery: Delivery { seq, ..Delivery::of(msg, QoS::AtLeastOnce) } }
            }
            Cmd::Stage { session, seq, stage } => Op::Stage { session, seq, stage },
            Cmd::Done { session, seq } => Op::Done { session, seq },
            Cmd::Qos2 { session, packet_id, pending } => Op::IncomingQos2 { session, packet_id, pending },
            Cmd::Retain { topic, payload } => {
                Op::Retain(Message::internal(format!("r/{topic}").into(), payload, true))
            }
        }
    }

    /// The key whose record this writes anew or removes (a stage change keeps the record).
    fn key(&self) -> Option<Key> {
        match *self {
            Cmd::Session { id, .. } => Some(Key::Meta(id)),
            Cmd::End(_) | Cmd::Stage { .. } => None,
            Cmd::Append { session, seq, .. } | Cmd::Done { session, seq } => Some(Key::Msg(session, seq)),
            Cmd::Qos2 { session, packet_id, .. } => Some(Key::Qos2(session, packet_id)),
            Cmd::Retain { topic, .. } => Some(Key::Retained(topic)),
        }
    }

    fn apply(&self, model: &mut Model) {
        match self.clone() {
            Cmd::Session { id, expiry, subs } => {
                model.insert(Key::Meta(id), Val::Meta { expiry, subs });
            }
            Cmd::End(id) => model.retain(|k, _| k.session() != Some(id)),
            Cmd::Append { session, seq, payload } => {
                model.insert(Key::Msg(session, seq), Val::Msg { stage: Stage::Queued, payload });
            }
            Cmd::Stage { session, seq, stage: new } => {
                if let Some(Val::Msg { stage, .. }) = model.get_mut(&Key::Msg(session, seq)) {
                    *stage = new;
                }
            }
            Cmd::Done { session, seq } => {
                model.remove(&Key::Msg(session, seq));
            }
            Cmd::Qos2 { session, packet_id, pending } => {
                let key = Key::Qos2(session, packet_id);
                if pending {
                    model.insert(key, Val::Qos2);
                } else {
                    model.remove(&key);
                }
            }
            Cmd::Retain { topic, payload } => {
                if payload.is_empty() {
                    model.remove(&Key::Retained(topic));
                } else {
                    model.insert(Key::Retained(topic), Val::Retained(payload));
                }
            }
        }
    }
}

/// A generated step; `pick` and `which` choose among the sessions and deliveries of the
/// model when the step runs.
#[derive(Clone, Debug)]
enum Step {
    Session {
        pick: Option<usize>,
        expiry: u32,
        subs: u32,
    },
    End {
        pick: usize,
    },
    Append {
        pick: usize,
        len: usize,
        count: usize,
    },
    Stage {
        pick: usize,
        which: usize,
        released: bool,
    },
    Done {
        pick: usize,
        which: usize,
    },
    Qos2 {
        pick: usize,
        packet_id: u16,
        pending: bool,
    },
    Retain {
        topic: u8,
        len: usize,
    },
    /// Waits until everything submitted is durable and checks every session's deliveries.
    Ack,
    /// Stops the store; `tear`: cut the last segment at that fraction (per mille) of what was
    /// written since the last `Ack`, then append that many zeros.
    Crash {
        tear: Option<(u64, usize)>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (prop::option::of(any::<usize>()), 0u32..1000, 0u32..4)
            .prop_map(|(pick, expiry, subs)| Step::Session { pick, expiry, subs }),
        1 => any::<usize>().prop_map(|pick| Step::End { pick }),
        6 => (any::<usize>(), 1usize..600, 1usize..4)
            .prop_map(|(pick, len, count)| Step::Append { pick, len, count }),
        2 => (any::<usize>(), any::<usize>(), any::<bool>())
            .prop_map(|(pick, which, released)| Step::Stage { pick, which, released }),
        6 => (any::<usize>(), any::<usize>()).prop_map(|(pick, which)| Step::Done { pick, which }),
        2 => (any::<usize>(), 1u16..6, any::<bool>())
            .prop_map(|(pick, packet_id, pending)| Step::Qos2 { pick, packet_id, pending }),
        3 => (0u8..6, prop_oneof![Just(0usize), 1usize..300]).prop_map(|(topic, len)| Step::Retain { topic, len }),
        3 => Just(Step::Ack),
        1 => prop::option::of((0u64..=1000, prop_oneof![Just(0usize), 1usize..100]))
            .prop_map(|tear| Step::Crash { tear }),
    ]
}

/// What the cases saw, over all of them.
#[derive(Debug, Default)]
struct Seen {
    /// The most segment files at once.
    most_segments: AtomicUsize,
    /// Times the number of segment files fell.
    shrinks: AtomicUsize,
    /// Records found alive after every segment they could have been written to was deleted:
    /// copied by a compaction.
    relocated: AtomicUsize,
    crashes: AtomicUsize,
    tears: AtomicUsize,
    /// Torn crashes that lost part of what was written since the last `Ack`.
    torn_losses: AtomicUsize,
}

/// Segment files of `dir`: number and size, in order.
fn segments(dir: &Path) -> Vec<(u32, u64)> {
    let mut out: Vec<(u32, u64)> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let n = name.strip_suffix(".seg")?.parse().unwrap();
            Some((n, e.metadata().unwrap().len()))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Bytes of `len` that name their owner (`tag`), so a record read from the wrong place shows.
fn payload(tag: &str, len: usize) -> Bytes {
    tag.bytes().cycle().take(len).collect::<Vec<u8>>().into()
}

fn fail(what: &str, e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(format!("{what}: {e}"))
}

/// The deliveries the store has for `session`, as the model keeps them.
fn load(store: &DiskStore, session: u64) -> Result<Model, TestCaseError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    store.submit(Op::Load { session, reply: tx });
    let mut out = Model::new();
    for s in rx.blocking_recv().map_err(|e| fail("load", e))?.map_err(|e| fail("load", e))? {
        prop_assert_eq!(s.delivery.seq, s.seq);
        prop_assert_eq!(s.delivery.msg.topic.to_string(), format!("q/{session}"));
        out.insert(
            Key::Msg(session, s.seq),
            Val::Msg { stage: s.stage, payload: s.delivery.msg.payload.clone() },
        );
    }
    Ok(out)
}

/// The keys on which `got` and `want` differ, with both values.
fn diff(got: &Model, want: &Model) -> String {
    let keys: BTreeSet<&Key> = got.keys().chain(want.keys()).collect();
    keys.into_iter()
        .filter(|k| got.get(k) != want.get(k))
        .map(|k| format!("\n{k:?}: recovered {:?}, submitted {:?}", got.get(k), want.get(k)))
        .collect()
}

struct Harness<'a> {
    dir: tempfile::TempDir,
    config: StoreConfig,
    store: Option<DiskStore>,
    rt: tokio::runtime::Runtime,
    /// Everything submitted.
    model: Model,
    /// Everything durable at the last `Ack` (or reopen), and what was submitted since.
    acked: Model,
    tail: Vec<Cmd>,
    last: Ticket,
    /// The last segment (number, size) when `acked` was taken.
    acked_end: (u32, u64),
    next_seq: BTreeMap<u64, u64>,
    next_session: u64,
    /// Versions of retained payloads, so that each differs.
    version: u64,
    /// For each live record, a segment number it is at or below (set at an `Ack`, dropped
    /// when the record is rewritten or removed).
    bounds: BTreeMap<Key, u32>,
    segment_count: usize,
    seen: &'a Seen,
}

impl<'a> Harness<'a> {
    fn new(sync: bool, seen: &'a Seen) -> Result<Harness<'a>, TestCaseError> {
        let dir = tempfile::tempdir().map_err(|e| fail("tempdir", e))?;
        let durability = if sync { Durability::Sync } else { Durability::Async };
        let config = StoreConfig { data_dir: dir.path().into(), durability, ..Default::default() };
        let store = DiskStore::open_with_segment_size(&config, UnixClock::read(), SEGMENT_SIZE)
            .map_err(|e| fail("open", e))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| fail("runtime", e))?;
        let mut h = Harness {
            acked_end: segments(dir.path()).last().copied().unwrap_or_default(),
            dir,
            config,
            store: Some(store),
            rt,
            model: Model::new(),
            acked: Model::new(),
            tail: Vec::new(),
            last: 0,
            next_seq: BTreeMap::new(),
            next_session: 1,
            version: 0,
            bounds: BTreeMap::new(),
            segment_count: 0,
            seen,
        };
        h.observe();
        Ok(h)
    }

    fn store(&self) -> &DiskStore {
        self.store.as_ref().expect("open")
    }

    fn sessions(&self) -> Vec<u64> {
        self.model.keys().filter_map(|k| if let Key::Meta(id) = k { Some(*id) } else { None }).collect()
    }

    fn pick_session(&self, pick: usize) -> Option<u64> {
        let ids = self.sessions();
        (!ids.is_empty()).then(|| ids[pick % ids.len()])
    }

    fn pick_msg(&self, pick: usize, which: usize) -> Option<(u64, u64)> {
        let session = self.pick_session(pick)?;
        let seqs: Vec<u64> = self
            .model
            .range(Key::Msg(session, 0)..=Key::Msg(session, u64::MAX))
            .map(|(k, _)| if let Key::Msg(_, seq) = k { *seq } else { unreachable!() })
            .collect();
        (!seqs.is_empty()).then(|| (session, seqs[which % seqs.len()]))
    }

    fn submit(&mut self, cmd: Cmd) {
        self.last = self.store().submit(cmd.op());
        cmd.apply(&mut self.model);
        match cmd {
            Cmd::End(id) => {
                self.bounds.retain(|k, _| k.session() != Some(id));
                self.next_seq.remove(&id);
            }
            _ => {
                if let Some(key) = cmd.key() {
                    self.bounds.remove(&key);
                }
            }
        }
        self.tail.push(cmd);
    }

    fn step(&mut self, step: Step) -> Result<(), TestCaseError> {
        match step {
            Step::Session { pick, expiry, subs } => {
                let id = match pick.and_then(|p| self.pick_session(p)) {
                    Some(id) => id,
                    None => {
                        let id = self.next_session;
                        self.next_session += 1;
                        id
                    }
                };
                self.submit(Cmd::Session { id, expiry, subs });
            }
            Step::End { pick } => {
                if let Some(id) = self.pick_session(pick) {
                    self.submit(Cmd::End(id));
                }
            }
            Step::Append { pick, len, count } => {
                if let Some(session) = self.pick_session(pick) {
                    for _ in 0..count {
                        let next = self.next_seq.entry(session).or_insert(1);
                        let seq = *next;
                        *next += 1;
                        let payload = payload(&format!("{session}:{seq};"), len);
                        self.submit(Cmd::Append { session, seq, payload });
                    }
                }
            }
            Step::Stage { pick, which, released } => {
                if let Some((session, seq)) = self.pick_msg(pick, which) {
                    let stage = if released { Stage::Released } else { Stage::Sent };
                    self.submit(Cmd::Stage { session, seq, stage });
                }
            }
            Step::Done { pick, which } => {
                if let Some((session, seq)) = self.pick_msg(pick, which) {
                    self.submit(Cmd::Done { session, seq });
                }
            }
            Step::Qos2 { pick, packet_id, pending } => {
                if let Some(session) = self.pick_session(pick) {
                    self.submit(Cmd::Qos2 { session, packet_id, pending });
                }
            }
            Step::Retain { topic, len } => {
                self.version += 1;
                let payload = payload(&format!("r{topic}v{};", self.version), len);
                self.submit(Cmd::Retain { topic, payload });
            }
            Step::Ack => self.ack()?,
            Step::Crash { tear } => self.crash(tear)?,
        }
        Ok(())
    }

    /// Waits for everything submitted to be durable, then compares every session's deliveries
    /// as the running store reads them back.
    fn ack(&mut self) -> Result<(), TestCaseError> {
        let mut durable = self.store().durable();
        let last = self.last;
        let wait =
            async { tokio::time::timeout(Duration::from_secs(10), durable.wait_for(|t| *t >= last)).await };
        self.rt.block_on(wait).map_err(|e| fail("durable", e))?.map_err(|e| fail("durable", e))?;
        self.acked = self.model.clone();
        self.tail.clear();
        self.acked_end = segments(self.dir.path()).last().copied().unwrap_or_default();
        for id in self.sessions() {
            let want: Model = self
                .model
                .range(Key::Msg(id, 0)..=Key::Msg(id, u64::MAX))
                .map(|(k, v)| (*k, v.clone()))
                .collect();
            prop_assert_eq!(load(self.store(), id)?, want, "deliveries of session {}", id);
        }
        self.observe();
        Ok(())
    }

    /// Stops the store, maybe tears its last segment, reopens it and compares what it finds.
    fn crash(&mut self, tear: Option<(u64, usize)>) -> Result<(), TestCaseError> {
        self.seen.crashes.fetch_add(1, Ordering::Relaxed);
        self.store.take().expect("open").close();
        let (last, size) = segments(self.dir.path()).last().copied().unwrap_or_default();
        let mut candidates = vec![self.model.clone()];
        // Only what was written after the last durable point can be torn, and only while it
        // went to the same segment (a rollover syncs the segment it closes).
        if let Some((per_mille, zeros)) =
            tear.filter(|_| last == self.acked_end.0 && size >= self.acked_end.1)
        {
            self.seen.tears.fetch_add(1, Ordering::Relaxed);
            let from = self.acked_end.1;
            let cut = from + (size - from) * per_mille / 1000;
            let path = self.dir.path().join(format!("{last:08}.seg"));
            let mut file = OpenOptions::new().append(true).open(path).map_err(|e| fail("tear", e))?;
            file.set_len(cut).map_err(|e| fail("tear", e))?;
            file.write_all(&vec![0; zeros]).map_err(|e| fail("tear", e))?;
            candidates = Vec::with_capacity(self.tail.len() + 1);
            let mut model = self.acked.clone();
            candidates.push(model.clone());
            for cmd in &self.tail {
                cmd.apply(&mut model);
                candidates.push(model.clone());
            }
        }
        let store = DiskStore::open_with_segment_size(&self.config, UnixClock::read(), SEGMENT_SIZE)
            .map_err(|e| fail("reopen", e))?;
        let found = store.take_recovered();
        let mut got = Model::new();
        self.next_seq.clear();
        for s in &found.sessions {
            let r = &s.record;
            prop_assert_eq!(r.client_id.to_string(), format!("c{}", r.id));
            prop_assert_eq!(r.offline_since, Some(u64::from(r.expiry_secs) + 1));
            for (i, (filter, sub)) in r.subscriptions.iter().enumerate() {
                prop_assert_eq!(filter.to_string(), format!("f/{i}"));
                prop_assert_eq!(sub.sub_id, Some(i as u32 + 1));
            }
            got.insert(
                Key::Meta(r.id),
                Val::Meta { expiry: r.expiry_secs, subs: r.subscriptions.len() as u32 },
            );
            got.extend(s.incoming_qos2.iter().map(|&p| (Key::Qos2(r.id, p), Val::Qos2)));
            let msgs = load(&store, r.id)?;
            let seqs: Vec<Key> = s.queued.iter().map(|&(seq, _)| Key::Msg(r.id, seq)).collect();
            prop_assert_eq!(&seqs, &msgs.keys().copied().collect::<Vec<_>>(), "queued of session {}", r.id);
            let top = seqs.last().map_or(0, |k| if let Key::Msg(_, seq) = k { *seq } else { 0 });
            prop_assert!(s.next_seq > top, "next_seq {} of session {} not above {}", s.next_seq, r.id, top);
            self.next_seq.insert(r.id, s.next_seq);
            got.extend(msgs);
        }
        for m in &found.retained {
            let topic = m.topic.strip_prefix("r/").and_then(|t| t.parse().ok()).expect("a topic r/N");
            got.insert(Key::Retained(topic), Val::Retained(m.payload.clone()));
        }
        let top = got.keys().filter_map(|k| k.session()).max().unwrap_or(0);
        prop_assert!(
            found.next_session_id > top,
            "next session id {} not above {}",
            found.next_session_id,
            top
        );
        let Some(k) = candidates.iter().position(|c| *c == got) else {
            let all = candidates.last().cloned().unwrap_or_default();
            return Err(fail(
                "recovered no prefix of what was submitted; against all of it",
                diff(&got, &all),
            ));
        };
        if k + 1 < candidates.len() {
            self.seen.torn_losses.fetch_add(1, Ordering::Relaxed);
        }
        self.model = got;
        self.acked = self.model.clone();
        self.tail.clear();
        self.next_session = found.next_session_id;
        self.store = Some(store);
        self.last = 0;
        self.acked_end = segments(self.dir.path()).last().copied().unwrap_or_default();
        self.observe();
        Ok(())
    }

    /// Notes the number of segment files and which live records must have been relocated.
    fn observe(&mut self) {
        let segs = segments(self.dir.path());
        let (first, last) = (segs.first().map_or(0, |s| s.0), segs.last().map_or(0, |s| s.0));
        self.seen.most_segments.fetch_max(segs.len(), Ordering::Relaxed);
        if segs.len() < self.segment_count {
            self.seen.shrinks.fetch_add(1, Ordering::Relaxed);
        }
        self.segment_count = segs.len();
        let model = &self.model;
        self.bounds.retain(|k, _| model.contains_key(k));
        let relocated = self.bounds.values().filter(|&&b| b < first).count();
        self.seen.relocated.fetch_add(relocated, Ordering::Relaxed);
        self.bounds.retain(|_, b| *b >= first);
        for k in self.model.keys() {
            self.bounds.entry(*k).or_insert(last);
        }
    }
}

#[test]
fn disk_store_recovers_what_the_model_says() {
    let seen = Seen::default();
    let config = Config { cases: 96, failure_persistence: None, ..Config::default() };
    let cases = (any::<bool>(), prop::collection::vec(step(), 1..400));
    TestRunner::new(config)
        .run(&cases, |(sync, steps)| {
            let mut h = Harness::new(sync, &seen)?;
            for s in steps {
                h.step(s)?;
            }
            h.crash(None)
        })
        .unwrap();
    eprintln!("{seen:?}");
    assert!(seen.most_segments.load(Ordering::Relaxed) > 2, "segments never rolled over: {seen:?}");
    assert!(seen.shrinks.load(Ordering::Relaxed) > 0, "segments never deleted: {seen:?}");
    assert!(seen.relocated.load(Ordering::Relaxed) > 0, "no record relocated: {seen:?}");
    assert!(seen.torn_losses.load(Ordering::Relaxed) > 0, "no torn write lost anything: {seen:?}");
}
