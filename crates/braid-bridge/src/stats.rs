//! A bridge's or sink's counters and state, published under `$SYS/bridges/<kind>/<name>/...`
//! (`$SYS/sinks/<type>/<name>/...`) every `sys.interval_secs` (retained, as the broker's own
//! `$SYS` topics), listed by the admin API (`/api/v1/bridges`, `/api/v1/sinks`) and exported
//! to its metrics.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use braid_broker::message::Message;
use braid_broker::metrics::Histogram;
use braid_broker::report::{HistogramSample, Kind, Report, Sample};
use braid_broker::Broker;
use braid_proto::{ByteString, Bytes};
use tokio_util::sync::CancellationToken;

/// What one bridge or sink counts (a sink's `failed` are its retried writes, its `dropped`
/// what its target refused for good).
#[derive(Debug)]
pub(crate) struct Stats {
    /// The other side answers (the last thing heard from it was not a failure).
    pub up: AtomicBool,
    /// Messages bridged out and acknowledged by the other side.
    pub sent: AtomicU64,
    /// Messages the other side failed to take that go out again (the outbox resends them).
    pub failed: AtomicU64,
    /// Messages not bridged out, for good: too large, or a topic or key that cannot be made
    /// for them, or refused by the other side as such.
    pub dropped: AtomicU64,
    /// Messages handed to the other side and not acknowledged yet.
    pub in_flight: AtomicU64,
    /// Messages brought in and published in Braid.
    pub received: AtomicU64,
    /// Records brought in that could not be published (no MQTT topic can be made for them).
    pub skipped: AtomicU64,
    /// How long the other side took to confirm a write (a sink's batch).
    pub writes: Histogram,
    /// When a message was last logged as dropped or skipped, in seconds since the bridge
    /// started: such lines are logged at most once a second (the counters count them all).
    last_logged: AtomicU64,
    started: OnceInstant,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            up: AtomicBool::default(),
            sent: AtomicU64::default(),
            failed: AtomicU64::default(),
            dropped: AtomicU64::default(),
            in_flight: AtomicU64::default(),
            received: AtomicU64::default(),
            skipped: AtomicU64::default(),
            writes: Histogram::new(WRITE_US),
            last_logged: AtomicU64::default(),
            started: OnceInstant::default(),
        }
    }
}

/// The buckets of [`Stats::writes`]: 1 ms to 10 s.
const WRITE_US: &[u64] = &[
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 10_000_000,
];

/// When the stats were made.
#[derive(Debug)]
struct OnceInstant(Instant);

impl Default for OnceInstant {
    fn default() -> Self {
        OnceInstant(Instant::now())
    }
}

/// Adds one to `counter`.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Takes one from `counter`.
pub(crate) fn drop_one(counter: &AtomicU64) {
    counter.fetch_sub(1, Ordering::Relaxed);
}

impl Stats {
    /// True if a line about a dropped or skipped message may be logged now (at most one a
    /// second, the first at once).
    pub(crate) fn may_log(&self) -> bool {
        let now = self.started.0.elapsed().as_secs() + 1;
        let last = self.last_logged.load(Ordering::Relaxed);
        now > last
            && self.last_logged.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// Sets whether the other side answers; true if that changed.
    pub(crate) fn set_up(&self, up: bool) -> bool {
        self.up.swap(up, Ordering::Relaxed) != up
    }
}

/// What a bridge or sink counts, once for `$SYS`, the API and the metrics.
pub(crate) struct Counter {
    /// Its `$SYS/<collection>/.../<name>/` subtopic (with `_` for `/`: its key in the API).
    topic: &'static str,
    /// Its metric's name and help.
    metric: &'static str,
    help: &'static str,
    kind: Kind,
    /// Its value; None where it does not apply (an outbox's depth without an outbox).
    read: fn(&Watched, &Broker) -> Option<u64>,
}

/// What operators see of a kind of thing watched: bridges or sinks.
pub(crate) struct Family {
    /// Its collection in the admin API and its `$SYS/<collection>/` topics.
    collection: &'static str,
    /// The label that names one in the metrics.
    label: &'static str,
    /// The metric that says whether its other side answers.
    up: &'static str,
    counters: &'static [Counter],
    /// The metric of [`Stats::writes`], with its help, if it exports it.
    writes: Option<(&'static str, &'static str)>,
}

fn get(c: &AtomicU64) -> Option<u64> {
    Some(c.load(Ordering::Relaxed))
}

/// The depth of the outbox of `w`, if it has one.
fn queued(w: &Watched, broker: &Broker) -> Option<u64> {
    w.outbox.as_ref().map(|o| broker.held_for(o).unwrap_or(0) as u64)
}

/// Bridges: `$SYS/bridges/<kind>/<name>/...`, `/api/v1/bridges`, `braid_bridge_*`.
pub(crate) const BRIDGES: Family = Family {
    collection: "bridges",
    label: "bridge",
    up: "braid_bridge_up",
    writes: None,
    counters: &[
        Counter {
            topic: "out/sent",
            metric: "braid_bridge_sent_total",
            help: "Messages bridged out and acknowledged by the other side.",
            kind: Kind::Counter,
            read: |w, _| get(&w.stats.sent),
        },
        Counter {
            topic: "out/failed",
            metric: "braid_bridge_failed_total",
            help: "Messages the other side failed to take, sent again.",
            kind: Kind::Counter,
            read: |w, _| get(&w.stats.failed),
        },
        Counter {
            topic: "out/dropped",
            metric: "braid_bridge_dropped_total",
            help: "Messages that could never be bridged out.",
            kind: Kind::Counter,
            read: |w, _| get(&w.stats.dropped),
        },
        Counter {
            topic: "out/inflight",
            metric: "braid_bridge_inflight_messages",
            help: "Messages handed to the other side, not yet acknowledged.",
            kind: Kind::Gauge,
            read: |w, _| get(&w.stats.in_flight),
        },
        Counter {
            topic: "in/received",
            metric: "braid_bridge_received_total",
            help: "Messages brought in and published in Braid.",
            kind: Kind::Counter,
            read: |w, _| get(&w.stats.received),
        },
        Counter {
            topic: "in/skipped",
            metric: "braid_bridge_skipped_total",
            help: "Records brought in that could not be published.",
            kind: Kind::Counter,
            read: |w, _| get(&w.stats.skipped),
        },
        Counter {
            topic: "out/queued",
            metric: "braid_bridge_queued_messages",
            help: "Messages waiting in the bridge's outbox.",
            kind: Kind::Gauge,
            read: queued,
        },
    ],
};

/// Sinks: `$SYS/sinks/<type>/<name>/...`, `/api/v1/sinks`, `braid_sink_*`.
pub(crate) const SINKS: Family = Family {
    collection: "sinks",
    label: "sink",
    up: "braid_sink_up",
    writes: Some((
        "braid_sink_write_seconds",
        "How long the target took to confirm a write (a batch of outputs).",
    )),
    counters: &[
        Counter {
            topic: "sent",
            metric: "braid_sink_sent_total",
            help: "Rule outputs the target confirmed.",
            kind: Kind::Counter,
            read: |w, _| get(&w.stats.sent),
        },
        Counter {
            topic: "retried",
            metric: "braid_sink_retried_total",
            help: "Writes of rule outputs that failed (target away, 5xx, timeout) and were sent again.",
            kind: Kind::Counter,
            read: |w, _| get(&w.stats.failed),
        },
        Counter {
            topic: "failed",
            metric: "braid_sink_failed_total",
            help: "Rule outputs the target refused for good (4xx, a constraint): not sent again.",
            kind: Kind::Counter,
            read: |w, _| get(&w.stats.dropped),
        },
        Counter {
            topic: "dropped",
            metric: "braid_sink_dropped_total",
            help: "Rule outputs that did not go into the sink's outbox, or were dropped from it, for want of room.",
            kind: Kind::Counter,
            read: |w, broker| {
                let rules = broker.rules();
                Some(rules.outboxes().iter().find(|o| *o.sink == *w.name).map_or(0, |o| o.dropped()))
            },
        },
        Counter {
            topic: "inflight",
            metric: "braid_sink_inflight_messages",
            help: "Rule outputs being written to the target.",
            kind: Kind::Gauge,
            read: |w, _| get(&w.stats.in_flight),
        },
        Counter {
            topic: "queued",
            metric: "braid_sink_queued_messages",
            help: "Rule outputs waiting in the sink's outbox.",
            kind: Kind::Gauge,
            read: queued,
        },
    ],
};

/// One bridge or sink as operators see it: its counters and its outbox's depth, published
/// under `$SYS/<collection>/<kind>/<name>/` and reported to the admin API and metrics.
pub(crate) struct Watched {
    family: &'static Family,
    kind: &'static str,
    name: String,
    stats: Arc<Stats>,
    /// The client id of its outbox's session, if it has one.
    outbox: Option<String>,
    broker: Weak<Broker>,
    /// Cancelled when the bridge stops.
    stop: CancellationToken,
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched").field("kind", &self.kind).field("name", &self.name).finish_non_exhaustive()
    }
}

/// What [`Watched::start`] watches: of `family`, the `name`d one of `kind`, its counters
/// `stats`, and the client id of its outbox, if it has one.
pub(crate) struct Watch {
    pub family: &'static Family,
    pub kind: &'static str,
    pub name: String,
    pub stats: Arc<Stats>,
    pub outbox: Option<String>,
}

impl Watched {
    /// Watches `watch`: registers it with the broker's reports and publishes its `$SYS`
    /// topics (none if `sys.interval_secs` is 0) until `stop`, when it is taken off the
    /// reports.
    pub(crate) fn start(broker: &Arc<Broker>, watch: Watch, stop: CancellationToken) {
        let Watch { family, kind, name, stats, outbox } = watch;
        let broker_ref = Arc::downgrade(broker);
        let watched = Arc::new(Watched { family, kind, name, stats, outbox, broker: broker_ref, stop });
        broker.add_report(watched.clone());
        tokio::spawn(publish(broker.clone(), watched));
    }

    /// Its counters that apply, each with what describes it.
    fn values(&self, broker: &Broker) -> Vec<(&'static Counter, u64)> {
        self.family.counters.iter().filter_map(|c| Some((c, (c.read)(self, broker)?))).collect()
    }

    fn state(&self) -> &'static str {
        if self.stats.up.load(Ordering::Relaxed) {
            "up"
        } else {
            "down"
        }
    }
}

impl Report for Watched {
    fn collection(&self) -> &'static str {
        self.family.collection
    }

    fn entries(&self) -> Vec<serde_json::Value> {
        let Some(broker) = self.broker.upgrade() else { return Vec::new() };
        let mut entry = serde_json::json!({ "name": self.name, "kind": self.kind, "state": self.state() });
        for (counter, value) in self.values(&broker) {
            entry[counter.topic.replace('/', "_")] = value.into();
        }
        vec![entry]
    }

    fn histograms(&self, out: &mut Vec<HistogramSample>) {
        if let Some((name, help)) = self.family.writes {
            out.push(HistogramSample {
                name,
                help,
                labels: self.labelled(),
                value: self.stats.writes.snapshot(),
            });
        }
    }

    fn samples(&self, out: &mut Vec<Sample>) {
        let Some(broker) = self.broker.upgrade() else { return };
        let labelled = |mut s: Sample| {
            s.labels = self.labelled();
            s
        };
        out.push(labelled(Sample::gauge(
            self.family.up,
            "1 while the other side answers.",
            f64::from(u8::from(self.state() == "up")),
        )));
        for (c, value) in self.values(&broker) {
            let sample = match c.kind {
                Kind::Counter => Sample::counter(c.metric, c.help, value),
                Kind::Gauge => Sample::gauge(c.metric, c.help, value as f64),
            };
            out.push(labelled(sample));
        }
    }
}

impl Watched {
    fn labelled(&self) -> Vec<(&'static str, String)> {
        vec![("kind", self.kind.to_string()), (self.family.label, self.name.clone())]
    }
}

/// Publishes `watched`'s state and counters until it stops, then takes it off the reports.
async fn publish(broker: Arc<Broker>, watched: Arc<Watched>) {
    let secs = broker.config().sys.interval_secs;
    let mut tick = tokio::time::interval(Duration::from_secs(secs.max(1)));
    loop {
        tokio::select! {
            _ = tick.tick(), if secs > 0 => {}
            _ = watched.stop.cancelled() => {
                let report: Arc<dyn Report> = watched.clone();
                broker.remove_report(&report);
                return;
            }
        }
        let values = watched.values(&broker).into_iter().map(|(c, v)| (c.topic, v.to_string()));
        for (topic, value) in std::iter::once(("state", watched.state().to_string())).chain(values) {
            let (collection, kind, name) = (watched.family.collection, watched.kind, &watched.name);
            let topic = ByteString::from(format!("$SYS/{collection}/{kind}/{name}/{topic}"));
            let _ = broker.publish(Message::internal(topic, Bytes::from(value), true), Instant::now());
        }
    }
}
