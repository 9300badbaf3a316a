//! Topic rewrite (`[[rewrite]]`, EMQX's names and semantics): a client's PUBLISH topic, or a
//! SUBSCRIBE or UNSUBSCRIBE filter, is replaced by another made from it with a regular
//! expression, so that devices that cannot be changed publish and subscribe where the
//! operator wants.
//!
//! For a topic the rules are tried from the last to the first, as EMQX reads them: the first
//! whose action covers the packet and whose `source_topic` filter matches the topic decides.
//! If its `re` matches, the topic becomes `dest_topic` with `$N` replaced by the expression's
//! Nth group and `${clientid}` and `${username}` by the client's; if it does not, the topic
//! stays as it is and no other rule is tried. A shared subscription's filter is rewritten
//! without its `$share/{group}/` prefix. The ACL is checked on the topic the client sent,
//! before the rewrite, as EMQX does.

use braid_proto::topic::{self, parse_shared};

use crate::config::{ConfigError, DestPart, RewriteAction, RewriteConfig, RewriteRule};

/// The packets a rewrite is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewriting {
    /// A PUBLISH topic.
    Publish,
    /// A SUBSCRIBE or UNSUBSCRIBE filter.
    Subscribe,
}

/// Who sent the packet: what `${clientid}` and `${username}` stand for.
#[derive(Debug, Clone, Copy)]
pub struct Sender<'a> {
    /// The client id.
    pub client_id: &'a str,
    /// The user name, if it gave one ("" in the topic if not).
    pub username: Option<&'a str>,
}

/// The configured rules, compiled.
#[derive(Debug, Default)]
pub struct Rewrites(Vec<RewriteRule>);

impl Rewrites {
    /// Compiles `rules` (`[[rewrite]]`); the error names the key (`rewrite[1].re`) and the
    /// problem.
    pub fn compile(rules: &[RewriteConfig]) -> Result<Rewrites, ConfigError> {
        rules.iter().enumerate().map(|(at, r)| r.compile(at)).collect::<Result<_, _>>().map(Rewrites)
    }

    /// What `name` (a topic, or a filter without its `$share/{group}/`) becomes for a
    /// `rewriting` packet from `sender`; None if it stays as it is.
    pub fn rewrite(&self, rewriting: Rewriting, name: &str, sender: Sender<'_>) -> Option<String> {
        let covers = |r: &RewriteRule| match r.action {
            RewriteAction::All => true,
            RewriteAction::Publish => rewriting == Rewriting::Publish,
            RewriteAction::Subscribe => rewriting == Rewriting::Subscribe,
        };
        let rule = self.0.iter().rev().find(|r| covers(r) && topic::matches(&r.source, name))?;
        let groups = rule.re.captures(name)?;
        let mut out = String::with_capacity(name.len() + 16);
        for part in &rule.dest {
            match part {
                DestPart::Text(t) => out.push_str(t),
                DestPart::Group(n) => out.push_str(groups.get(*n).map_or("", |g| g.as_str())),
                DestPart::ClientId => out.push_str(sender.client_id),
                DestPart::Username => out.push_str(sender.username.unwrap_or("")),
            }
        }
        let valid = match rewriting {
            Rewriting::Publish => topic::valid_topic_name(&out),
            Rewriting::Subscribe => topic::valid_topic_filter(&out),
        };
        // A result that is not a topic (or filter) leaves the original as it was.
        (valid && out != name).then_some(out)
    }

    /// What a SUBSCRIBE or UNSUBSCRIBE `filter` from `sender` becomes (a shared one keeps its
    /// `$share/{group}/` and has the rest rewritten); None if it stays as it is.
    pub fn rewrite_filter(&self, filter: &str, sender: Sender<'_>) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        match parse_shared(filter) {
            Ok(None) => self.rewrite(Rewriting::Subscribe, filter, sender),
            Ok(Some(shared)) => {
                let inner = self.rewrite(Rewriting::Subscribe, shared.filter, sender)?;
                let prefix = &filter[..filter.len() - shared.filter.len()];
                Some(format!("{prefix}{inner}"))
            }
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(action: RewriteAction, source: &str, re: &str, dest: &str) -> RewriteConfig {
        RewriteConfig { action, source_topic: source.into(), re: re.into(), dest_topic: dest.into() }
    }

    const DEVICE: Sender<'static> = Sender { client_id: "dev7", username: Some("alice") };

    /// EMQX's documented example: three rules, five subscriptions.
    #[test]
    fn the_last_rule_whose_filter_matches_decides_even_when_its_expression_does_not() {
        let rules = Rewrites::compile(&[
            rule(RewriteAction::Subscribe, "y/+/z/#", "^y/(.+)/z/(.+)$", "y/z/$2"),
            rule(RewriteAction::All, "x/#", "^x/y/(.+)$", "z/y/x/$1"),
            rule(RewriteAction::All, "x/y/+", "^x/y/(\\d+)$", "z/y/$1"),
        ])
        .unwrap();
        let sub = |t: &str| rules.rewrite(Rewriting::Subscribe, t, DEVICE);
        assert_eq!(sub("y/def"), None, "no filter matches");
        assert_eq!(sub("y/a/z/b").as_deref(), Some("y/z/b"));
        assert_eq!(sub("x/1/2"), None, "x/# matches, its expression does not");
        assert_eq!(sub("x/y/2").as_deref(), Some("z/y/2"), "x/y/+ is the later rule");
        assert_eq!(sub("x/y/z"), None, "x/y/+ decides and its \\d+ does not match: x/# is not tried");
        let publish = |t: &str| rules.rewrite(Rewriting::Publish, t, DEVICE);
        assert_eq!(publish("y/a/z/b"), None, "a subscribe rule leaves PUBLISH alone");
        assert_eq!(publish("x/y/a/b").as_deref(), Some("z/y/x/a/b"));
        let filter = |f: &str| rules.rewrite_filter(f, DEVICE);
        assert_eq!(filter("$share/g1/x/y/2").as_deref(), Some("$share/g1/z/y/2"), "the group stays");
        assert_eq!(filter("$queue/y/a/z/b").as_deref(), Some("$queue/y/z/b"));
        assert_eq!(filter("x/y/z"), None);
    }

    #[test]
    fn the_client_id_and_user_name_fill_their_places() {
        let rules = Rewrites::compile(&[rule(
            RewriteAction::Publish,
            "up/#",
            "^up/(.*)$",
            "tenants/${username}/${clientid}/$1",
        )])
        .unwrap();
        assert_eq!(
            rules.rewrite(Rewriting::Publish, "up/t/1", DEVICE).as_deref(),
            Some("tenants/alice/dev7/t/1")
        );
        let anonymous = Sender { client_id: "c", username: None };
        assert_eq!(rules.rewrite(Rewriting::Publish, "up/a", anonymous).as_deref(), Some("tenants//c/a"));
    }

    #[test]
    fn a_result_that_is_no_topic_leaves_the_topic_as_it_was() {
        let rules = Rewrites::compile(&[rule(RewriteAction::All, "a/#", "^a/(.*)$", "b/$1/#")]).unwrap();
        assert_eq!(rules.rewrite(Rewriting::Publish, "a/x", DEVICE), None, "# in a topic name");
        assert_eq!(rules.rewrite(Rewriting::Subscribe, "a/x", DEVICE).as_deref(), Some("b/x/#"));
    }
}
