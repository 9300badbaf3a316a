//! `[[rules]]`: rules in EMQX's SQL dialect run on what clients publish (see docs/rules.md).

use braid_rules::{Action, Rule};
use serde::{Deserialize, Serialize};

use super::{ConfigError, SinkConfig};

/// One rule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuleConfig {
    /// Its name, unique among the rules (in the API and the metrics).
    pub name: String,
    /// `SELECT ... FROM ... [WHERE ...]`.
    pub sql: String,
    /// What it does with each output: `republish:TOPIC-TEMPLATE`, or a sink's name.
    pub actions: Vec<String>,
}

impl RuleConfig {
    /// Compiles the rule (`[[rules]]` number `at`, from 0) and parses its actions, whose sinks
    /// must be among `sinks`; the error names the key at fault, the position in it and the
    /// problem.
    pub fn compile(&self, at: usize, sinks: &[SinkConfig]) -> Result<(Rule, Vec<Action>), ConfigError> {
        let key = |field: &str| format!("rules[{at}].{field}");
        if self.name.is_empty() {
            return Err(ConfigError::invalid(key("name"), "required: a name for the rule"));
        }
        let rule = Rule::compile(&self.name, &self.sql).map_err(|e| ConfigError::invalid(key("sql"), e))?;
        if self.actions.is_empty() {
            return Err(ConfigError::invalid(
                key("actions"),
                "required: at least one action, e.g. \"republish:alerts/${clientid}\"",
            ));
        }
        let mut actions = Vec::with_capacity(self.actions.len());
        for (i, text) in self.actions.iter().enumerate() {
            let action = Action::parse(text)
                .map_err(|e| ConfigError::invalid(format!("rules[{at}].actions[{i}]"), e))?;
            if let Action::Sink(name) = &action {
                if !sinks.iter().any(|s| s.name == *name) {
                    return Err(ConfigError::invalid(
                        format!("rules[{at}].actions[{i}]"),
                        format!("{name:?}: no [[sinks]] has this name (or write republish:TOPIC)"),
                    ));
                }
            }
            actions.push(action);
        }
        Ok((rule, actions))
    }
}

/// Every rule compiles, names only `sinks` that exist, and no two share a name.
pub(super) fn validate(rules: &[RuleConfig], sinks: &[SinkConfig]) -> Result<(), ConfigError> {
    for (at, rule) in rules.iter().enumerate() {
        rule.compile(at, sinks)?;
        if rules[..at].iter().any(|other| other.name == rule.name) {
            return Err(ConfigError::invalid(
                format!("rules[{at}].name"),
                format!("{:?} names another rule too", rule.name),
            ));
        }
    }
    Ok(())
}
