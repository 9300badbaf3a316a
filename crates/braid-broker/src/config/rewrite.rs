//! `[[rewrite]]`: topic rewrite rules, as EMQX names them (see docs/mqtt.md and
//! [`crate::rewrite`], which applies them).

use regex::Regex;
use serde::{Deserialize, Serialize};

use braid_proto::topic;

use super::ConfigError;

/// Which packets a rewrite rule is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RewriteAction {
    /// PUBLISH topics (not will topics).
    Publish,
    /// SUBSCRIBE and UNSUBSCRIBE filters.
    Subscribe,
    /// Both.
    #[default]
    All,
}

/// One rule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewriteConfig {
    /// `publish`, `subscribe` or `all`.
    pub action: RewriteAction,
    /// A topic filter: the rule is for topics it matches.
    pub source_topic: String,
    /// A regular expression on the whole topic; its groups are `$1`, `$2`... in `dest_topic`.
    pub re: String,
    /// The topic to rewrite to: text, `$N`, `${clientid}`, `${username}`.
    pub dest_topic: String,
}

/// A rule, compiled.
#[derive(Debug)]
pub struct RewriteRule {
    /// Which packets it is for.
    pub action: RewriteAction,
    /// The filter topics must match.
    pub source: String,
    /// The expression.
    pub re: Regex,
    /// The destination template.
    pub dest: Vec<DestPart>,
}

/// A piece of a destination template.
#[derive(Debug, PartialEq)]
pub enum DestPart {
    /// Text as it is.
    Text(String),
    /// The expression's group N.
    Group(usize),
    /// The client id.
    ClientId,
    /// The user name ("" without one).
    Username,
}

impl RewriteConfig {
    /// Compiles the rule (`[[rewrite]]` number `at`, from 0); the error names the key at
    /// fault (`rewrite[1].re`) and the problem.
    pub fn compile(&self, at: usize) -> Result<RewriteRule, ConfigError> {
        let key = |field: &str| format!("rewrite[{at}].{field}");
        if !topic::valid_topic_filter(&self.source_topic) {
            return Err(ConfigError::invalid(
                key("source_topic"),
                format!("{:?} is not a topic filter", self.source_topic),
            ));
        }
        let re = Regex::new(&self.re).map_err(|e| ConfigError::invalid(key("re"), e))?;
        let dest = template(&self.dest_topic, re.captures_len() - 1)
            .map_err(|e| ConfigError::invalid(key("dest_topic"), e))?;
        Ok(RewriteRule { action: self.action, source: self.source_topic.clone(), re, dest })
    }
}

/// Every rule compiles.
pub(super) fn validate(rules: &[RewriteConfig]) -> Result<(), ConfigError> {
    rules.iter().enumerate().try_for_each(|(at, r)| r.compile(at).map(drop))
}

/// Parses a destination template whose expression has `groups` groups.
fn template(text: &str, groups: usize) -> Result<Vec<DestPart>, String> {
    if text.is_empty() {
        return Err("required: the topic to rewrite to, e.g. \"devices/$1/up\"".into());
    }
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        literal.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let part = if digits > 0 {
            let n: usize = rest[..digits].parse().map_err(|_| format!("${} is no group", &rest[..digits]))?;
            if n == 0 || n > groups {
                return Err(format!("${n}: the expression has {groups} group(s) (from $1)"));
            }
            rest = &rest[digits..];
            DestPart::Group(n)
        } else if let Some(after) = rest.strip_prefix("{clientid}") {
            rest = after;
            DestPart::ClientId
        } else if let Some(after) = rest.strip_prefix("{username}") {
            rest = after;
            DestPart::Username
        } else {
            let at = text.len() - rest.len() - 1;
            return Err(format!(
                "at byte {at}: '$' starts neither a group ($1) nor ${{clientid}} or ${{username}}"
            ));
        };
        if !literal.is_empty() {
            parts.push(DestPart::Text(std::mem::take(&mut literal)));
        }
        parts.push(part);
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        parts.push(DestPart::Text(literal));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(re: &str, dest: &str) -> RewriteConfig {
        RewriteConfig {
            action: RewriteAction::All,
            source_topic: "a/#".into(),
            re: re.into(),
            dest_topic: dest.into(),
        }
    }

    #[test]
    fn a_template_reads_into_text_groups_and_names() {
        let r = rule("^a/(.*)/(.*)$", "t/${username}/$2-${clientid}$1").compile(0).unwrap();
        use DestPart::*;
        assert_eq!(
            r.dest,
            vec![
                Text("t/".into()),
                Username,
                Text("/".into()),
                Group(2),
                Text("-".into()),
                ClientId,
                Group(1)
            ]
        );
    }

    #[test]
    fn a_bad_rule_names_its_key_and_the_problem() {
        let err = |r: RewriteConfig| r.compile(1).unwrap_err().to_string();
        let bad_filter = err(RewriteConfig { source_topic: "a/#/b".into(), ..rule("^a$", "b") });
        assert!(
            bad_filter.contains("rewrite[1].source_topic") && bad_filter.contains("not a topic filter"),
            "{bad_filter}"
        );
        let bad_re = err(rule("^a/(", "b"));
        assert!(bad_re.contains("rewrite[1].re") && bad_re.contains("unclosed group"), "{bad_re}");
        let bad_group = err(rule("^a/(.*)$", "b/$2"));
        assert!(
            bad_group.contains("rewrite[1].dest_topic")
                && bad_group.contains("$2: the expression has 1 group"),
            "{bad_group}"
        );
        let bad_dollar = err(rule("^a$", "b/${host}"));
        assert!(bad_dollar.contains("at byte 2"), "{bad_dollar}");
        let empty = err(rule("^a$", ""));
        assert!(empty.contains("required"), "{empty}");
    }
}
