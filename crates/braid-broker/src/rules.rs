//! Rules (`[[rules]]`, see docs/rules.md) on what clients publish: each rule whose FROM matches
//! the topic and whose WHERE holds makes an output, a JSON object, which its actions use.
//! Evaluating a rule is pure work on the message: no I/O, no clock (the time is passed in),
//! nothing spawned; the caller ([`Actions`]) routes what the rules republish and puts the
//! outputs for sinks in the sinks' outboxes.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tracing::warn;

use braid_proto::topic::valid_topic_name;
use braid_proto::{ByteString, Publish, QoS, ReasonCode};
use braid_rules::{Action, Context, Event, Rule, RuleError, Template};
use serde_json::{Map, Value};
use tokio::sync::oneshot;

use crate::config::{RuleConfig, SinkAck, SinkConfig, SinkKind};
use crate::message::Message;
use crate::router::Confirm;
use crate::session::IN_PROCESS;

/// A broker's rules, compiled, and the outboxes of the sinks they name.
#[derive(Debug)]
pub struct Rules {
    rules: Vec<Compiled>,
    /// A bit per [`Event`] (`1 << event as u8`) some rule takes: [`Rules::wants`] in one test,
    /// on the publish and acknowledgement paths.
    events: u16,
    outboxes: Vec<SinkOutbox>,
    /// The cluster node, in the outboxes' client ids.
    node: Option<Box<str>>,
    ids: Arc<MessageIds>,
}

/// The `id` of each message the rules run on: in a cluster the node's name and `-`, this
/// broker's start in ms since the Unix epoch, and a count of the messages, in hex (see
/// [`Rules::apply`]); kept across recompilations.
#[derive(Debug)]
struct MessageIds {
    prefix: String,
    next: AtomicU64,
}

#[derive(Debug)]
struct Compiled {
    rule: Rule,
    config: RuleConfig,
    republish: Vec<Republisher>,
    /// Its sinks, as indexes into `Rules::outboxes`.
    sinks: Vec<usize>,
    /// Kept by a recompilation that leaves the rule as it is.
    counts: Arc<RuleCounts>,
}

/// What a republishing action makes of an output: `republish:TOPIC` (the output as JSON, at the
/// QoS of the message the rule ran on, not retained), or a `republish` sink's templates.
#[derive(Debug)]
struct Republisher {
    topic: Template,
    /// None: the output as JSON.
    payload: Option<Template>,
    /// None: the message's.
    qos: Option<QoS>,
    retain: bool,
    user_properties: Vec<(ByteString, Template)>,
}

impl Republisher {
    /// `republish:TOPIC`.
    fn to(topic: Template) -> Republisher {
        Republisher { topic, payload: None, qos: None, retain: false, user_properties: Vec::new() }
    }

    /// A `republish` sink (checked when it was configured).
    fn of(sink: &SinkConfig) -> Result<Republisher, RuleError> {
        let payload = (!sink.body.is_empty()).then(|| Template::parse(&sink.body)).transpose()?;
        let mut user_properties = Vec::with_capacity(sink.user_properties.len());
        for (name, value) in &sink.user_properties {
            user_properties.push((ByteString::from(name.as_str()), Template::parse(value)?));
        }
        let qos = match sink.qos {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            _ => QoS::ExactlyOnce,
        };
        let topic = Template::parse(&sink.topic)?;
        Ok(Republisher { topic, payload, qos: Some(qos), retain: sink.retain, user_properties })
    }

    /// The message it makes of `output` (`json`: the output as JSON), at `qos` unless it has its
    /// own; `Err` if the topic it renders is not one a rule may publish to.
    fn publish(&self, output: &Map<String, Value>, json: &Bytes, qos: QoS) -> Result<Publish, String> {
        let topic = self.topic.render(output);
        if !valid_topic_name(&topic) || topic.starts_with("$SYS") {
            return Err(format!("republish: {topic:?} is not a topic a rule may publish to"));
        }
        let mut properties = braid_proto::Properties::default();
        for (name, value) in &self.user_properties {
            properties.user_properties.push((name.clone(), value.render(output).into()));
        }
        Ok(Publish {
            dup: false,
            qos: self.qos.unwrap_or(qos),
            retain: self.retain,
            topic: topic.into(),
            packet_id: 0,
            properties,
            payload: self.payload.as_ref().map_or_else(|| json.clone(), |t| Bytes::from(t.render(output))),
        })
    }
}

/// The outbox of a sink: the persistent session of an in-process client that the sink's
/// worker connects as.
#[derive(Debug)]
pub struct SinkOutbox {
    /// The sink's name.
    pub sink: Box<str>,
    /// The outbox's client id: `$internal/sink/<name>`, with `@<node>` in a cluster.
    pub client_id: Box<str>,
    /// Outputs that did not go into it (no room, or no outbox yet) or that it dropped to make
    /// room; kept by a recompilation that keeps the sink.
    dropped: Arc<AtomicU64>,
    /// With `ack = "target"`: the publishers waiting for the target's word on an output.
    waiting: Option<Arc<Waiting>>,
}

/// Publishers' acknowledgements waiting for a sink's target, by the number their output
/// carries (the user property [`SinkOutbox::WAITER`]).
#[derive(Debug, Default)]
pub struct Waiting {
    next: AtomicU64,
    waiters: Mutex<HashMap<u64, oneshot::Sender<ReasonCode>>>,
}

impl Waiting {
    /// A number for an output, and the target's word on it (0x80 if it never comes: the
    /// broker stopped, or the sink was removed).
    pub fn wait(&self) -> (u64, Confirm) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().insert(n, tx);
        (n, Confirm::new(async move { rx.await.unwrap_or(ReasonCode::UnspecifiedError) }))
    }

    /// The target's word on output `n`: Success, or why it refused it.
    pub fn confirm(&self, n: u64, word: ReasonCode) {
        if let Some(tx) = self.waiters.lock().remove(&n) {
            let _ = tx.send(word);
        }
    }
}

impl SinkOutbox {
    /// The outbox client id of sink `name`; `node` names the cluster node (each node sends
    /// what is published on it, through an outbox of its own).
    fn client_id(name: &str, node: Option<&str>) -> String {
        match node {
            Some(node) => format!("{IN_PROCESS}sink/{name}@{node}"),
            None => format!("{IN_PROCESS}sink/{name}"),
        }
    }

    /// The user property an output carries when its publisher waits for the target
    /// (`ack = "target"`): the number to confirm it by ([`Waiting::confirm`]).
    pub const WAITER: &'static str = "braid-sink-waiter";

    /// Outputs that did not go into the outbox, or were dropped from it to make room, since
    /// the start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Counts an output dropped for want of room (`queue_overflow`), or for want of an outbox.
    pub fn count_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// With `ack = "target"`, the publishers waiting for the target.
    pub fn waiting(&self) -> Option<&Arc<Waiting>> {
        self.waiting.as_ref()
    }
}

/// Where the outputs of rules go: the caller routes what they republish and puts what they
/// send to sinks in the sinks' outboxes.
pub trait Actions {
    /// Routes a message a `republish:` action made.
    fn republish(&mut self, publish: Publish);
    /// Puts `output` (the rule's output as JSON) in `outbox`; `Err` says why it could not. An
    /// older output it drops to make room, it counts ([`SinkOutbox::count_dropped`]).
    fn to_sink(&mut self, outbox: &SinkOutbox, output: Bytes) -> Result<(), String>;
}

/// What one rule did since the start.
#[derive(Debug, Default)]
struct RuleCounts {
    matched: AtomicU64,
    passed: AtomicU64,
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// One rule as operators see it: its configuration and its counters.
#[derive(Debug, Clone)]
pub struct RuleReport {
    /// Its configuration.
    pub config: RuleConfig,
    /// Messages it selected (FROM matched and WHERE held).
    pub matched: u64,
    /// Of those, the ones every action took.
    pub passed: u64,
    /// Of those, the ones an action failed on.
    pub failed: u64,
    /// The last failure, if any.
    pub last_error: Option<String>,
}

impl Rules {
    /// The rules of `configs`, sending to `sinks` (checked when the configuration loaded; a rule
    /// that does not compile is left out, with a warning), of a broker that started at `epoch`
    /// (ms since the Unix epoch); `node` names the cluster node.
    pub fn compile(configs: &[RuleConfig], sinks: &[SinkConfig], node: Option<&str>, epoch: u64) -> Rules {
        let prefix = match node {
            Some(node) => format!("{node}-{epoch:x}"),
            None => format!("{epoch:x}"),
        };
        let ids = Arc::new(MessageIds { prefix, next: AtomicU64::new(0) });
        Rules::build(configs, sinks, node.map(Box::from), ids, None)
    }

    /// `configs` sending to `sinks` in place of these rules: a rule with the same name and
    /// configuration keeps its counters, a sink with the same name its `dropped`.
    pub fn recompile(&self, configs: &[RuleConfig], sinks: &[SinkConfig]) -> Rules {
        Rules::build(configs, sinks, self.node.clone(), self.ids.clone(), Some(self))
    }

    fn build(
        configs: &[RuleConfig],
        sinks: &[SinkConfig],
        node: Option<Box<str>>,
        ids: Arc<MessageIds>,
        previous: Option<&Rules>,
    ) -> Rules {
        let before = |name: &str| previous.and_then(|p| p.outboxes.iter().find(|o| *o.sink == *name));
        let outboxes = sinks
            .iter()
            .filter(|s| s.kind != SinkKind::Republish)
            .map(|s| SinkOutbox {
                sink: s.name.as_str().into(),
                client_id: SinkOutbox::client_id(&s.name, node.as_deref()).into(),
                dropped: before(&s.name).map_or_else(Default::default, |o| o.dropped.clone()),
                waiting: (s.ack == SinkAck::Target)
                    .then(|| before(&s.name).and_then(|o| o.waiting.clone()).unwrap_or_default()),
            })
            .collect::<Vec<_>>();
        let mut rules = Vec::with_capacity(configs.len());
        for (at, config) in configs.iter().enumerate() {
            let (rule, actions) = match config.compile(at, sinks) {
                Ok(compiled) => compiled,
                Err(e) => {
                    warn!("rule left out: {e}");
                    continue;
                }
            };
            let (mut republish, mut to_sinks) = (Vec::new(), Vec::new());
            for action in actions {
                match action {
                    Action::Republish(t) => republish.push(Republisher::to(t)),
                    Action::Sink(name) => {
                        match sinks.iter().find(|s| s.name == name && s.kind == SinkKind::Republish) {
                            Some(sink) => match Republisher::of(sink) {
                                Ok(r) => republish.push(r),
                                Err(e) => warn!("sink {name} left out of rule {}: {e}", config.name),
                            },
                            None => to_sinks.extend(outboxes.iter().position(|o| *o.sink == *name)),
                        }
                    }
                }
            }
            let same = previous.and_then(|p| p.rules.iter().find(|r| r.config == *config));
            rules.push(Compiled {
                rule,
                config: config.clone(),
                republish,
                sinks: to_sinks,
                counts: same.map_or_else(Default::default, |r| r.counts.clone()),
            });
        }
        let all = Event::CLIENT_EVENTS.into_iter().chain([Event::MessagePublish]);
        let events = all
            .filter(|e| rules.iter().any(|r| r.rule.matches_event(*e)))
            .fold(0, |bits, e| bits | 1 << e as u8);
        Rules { rules, events, outboxes, node, ids }
    }

    /// The client id of sink `name`'s outbox on this broker.
    pub fn outbox_client_id(&self, name: &str) -> String {
        SinkOutbox::client_id(name, self.node.as_deref())
    }

    /// The outboxes of the sinks, in configuration order.
    pub fn outboxes(&self) -> &[SinkOutbox] {
        &self.outboxes
    }

    /// True when a rule takes messages published to `topic` (FROM has a filter matching it):
    /// the publish path clones, locks and allocates for the rules only then.
    pub fn wants_topic(&self, topic: &str) -> bool {
        self.rules.iter().any(|r| r.rule.matches_topic(topic))
    }

    /// Each rule with its counters, in configuration order.
    pub fn reports(&self) -> Vec<RuleReport> {
        self.rules
            .iter()
            .map(|r| {
                let c = &r.counts;
                RuleReport {
                    config: r.config.clone(),
                    matched: c.matched.load(Ordering::Relaxed),
                    passed: c.passed.load(Ordering::Relaxed),
                    failed: c.failed.load(Ordering::Relaxed),
                    last_error: c.last_error.lock().clone(),
                }
            })
            .collect()
    }
}

impl RuleCounts {
    fn fail(&self, error: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock() = Some(error);
    }
}

/// Who published a message, for the rules' `username` and `peerhost`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Publisher<'a> {
    /// The user it authenticated as.
    pub username: Option<&'a str>,
    /// Its address.
    pub peer: Option<SocketAddr>,
}

impl Rules {
    /// Runs the rules on `msg`, published by `publisher` at `timestamp` (ms since the Unix
    /// epoch), and hands what their actions make to `actions`. The message's `id` is unique
    /// across restarts and, in a cluster, across nodes (`[<node>-]<start><count>`): a sink can
    /// keep it in a unique key to write each message once.
    pub fn apply(&self, msg: &Message, publisher: Publisher<'_>, timestamp: i64, actions: &mut impl Actions) {
        let peerhost = publisher.peer.map(|p| p.ip().to_string());
        let id = format!("{}{:08x}", self.ids.prefix, self.ids.next.fetch_add(1, Ordering::Relaxed));
        let ctx = Context {
            event: Event::MessagePublish,
            id: Some(&id),
            clientid: &msg.origin_client,
            username: publisher.username,
            peerhost: peerhost.as_deref(),
            topic: &msg.topic,
            payload: &msg.payload,
            qos: msg.qos as u8,
            retain: msg.retain,
            timestamp,
            user_properties: &msg.properties.user_properties,
            fields: &[],
        };
        self.run(&ctx, msg.qos, actions);
    }

    /// A bit per [`Event`] some rule takes (`1 << event as u8`).
    pub fn events(&self) -> u16 {
        self.events
    }

    /// Runs the rules on a client event (`ctx.event`, not a publish); what they republish goes
    /// out at QoS 0.
    pub fn on_event(&self, ctx: &Context<'_>, actions: &mut impl Actions) {
        self.run(ctx, QoS::AtMostOnce, actions);
    }

    /// Runs every rule on `ctx`, handing what their actions make (republished at `qos`) to
    /// `actions`.
    fn run(&self, ctx: &Context<'_>, qos: QoS, actions: &mut impl Actions) {
        let payload = OnceCell::new();
        for r in &self.rules {
            let Some(output) = r.rule.apply_sharing(ctx, &payload) else { continue };
            r.counts.matched.fetch_add(1, Ordering::Relaxed);
            let payload = Bytes::from(serde_json::Value::Object(output.clone()).to_string());
            let mut failed = None;
            for republisher in &r.republish {
                match republisher.publish(&output, &payload, qos) {
                    Ok(p) => actions.republish(p),
                    Err(e) => failed = Some(e),
                }
            }
            for &i in &r.sinks {
                let outbox = &self.outboxes[i];
                if let Err(why) = actions.to_sink(outbox, payload.clone()) {
                    outbox.count_dropped();
                    failed = Some(format!("sink {}: {why}", outbox.sink));
                }
            }
            match failed {
                Some(error) => r.counts.fail(error),
                None => {
                    r.counts.passed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
