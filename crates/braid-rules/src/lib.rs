//! Braid's rule engine: rules written in EMQX's SQL dialect, run on published messages and client
//! events.
//!
//! ```
//! use braid_rules::{Context, Rule, Template};
//!
//! let rule = Rule::compile(
//!     "hot",
//!     r#"SELECT clientid, payload.temp AS temp FROM "sensors/+/temp" WHERE payload.temp > 30"#,
//! )?;
//! let ctx = Context { topic: "sensors/d1/temp", clientid: "d1", payload: br#"{"temp": 31.5}"#, ..Context::default() };
//! let output = rule.apply(&ctx).expect("31.5 > 30");
//! assert_eq!(output["temp"], 31.5);
//! assert_eq!(Template::parse("alerts/${clientid}")?.render(&output), "alerts/d1");
//! # Ok::<(), braid_rules::RuleError>(())
//! ```
//!
//! A rule is compiled once ([`Rule::compile`]); evaluating it ([`Rule::apply`]) parses nothing
//! but the payload, at most once and only when the rule reads `payload.*`, and never fails: a
//! message the rule does not select gives `None`. See docs/rules.md for the dialect.

mod action;
mod compile;
mod context;
mod error;
mod eval;
mod events;
mod functions;
mod template;
mod value;

#[cfg(test)]
mod tests;

use std::cell::OnceCell;

use braid_proto::topic;
use serde_json::{Map, Value};

pub use action::Action;
pub use context::Context;
pub use error::{Position, RuleError};
pub use events::Event;
pub use template::{Field, Template};

/// A compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    name: String,
    query: compile::Query,
}

impl Rule {
    /// Parses and checks the rule `sql` (`SELECT ... FROM ... [WHERE ...]`). The error says what
    /// is wrong and where: an unknown field or function, a bad source, an unsupported clause.
    pub fn compile(name: impl Into<String>, sql: &str) -> Result<Rule, RuleError> {
        Ok(Rule { name: name.into(), query: compile::compile(sql)? })
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The topic filters in FROM.
    pub fn topic_filters(&self) -> &[String] {
        &self.query.filters
    }

    /// The client events in FROM.
    pub fn events(&self) -> &[Event] {
        &self.query.events
    }

    /// True when a message published to `topic` is one of this rule's sources.
    pub fn matches_topic(&self, topic: &str) -> bool {
        self.query.filters.iter().any(|filter| topic::matches(filter, topic))
    }

    /// True when `event` is one of this rule's sources (a publish when FROM has a topic filter).
    pub fn matches_event(&self, event: Event) -> bool {
        match event {
            Event::MessagePublish => !self.query.filters.is_empty(),
            other => self.query.events.contains(&other),
        }
    }

    /// Runs the rule on `ctx`: `None` when `ctx` is not from one of its sources or WHERE does
    /// not hold, otherwise the object SELECT makes.
    pub fn apply(&self, ctx: &Context<'_>) -> Option<Map<String, Value>> {
        self.apply_sharing(ctx, &OnceCell::new())
    }

    /// [`Rule::apply`], with `payload` holding the payload parsed as JSON once the first rule
    /// that reads it has parsed it: rules run on one message share one `OnceCell`, so the
    /// payload is parsed once, however many rules read it.
    pub fn apply_sharing(&self, ctx: &Context<'_>, payload: &OnceCell<Value>) -> Option<Map<String, Value>> {
        let selected = match ctx.event {
            Event::MessagePublish => self.matches_topic(ctx.topic),
            event => self.query.events.contains(&event),
        };
        if !selected {
            return None;
        }
        let eval = eval::Eval::new(ctx, payload);
        if let Some(condition) = &self.query.condition {
            if !eval.test(condition) {
                return None;
            }
        }
        Some(eval.output(&self.query.outputs))
    }
}
