//! Topic authorization: the rules file, compiled per client at connect time, and the checks
//! the connection runs on PUBLISH and SUBSCRIBE.
//!
//! A rules file holds one rule a line, `allow|deny WHO ACTION FILTER`, tried in order; the
//! first rule that applies decides, and `acl.default_policy` decides when none does (format in
//! `docs/security.md`). A client's rules are selected and their `%u`/`%c` placeholders filled
//! in once, when it connects, so a check is a walk over a handful of filters.

use std::path::Path;

use braid_proto::topic::{covers, intersects, matches, valid_topic_filter};

use super::file::{FileError, LineError};

/// What a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Publish,
    Subscribe,
    Both,
}

impl Action {
    fn covers(self, publish: bool) -> bool {
        matches!((self, publish), (Action::Both, _) | (Action::Publish, true) | (Action::Subscribe, false))
    }
}

/// Whom a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Who {
    /// Every client.
    All,
    /// Clients that connected without a user name.
    Anonymous,
    /// Users whose name matches the pattern (`*` matches any run of characters).
    User(String),
    /// Clients whose id matches the pattern.
    Client(String),
}

#[derive(Debug, Clone)]
struct Rule {
    allow: bool,
    who: Who,
    action: Action,
    /// Topic filter, possibly with `%u` / `%c`.
    filter: String,
}

/// A parsed rules file.
#[derive(Debug, Clone)]
pub struct AclRules {
    rules: Vec<Rule>,
    default_allow: bool,
}

impl AclRules {
    /// Parses rules `text`; the error names the line and the problem.
    pub fn parse(text: &str, default_allow: bool) -> Result<AclRules, LineError> {
        let mut rules = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |problem: String| Err(LineError { line: n + 1, problem });
            let words: Vec<&str> = line.split_whitespace().collect();
            let [verdict, who, action, filter] = words[..] else {
                return bad(format!("expected `allow|deny WHO ACTION FILTER`, got {line:?}"));
            };
            let allow = match verdict {
                "allow" => true,
                "deny" => false,
                other => return bad(format!("{other:?}: expected allow or deny")),
            };
            let who = match who.split_once(':') {
                _ if who == "all" || who == "*" => Who::All,
                _ if who == "anonymous" => Who::Anonymous,
                Some(("user", name)) if !name.is_empty() => Who::User(name.into()),
                Some(("client", id)) if !id.is_empty() => Who::Client(id.into()),
                _ => return bad(format!("{who:?}: expected all, anonymous, user:NAME or client:ID")),
            };
            let action = match action {
                "publish" | "pub" => Action::Publish,
                "subscribe" | "sub" => Action::Subscribe,
                "both" | "all" => Action::Both,
                other => return bad(format!("{other:?}: expected publish, subscribe or both")),
            };
            if !valid_topic_filter(&filter.replace("%u", "u").replace("%c", "c")) {
                return bad(format!("{filter:?} is not a valid topic filter"));
            }
            rules.push(Rule { allow, who, action, filter: filter.into() });
        }
        Ok(AclRules { rules, default_allow })
    }

    /// Reads and parses the rules file at `path`.
    pub fn load(path: &Path, default_allow: bool) -> Result<AclRules, FileError> {
        super::file::load_file(path, |text| AclRules::parse(text, default_allow))
    }

    /// The rules that apply to a client, placeholders filled in.
    pub fn for_client(&self, username: Option<&str>, client_id: &str) -> ClientAcl {
        let rules = self
            .rules
            .iter()
            .filter(|r| match &r.who {
                Who::All => true,
                Who::Anonymous => username.is_none(),
                Who::User(p) => username.is_some_and(|u| glob(p, u)),
                Who::Client(p) => glob(p, client_id),
            })
            .filter_map(|r| {
                let filter = substitute(&r.filter, username, client_id)?;
                Some(ClientRule { allow: r.allow, action: r.action, filter })
            })
            .collect();
        ClientAcl { rules, default_allow: self.default_allow }
    }
}

/// `filter` with `%u` and `%c` replaced; None (the rule does not apply) when a needed value is
/// missing or would bring wildcards or levels of its own into the filter.
fn substitute(filter: &str, username: Option<&str>, client_id: &str) -> Option<String> {
    let safe = |v: &str| !v.is_empty() && !v.contains(['+', '#', '/']);
    let mut out = filter.to_string();
    if out.contains("%u") {
        out = out.replace("%u", username.filter(|u| safe(u))?);
    }
    if out.contains("%c") {
        if !safe(client_id) {
            return None;
        }
        out = out.replace("%c", client_id);
    }
    Some(out)
}

/// `*` matches any run of characters; everything else matches itself.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            let Some(rest) = text.strip_prefix(head) else { return false };
            (0..=rest.len()).filter(|&i| rest.is_char_boundary(i)).any(|i| glob(tail, &rest[i..]))
        }
    }
}

#[derive(Debug, Clone)]
struct ClientRule {
    allow: bool,
    action: Action,
    filter: String,
}

/// One client's rules.
#[derive(Debug, Clone)]
pub struct ClientAcl {
    rules: Vec<ClientRule>,
    default_allow: bool,
}

impl ClientAcl {
    /// An allow-list (from a token claim or the HTTP hook): these filters, nothing else.
    /// Placeholders are filled in as in the rules file.
    pub fn allow_list(
        publish: &[String],
        subscribe: &[String],
        username: Option<&str>,
        client_id: &str,
    ) -> ClientAcl {
        let rule = |action| {
            move |f: &String| {
                let filter = substitute(f, username, client_id).filter(|f| valid_topic_filter(f))?;
                Some(ClientRule { allow: true, action, filter })
            }
        };
        let rules = publish
            .iter()
            .filter_map(rule(Action::Publish))
            .chain(subscribe.iter().filter_map(rule(Action::Subscribe)))
            .collect();
        ClientAcl { rules, default_allow: false }
    }

    /// May this client publish to `topic`? The first rule whose filter matches decides.
    pub fn may_publish(&self, topic: &str) -> bool {
        self.rules
            .iter()
            .find(|r| r.action.covers(true) && matches(&r.filter, topic))
            .map_or(self.default_allow, |r| r.allow)
    }

    /// May this client subscribe to `filter` (a shared subscription's inner filter)? An allow
    /// rule applies when it matches every topic `filter` can match; a deny rule as soon as it
    /// matches any of them, so `deny secret/#` also refuses `#` and `+/x`.
    pub fn may_subscribe(&self, filter: &str) -> bool {
        for r in self.rules.iter().filter(|r| r.action.covers(false)) {
            if r.allow && covers(&r.filter, filter) {
                return true;
            }
            if !r.allow && intersects(&r.filter, filter) {
                return false;
            }
        }
        // No allow rule covers it: the default may grant it only if no allow rule was needed.
        self.default_allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "
        # comments and blank lines are ignored

        deny   client:evil-*   both       #
        allow  user:admin      both       #
        allow  user:admin      subscribe  $SYS/#
        deny   all             subscribe  secret/#
        allow  all             both       users/%u/#
        allow  all             publish    clients/%c
        allow  anonymous       subscribe  public/#
        allow  all             subscribe  +/status
    ";

    fn acl(user: Option<&str>, client: &str) -> ClientAcl {
        AclRules::parse(RULES, false).unwrap().for_client(user, client)
    }

    #[test]
    fn first_match_wins_and_default_denies() {
        let evil = acl(Some("admin"), "evil-1");
        assert!(!evil.may_publish("a"), "the client deny comes before the admin allow");
        let admin = acl(Some("admin"), "c1");
        assert!(admin.may_publish("anything/at/all"));
        assert!(admin.may_subscribe("#"));
        assert!(admin.may_subscribe("$SYS/#"), "$SYS needs its own rule");
        let bob = acl(Some("bob"), "c2");
        assert!(!bob.may_publish("other"), "default deny");
    }

    #[test]
    fn placeholders_are_filled_per_client() {
        let bob = acl(Some("bob"), "c2");
        assert!(bob.may_publish("users/bob/x"));
        assert!(!bob.may_publish("users/alice/x"));
        assert!(bob.may_publish("clients/c2"));
        assert!(!bob.may_publish("clients/c3"));
        let anon = acl(None, "c3");
        assert!(!anon.may_publish("users/%u/x"), "%u never matches without a user name");
        assert!(anon.may_subscribe("public/news"));
        assert!(!bob.may_subscribe("public/news"), "anonymous rules do not apply to users");
        // A user name with wildcards or levels cannot widen its rule.
        assert!(!acl(Some("#"), "c").may_publish("users/x/y"));
        assert!(!acl(Some("a/b"), "c").may_publish("users/a/b/x"));
    }

    #[test]
    fn subscribe_allow_needs_cover_deny_needs_overlap() {
        let bob = acl(Some("bob"), "c2");
        assert!(bob.may_subscribe("users/bob/#"));
        assert!(bob.may_subscribe("users/bob/+/x"));
        assert!(!bob.may_subscribe("users/+/x"), "wider than the allowed filter");
        assert!(!bob.may_subscribe("secret/a"));
        assert!(bob.may_subscribe("a/status"));
        assert!(!bob.may_subscribe("+/status"), "+/status would receive secret/status");
        let mut open = AclRules::parse("deny all subscribe secret/#", true).unwrap().for_client(None, "c");
        assert!(!open.may_subscribe("#"), "# would receive secret/...");
        assert!(!open.may_subscribe("+/x"));
        assert!(open.may_subscribe("public/#"));
        open.default_allow = false;
        assert!(!open.may_subscribe("public/#"));
    }

    #[test]
    fn dollar_topics_need_dollar_rules() {
        let all = AclRules::parse("allow all both #", false).unwrap().for_client(None, "c");
        assert!(!all.may_subscribe("$SYS/#"));
        assert!(!all.may_publish("$SYS/x"));
        let deny = AclRules::parse("deny all subscribe #", true).unwrap().for_client(None, "c");
        assert!(deny.may_subscribe("$SYS/broker/uptime"), "# does not overlap $SYS");
    }

    #[test]
    fn bad_lines_are_named() {
        let err = AclRules::parse("allow all both a\npermit all both a", false).unwrap_err();
        assert_eq!(err.line, 2, "{err}");
        assert!(err.to_string().starts_with("line 2: "), "{err}");
        assert!(AclRules::parse("allow all read a", false).unwrap_err().problem.contains("read"));
        assert!(AclRules::parse("allow user: both a", false).is_err());
        assert!(AclRules::parse("allow all both a/#/b", false).is_err());
    }

    #[test]
    fn allow_list_from_claims() {
        let acl = ClientAcl::allow_list(&["up/%u/#".into()], &["down/%c".into()], Some("bob"), "c1");
        assert!(acl.may_publish("up/bob/1"));
        assert!(!acl.may_publish("down/c1"));
        assert!(acl.may_subscribe("down/c1"));
        assert!(!acl.may_subscribe("up/bob/1"));
    }

    #[test]
    fn globs() {
        assert!(glob("evil-*", "evil-1"));
        assert!(glob("*-x-*", "a-x-b"));
        assert!(!glob("evil-*", "good"));
        assert!(glob("*", ""));
    }
}
