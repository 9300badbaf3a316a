//! Rules (`[[rules]]`, see docs/rules.md) on what clients publish: each rule whose FROM matches
//! the topic and whose WHERE holds makes an output, a JSON object, which its actions use.
//! Evaluating a rule is pure work on the message: no I/O, no clock (the time is passed in),
//! nothing spawned; the caller routes what the rules republish ([`Rules::apply`]).

use std::cell::OnceCell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tracing::warn;

use braid_proto::topic::valid_topic_name;
use braid_proto::{Publish, QoS};
use braid_rules::{Action, Context, Event, Rule, Template};

use crate::config::RuleConfig;
use crate::message::Message;

/// A broker's rules, compiled at its start.
#[derive(Debug, Default)]
pub struct Rules {
    rules: Vec<Compiled>,
}

#[derive(Debug)]
struct Compiled {
    rule: Rule,
    config: RuleConfig,
    republish: Vec<Template>,
    counts: RuleCounts,
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
    /// The rules of `configs` (checked when the configuration loaded; one that does not compile
    /// is left out, with a warning).
    pub fn compile(configs: &[RuleConfig]) -> Rules {
        let mut rules = Vec::with_capacity(configs.len());
        for (at, config) in configs.iter().enumerate() {
            match config.compile(at) {
                Ok((rule, actions)) => {
                    let republish = actions
                        .into_iter()
                        .filter_map(|a| match a {
                            Action::Republish(t) => Some(t),
                            Action::Sink(_) => None,
                        })
                        .collect();
                    rules.push(Compiled {
                        rule,
                        config: config.clone(),
                        republish,
                        counts: RuleCounts::default(),
                    });
                }
                Err(e) => warn!("rule left out: {e}"),
            }
        }
        Rules { rules }
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
    /// epoch), and hands each message a `republish:` action makes to `republish`.
    pub fn apply(
        &self,
        msg: &Message,
        publisher: Publisher<'_>,
        timestamp: i64,
        republish: impl FnMut(Publish),
    ) {
        let peerhost = publisher.peer.map(|p| p.ip().to_string());
        let ctx = Context {
            event: Event::MessagePublish,
            id: None,
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
        self.run(&ctx, msg.qos, republish);
    }

    /// True when a rule takes `event` as a source: the caller makes the event's context only
    /// then.
    pub fn wants(&self, event: Event) -> bool {
        self.rules.iter().any(|r| r.rule.matches_event(event))
    }

    /// Runs the rules on a client event (`ctx.event`, not a publish); what they republish goes
    /// out at QoS 0.
    pub fn on_event(&self, ctx: &Context<'_>, republish: impl FnMut(Publish)) {
        self.run(ctx, QoS::AtMostOnce, republish);
    }

    /// Runs every rule on `ctx`, handing what `republish:` actions make, at `qos`, to
    /// `republish`.
    fn run(&self, ctx: &Context<'_>, qos: QoS, mut republish: impl FnMut(Publish)) {
        let payload = OnceCell::new();
        for r in &self.rules {
            let Some(output) = r.rule.apply_sharing(ctx, &payload) else { continue };
            r.counts.matched.fetch_add(1, Ordering::Relaxed);
            let payload = Bytes::from(serde_json::Value::Object(output.clone()).to_string());
            let mut failed = None;
            for template in &r.republish {
                let topic = template.render(&output);
                if !valid_topic_name(&topic) || topic.starts_with("$SYS") {
                    failed = Some(format!("republish: {topic:?} is not a topic a rule may publish to"));
                    continue;
                }
                republish(Publish {
                    dup: false,
                    qos,
                    retain: false,
                    topic: topic.into(),
                    packet_id: 0,
                    properties: Default::default(),
                    payload: payload.clone(),
                });
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
