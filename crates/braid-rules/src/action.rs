//! What a rule does with its output: `republish:TOPIC-TEMPLATE`, or hand it to a named sink.

use crate::error::RuleError;
use crate::template::Template;

/// One of a rule's `actions`, parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `republish:alerts/${clientid}`: publish the output, as JSON, to the rendered topic.
    Republish(Template),
    /// The name of a sink (`[[sinks]]`).
    Sink(String),
}

impl Action {
    /// Parses `action`: `republish:` and a topic template, or a sink's name (letters, digits,
    /// `_` and `-`).
    pub fn parse(action: &str) -> Result<Action, RuleError> {
        if let Some(topic) = action.strip_prefix("republish:") {
            if topic.is_empty() {
                return Err(RuleError::new("republish: needs a topic, as in republish:alerts/${clientid}"));
            }
            if topic.contains(['+', '#']) {
                return Err(RuleError::new(format!(
                    "republish:{topic}: a topic to publish to cannot hold + or #"
                )));
            }
            return Template::parse(topic).map(Action::Republish);
        }
        let name_ok =
            !action.is_empty() && action.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b));
        if !name_ok {
            return Err(RuleError::new(format!(
                "{action:?} is neither republish:TOPIC nor a sink's name (letters, digits, _ and -)"
            )));
        }
        Ok(Action::Sink(action.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn republish_renders_its_topic_from_the_output() {
        let Action::Republish(t) = Action::parse("republish:alerts/${clientid}").unwrap() else { panic!() };
        let out = json!({"clientid": "d1"});
        assert_eq!(t.render(out.as_object().unwrap()), "alerts/d1");
    }

    #[test]
    fn a_name_is_a_sink_and_anything_else_is_refused() {
        assert_eq!(Action::parse("pg_hot").unwrap(), Action::Sink("pg_hot".into()));
        for bad in ["", "republish:", "republish:a/#", "pg hot", "republish:a/${x"] {
            assert!(Action::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
