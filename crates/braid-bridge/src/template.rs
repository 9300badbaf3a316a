//! Templates that make a Kafka topic or key from an MQTT message, or an MQTT topic from a
//! Kafka record: text with `${name}` placeholders, checked against the names a bridge
//! direction offers when the configuration loads, filled per message.

use std::fmt;

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    /// `${name}`.
    Field(String),
    /// `${N}`: level N (from 1) of the MQTT topic.
    Level(usize),
}

/// Why a template does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadTemplate(String);

impl fmt::Display for BadTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a template is filled from, by name; `levels`: the MQTT topic's levels, for `${N}`.
pub trait Fields {
    /// The value of `${name}`; None if this message has none.
    fn field(&self, name: &str) -> Option<&str>;
    /// Level `n` (from 1) of the MQTT topic, if the template may use levels.
    fn level(&self, _n: usize) -> Option<&str> {
        None
    }
}

impl Template {
    /// Parses `text`, whose placeholders must be among `names` (and `${N}` only if `levels`).
    pub fn parse(text: &str, names: &[&str], levels: bool) -> Result<Template, BadTemplate> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("${") {
            if at > 0 {
                parts.push(Part::Text(rest[..at].to_string()));
            }
            let after = &rest[at + 2..];
            let end =
                after.find('}').ok_or_else(|| BadTemplate(format!("{text:?}: a ${{ without its }}")))?;
            let name = &after[..end];
            match name.parse::<usize>() {
                Ok(0) => return Err(BadTemplate(format!("{text:?}: levels count from ${{1}}"))),
                Ok(n) if levels => parts.push(Part::Level(n)),
                _ if names.contains(&name) => parts.push(Part::Field(name.to_string())),
                _ => {
                    let mut known: Vec<String> = names.iter().map(|n| format!("${{{n}}}")).collect();
                    if levels {
                        known.push("${1}, ${2}...".into());
                    }
                    return Err(BadTemplate(format!(
                        "{text:?}: unknown placeholder ${{{name}}} (known: {})",
                        known.join(", ")
                    )));
                }
            }
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(Template { parts })
    }

    /// True if the template is empty (no text, no placeholder).
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The template filled from `fields`; Err names the placeholder this message cannot fill.
    pub fn fill(&self, fields: &impl Fields) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Field(name) => out.push_str(fields.field(name).ok_or_else(|| format!("${{{name}}}"))?),
                Part::Level(n) => out.push_str(fields.level(*n).ok_or_else(|| format!("${{{n}}}"))?),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Topic<'a>(&'a str);

    impl Fields for Topic<'_> {
        fn field(&self, name: &str) -> Option<&str> {
            (name == "topic").then_some(self.0)
        }
        fn level(&self, n: usize) -> Option<&str> {
            self.0.split('/').nth(n - 1)
        }
    }

    #[test]
    fn fills_fields_and_levels() {
        let t = Template::parse("mqtt.${2}-${topic}.x", &["topic"], true).unwrap();
        assert_eq!(t.fill(&Topic("sensors/kitchen")).unwrap(), "mqtt.kitchen-sensors/kitchen.x");
        assert_eq!(t.fill(&Topic("sensors")), Err("${2}".to_string()));
        assert_eq!(Template::parse("plain", &[], false).unwrap().fill(&Topic("a")).unwrap(), "plain");
        assert!(Template::parse("", &[], false).unwrap().is_empty());
    }

    #[test]
    fn refuses_unknown_placeholders_and_levels_where_none_are_offered() {
        let e = Template::parse("a/${nope}", &["key", "topic"], false).unwrap_err();
        assert_eq!(e.to_string(), r#""a/${nope}": unknown placeholder ${nope} (known: ${key}, ${topic})"#);
        assert!(Template::parse("a/${1}", &["key"], false).is_err());
        assert!(Template::parse("a/${0}", &["topic"], true).is_err());
        assert!(Template::parse("a/${key", &["key"], false).is_err());
    }
}
