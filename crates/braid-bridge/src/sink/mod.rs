//! Sinks (`[[sinks]]`, see docs/rules.md): where rules send their outputs.
//!
//! A sink's outbox is the persistent session of the in-process client `$internal/sink/<name>`
//! (`@<node>` in a cluster), into whose queue the broker puts each output of a rule that names
//! the sink, stored before the publisher is acknowledged (see `braid_broker::rules`). The
//! sink's worker takes the outputs out in batches, writes them to the target, and
//! acknowledges each to the outbox once the target confirmed it, or refused it for good (an
//! HTTP 4xx, a violated constraint: counted, logged at most once a second). A write that failed
//! otherwise (the target away, a 5xx, a timeout) is written again after a pause, for as long as
//! it takes, while the outbox keeps what comes meanwhile, bounded by its limits: at least once,
//! and nothing acknowledged is lost to a stopped target or a `kill -9` of Braid. A slow target
//! holds only its own worker: deliveries to subscribers and other sinks go on.

mod http;
mod influxdb;
#[cfg(feature = "kafka")]
mod kafka;
mod mqtt;
mod postgres;
mod redis;

use std::sync::Arc;
use std::time::Duration;

use braid_broker::config::{SinkConfig, SinkKind};
use braid_broker::rules::SinkOutbox;
use braid_broker::Broker;
use braid_client::{Backoff, Client, Event, Properties, ReasonCode, Received};
use futures_util::FutureExt;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::stats::{bump, Stats, Watch, Watched, SINKS};

/// A rule's output, as the rule made it.
pub(crate) type Output = Map<String, Value>;

/// What became of one output written to a target.
#[derive(Debug, Clone)]
pub(crate) enum Written {
    /// The target confirmed it.
    Sent,
    /// The target refused it for good: writing it again would not help.
    Refused(String),
    /// It may not have arrived: written again after a pause.
    Failed(String),
}

impl Written {
    /// What an HTTP answer with `status` means for an output: 2xx is success; 4xx a refusal,
    /// but 408 and 429 (the target asks for time) and anything else are written again.
    fn from_status(status: reqwest::StatusCode) -> Written {
        use reqwest::StatusCode;
        match status {
            s if s.is_success() => Written::Sent,
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => {
                Written::Failed(status.to_string())
            }
            s if s.is_client_error() => Written::Refused(s.to_string()),
            s => Written::Failed(s.to_string()),
        }
    }
}

/// The HTTP client of an `http` or `influxdb` sink: kept-alive connections, `timeout_ms` per
/// request, and `ca_file`'s certificate among the roots if set.
fn http_client(config: &SinkConfig) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_millis(config.timeout_ms))
        .pool_max_idle_per_host(config.batch_size.min(64));
    if !config.ca_file.is_empty() {
        let pem = std::fs::read(&config.ca_file).map_err(|e| format!("ca_file {}: {e}", config.ca_file))?;
        let ca =
            reqwest::Certificate::from_pem(&pem).map_err(|e| format!("ca_file {}: {e}", config.ca_file))?;
        builder = builder.add_root_certificate(ca);
    }
    builder.build().map_err(|e| format!("cannot make an HTTP client: {e}"))
}

/// The first and the longest pause before failed writes are made again.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a sink writes to.
enum Target {
    Http(http::Http),
    Postgres(postgres::Postgres),
    Redis(redis::Redis),
    Influxdb(influxdb::Influxdb),
    Mqtt(Box<mqtt::Mqtt>),
    #[cfg(feature = "kafka")]
    Kafka(kafka::Kafka),
}

impl Target {
    /// The target of `config` (checked); connections are opened when first written to. A
    /// Kafka producer reports to `stats`.
    fn new(config: &SinkConfig, stats: &Arc<Stats>) -> Result<Target, String> {
        Ok(match config.kind {
            SinkKind::Http => Target::Http(http::Http::new(config)?),
            SinkKind::Postgres => Target::Postgres(postgres::Postgres::new(config)?),
            SinkKind::Redis => Target::Redis(redis::Redis::new(config)?),
            SinkKind::Influxdb => Target::Influxdb(influxdb::Influxdb::new(config)?),
            SinkKind::Mqtt => Target::Mqtt(Box::new(mqtt::Mqtt::new(config)?)),
            #[cfg(feature = "kafka")]
            SinkKind::Kafka => Target::Kafka(kafka::Kafka::new(config, stats.clone())?),
            SinkKind::Republish => return Err("a republish sink has no worker".into()),
            #[cfg(not(feature = "kafka"))]
            SinkKind::Kafka => {
                let _ = stats;
                return Err(crate::NO_KAFKA.into());
            }
        })
    }

    /// Writes `batch`: what became of each output, in order.
    async fn write(&mut self, batch: &[&Output]) -> Vec<Written> {
        match self {
            Target::Http(t) => t.write(batch).await,
            Target::Postgres(t) => t.write(batch).await,
            Target::Redis(t) => t.write(batch).await,
            Target::Influxdb(t) => t.write(batch).await,
            Target::Mqtt(t) => t.write(batch).await,
            #[cfg(feature = "kafka")]
            Target::Kafka(t) => t.write(batch).await,
        }
    }
}

/// Runs the sinks in force ([`Broker::sinks`]) and follows their changes until the broker
/// shuts down: a new sink starts, a removed one stops and its outbox is ended with what it
/// held, a changed one starts again on the same outbox (its counters from zero). Each sink's
/// outbox is open when this returns.
pub(crate) async fn supervise(broker: &Arc<Broker>) {
    let mut changes = broker.sinks();
    let mut running = Running::default();
    let sinks = changes.borrow_and_update().clone();
    running.apply(broker, &sinks).await;
    let broker = broker.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = broker.shutdown().cancelled() => return,
            }
            let sinks = changes.borrow_and_update().clone();
            running.apply(&broker, &sinks).await;
        }
    });
}

/// The sinks running, each with what stops it.
#[derive(Default)]
struct Running(Vec<(SinkConfig, CancellationToken)>);

impl Running {
    /// Makes the running sinks `sinks`.
    async fn apply(&mut self, broker: &Arc<Broker>, sinks: &[SinkConfig]) {
        let mut removed = Vec::new();
        self.0.retain(|(config, stop)| {
            let keep = sinks.contains(config);
            if !keep {
                stop.cancel();
                if !sinks.iter().any(|s| s.name == config.name) {
                    removed.push(config.name.clone());
                }
            }
            keep
        });
        for name in removed {
            let client_id = broker.rules().outbox_client_id(&name);
            let held = broker.held_for(&client_id).unwrap_or(0);
            match crate::end_session(broker, &client_id).await {
                Ok(()) => info!(sink = %name, held, "sink removed: its outbox is ended, with what it held"),
                Err(e) => warn!(sink = %name, "sink removed, but its outbox could not be ended: {e}"),
            }
        }
        // A republish sink has no worker: the rules publish its messages themselves.
        for config in sinks.iter().filter(|s| s.kind != SinkKind::Republish) {
            if self.0.iter().any(|(c, _)| c == config) {
                continue;
            }
            let stop = broker.shutdown().child_token();
            start(broker, config.clone(), &stop).await;
            self.0.push((config.clone(), stop));
        }
    }
}

/// One running sink: its worker and its counters, until `stop`.
async fn start(broker: &Arc<Broker>, config: SinkConfig, stop: &CancellationToken) {
    let config = Arc::new(config);
    let stats = Arc::new(Stats::default());
    let client_id = broker.rules().outbox_client_id(&config.name);
    let kind = config.kind.as_str();
    let watch = Watch {
        family: &SINKS,
        kind,
        name: config.name.clone(),
        stats: stats.clone(),
        outbox: Some(client_id.clone()),
    };
    Watched::start(broker, watch, stop.clone());
    let target = match Target::new(&config, &stats) {
        Ok(t) => t,
        Err(e) => return warn!(sink = %config.name, "sink: {e}; it is not started"),
    };
    let limits =
        crate::outbox_limits(config.max_queued_messages, config.max_queued_bytes, config.queue_overflow);
    // The outbox is opened before this returns: outputs of rules find it from the first
    // publish on.
    let window = config.batch_size.clamp(1, u16::MAX as usize) as u16;
    let client = match crate::connect_as(broker, &client_id, limits.clone(), window).await {
        Ok((client, _)) => client,
        Err(e) => return warn!(sink = %config.name, "sink: cannot open its outbox: {e}"),
    };
    info!(sink = %config.name, %kind, url = %config.redacted().url, "sink started");
    let broker = broker.clone();
    let stop = stop.clone();
    tokio::spawn(async move {
        let worker = Worker { broker, config, stats, target, stop };
        worker.run(client, &client_id, limits).await;
    });
}

/// A sink's worker: takes outputs from the outbox and writes them to the target.
struct Worker {
    broker: Arc<Broker>,
    config: Arc<SinkConfig>,
    stats: Arc<Stats>,
    target: Target,
    stop: CancellationToken,
}

impl Worker {
    /// Runs until `stop`, connecting the outbox again if its connection ends.
    async fn run(
        mut self,
        mut client: Client,
        client_id: &str,
        limits: Arc<braid_broker::session::QueueLimits>,
    ) {
        let window = self.config.batch_size.clamp(1, u16::MAX as usize) as u16;
        loop {
            if !self.drain(&client).await {
                return;
            }
            // The outbox's connection ended without a stop (taken over): open it again.
            client = match crate::connect_as(&self.broker, client_id, limits.clone(), window).await {
                Ok((client, _)) => client,
                Err(e) => return warn!(sink = %self.config.name, "sink: cannot open its outbox again: {e}"),
            };
        }
    }

    /// Writes batches from `client`'s outbox until its connection ends (true) or the sink
    /// stops (false).
    async fn drain(&mut self, client: &Client) -> bool {
        loop {
            let first = tokio::select! {
                event = client.recv_unacked() => event,
                _ = self.stop.cancelled() => return false,
            };
            let mut batch = Vec::new();
            let mut next = first;
            loop {
                match next {
                    Some((Event::Message(p), received)) => batch.push(Taken {
                        output: output(&p.payload),
                        waiter: waiter(&p.properties),
                        received,
                    }),
                    Some((Event::Disconnected(_), _)) | None => break,
                    Some(_) => {}
                }
                if batch.len() >= self.config.batch_size {
                    break;
                }
                // What else is there already, without waiting.
                match client.recv_unacked().now_or_never() {
                    Some(event) => next = event,
                    None => break,
                }
            }
            if batch.is_empty() {
                return !self.stop.is_cancelled();
            }
            if !self.write(&batch).await {
                return false;
            }
            for taken in batch {
                if let Some(r) = taken.received {
                    client.ack(r);
                }
            }
        }
    }

    /// Writes `batch` until the target has taken or refused each output (true), or the sink
    /// stops (false: nothing is acknowledged, the outbox sends the batch again); a publisher
    /// waiting for the target (`ack = "target"`) gets its word.
    async fn write(&mut self, batch: &[Taken]) -> bool {
        let (config, stats) = (&*self.config, &*self.stats);
        let mut pending: Vec<(&Output, Option<u64>)> = Vec::with_capacity(batch.len());
        for taken in batch {
            match &taken.output {
                Some(o) => pending.push((o, taken.waiter)),
                None => self.refused("not a rule's output (not a JSON object)", taken.waiter),
            }
        }
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let timeout = Duration::from_millis(config.timeout_ms);
        while !pending.is_empty() {
            let n = pending.len() as u64;
            stats.in_flight.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            let outputs: Vec<&Output> = pending.iter().map(|(o, _)| *o).collect();
            let started = std::time::Instant::now();
            let written = match tokio::time::timeout(timeout, self.target.write(&outputs)).await {
                Ok(written) => written,
                Err(_) => {
                    let why = format!("no answer within timeout_ms = {}", config.timeout_ms);
                    pending.iter().map(|_| Written::Failed(why.clone())).collect()
                }
            };
            stats.in_flight.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
            stats.writes.observe(started.elapsed());
            let mut again = Vec::new();
            let mut failure = None;
            for (output, w) in pending.into_iter().zip(written) {
                match w {
                    Written::Sent => {
                        bump(&self.stats.sent);
                        self.confirm(output.1, ReasonCode::Success);
                    }
                    Written::Refused(why) => self.refused(&why, output.1),
                    Written::Failed(why) => {
                        again.push(output);
                        failure = Some(why);
                    }
                }
            }
            match failure {
                None => {
                    if self.stats.set_up(true) {
                        info!(sink = %self.config.name, "sink: the target takes writes");
                    }
                }
                Some(why) => {
                    let stats = &*self.stats;
                    stats.failed.fetch_add(again.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    let pause = backoff.next();
                    if stats.set_up(false) || stats.may_log() {
                        warn!(sink = %self.config.name, "sink: {} writes failed ({why}); writing them again in {} ms, the outbox keeps the rest", again.len(), pause.as_millis());
                    }
                    if !crate::pause(&mut backoff, &self.stop).await {
                        return false;
                    }
                }
            }
            pending = again;
        }
        true
    }

    /// Counts and logs (at most once a second) an output the target refused for good, and
    /// tells its publisher if it waits (`waiter`).
    fn refused(&self, why: &str, waiter: Option<u64>) {
        self.confirm(waiter, ReasonCode::UnspecifiedError);
        bump(&self.stats.dropped);
        if self.stats.may_log() {
            warn!(sink = %self.config.name, "sink: the target refused an output ({why}); it is counted as failed and not written again");
        }
    }
}

impl Worker {
    /// Gives the publisher waiting for output `waiter` (if any) the target's `word`.
    fn confirm(&self, waiter: Option<u64>, word: ReasonCode) {
        let Some(n) = waiter else { return };
        let rules = self.broker.rules();
        let outbox = rules.outboxes().iter().find(|o| *o.sink == *self.config.name);
        if let Some(waiting) = outbox.and_then(|o| o.waiting()) {
            waiting.confirm(n, word);
        }
    }
}

/// An output taken from the outbox: the rule's output (None if the message is not one), the
/// number its publisher waits by, and what acknowledges it to the outbox.
struct Taken {
    output: Option<Output>,
    waiter: Option<u64>,
    received: Option<Received>,
}

/// The number a publisher waiting for the target (`ack = "target"`) knows this output by.
fn waiter(properties: &Properties) -> Option<u64> {
    let (_, n) = properties.user_properties.iter().find(|(k, _)| &**k == SinkOutbox::WAITER)?;
    n.parse().ok()
}

/// The rule output a message of the outbox carries.
fn output(payload: &[u8]) -> Option<Output> {
    match serde_json::from_slice(payload) {
        Ok(Value::Object(o)) => Some(o),
        _ => None,
    }
}
