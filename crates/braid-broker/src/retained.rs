//! Retained messages, kept in a topic tree so a wildcard subscription finds its matches
//! without scanning every retained topic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::message::Message;

#[derive(Debug, Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    msg: Option<Kept>,
}

/// A retained message and when it was kept (for its age, in the API).
#[derive(Debug, Clone)]
pub struct Kept {
    /// The message.
    pub msg: Arc<Message>,
    /// When it was set (for a message read back at start, or from another node, when this
    /// broker learned of it).
    pub since: Instant,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.msg.is_none()
    }
}

/// The last retained message of every topic.
#[derive(Debug, Default)]
pub struct Retained {
    root: Node,
    len: usize,
    /// How many of them are under `$SYS/` (the broker's own).
    sys: usize,
}

impl Retained {
    /// Stores `msg` for its topic at `now`, or clears the topic when the payload is empty.
    pub fn set(&mut self, msg: Arc<Message>, now: Instant) {
        let levels: Vec<&str> = msg.topic.split('/').collect();
        let sys = usize::from(is_sys(&msg.topic));
        if msg.payload.is_empty() {
            if clear(&mut self.root, &levels) {
                self.len -= 1;
                self.sys -= sys;
            }
            return;
        }
        let mut node = &mut self.root;
        for level in levels {
            node = node.children.entry(level.into()).or_default();
        }
        if node.msg.replace(Kept { msg, since: now }).is_none() {
            self.len += 1;
            self.sys += sys;
        }
    }

    /// Number of retained messages clients set (those under `$SYS/` are the broker's own).
    pub fn clients_len(&self) -> usize {
        self.len - self.sys
    }

    /// True if `topic` has a retained message.
    pub fn contains(&self, topic: &str) -> bool {
        let mut node = &self.root;
        for level in topic.split('/') {
            match node.children.get(level) {
                Some(child) => node = child,
                None => return false,
            }
        }
        node.msg.is_some()
    }

    /// Number of retained messages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is retained.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every unexpired retained message matching the valid topic `filter`.
    pub fn matching(&self, filter: &str, now: Instant) -> Vec<Arc<Message>> {
        self.matching_kept(filter, now).into_iter().map(|k| k.msg).collect()
    }

    /// [`Retained::matching`], with when each was kept.
    pub fn matching_kept(&self, filter: &str, now: Instant) -> Vec<Kept> {
        let levels: Vec<&str> = filter.split('/').collect();
        let mut out = Vec::new();
        collect(&self.root, &levels, true, &mut out);
        out.retain(|k| !k.msg.is_expired(now));
        out
    }

    /// Removes expired messages; returns them.
    pub fn purge_expired(&mut self, now: Instant) -> Vec<Arc<Message>> {
        let mut purged = Vec::new();
        purge(&mut self.root, now, &mut purged);
        self.len -= purged.len();
        self.sys -= purged.iter().filter(|m| is_sys(&m.topic)).count();
        purged
    }
}

fn is_sys(topic: &str) -> bool {
    topic.starts_with("$SYS/")
}

fn clear(node: &mut Node, levels: &[&str]) -> bool {
    match levels.split_first() {
        None => node.msg.take().is_some(),
        Some((level, rest)) => {
            let Some(child) = node.children.get_mut(*level) else {
                return false;
            };
            let cleared = clear(child, rest);
            if child.is_empty() {
                node.children.remove(*level);
            }
            cleared
        }
    }
}

/// Children a wildcard may descend into: at the root, not the `$` topics.
fn wildcard_children(node: &Node, root: bool) -> impl Iterator<Item = &Node> {
    node.children.iter().filter(move |(k, _)| !(root && k.starts_with('$'))).map(|(_, n)| n)
}

fn collect(node: &Node, levels: &[&str], root: bool, out: &mut Vec<Kept>) {
    match levels.split_first() {
        None => out.extend(node.msg.iter().cloned()),
        Some((&"#", _)) => {
            if !root {
                out.extend(node.msg.iter().cloned());
            }
            for child in wildcard_children(node, root) {
                collect(child, levels, false, out);
            }
        }
        Some((&"+", rest)) => {
            for child in wildcard_children(node, root) {
                collect(child, rest, false, out);
            }
        }
        Some((level, rest)) => {
            if let Some(child) = node.children.get(*level) {
                collect(child, rest, false, out);
            }
        }
    }
}

fn purge(node: &mut Node, now: Instant, purged: &mut Vec<Arc<Message>>) {
    if node.msg.as_ref().is_some_and(|k| k.msg.is_expired(now)) {
        purged.extend(node.msg.take().map(|k| k.msg));
    }
    node.children.retain(|_, child| {
        purge(child, now, purged);
        !child.is_empty()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::{ByteString, Bytes};

    fn msg(topic: &'static str, payload: &'static str) -> Arc<Message> {
        Message::internal(ByteString::from_static(topic), Bytes::from_static(payload.as_bytes()), true)
    }

    fn topics(r: &Retained, filter: &str) -> Vec<String> {
        let mut v: Vec<String> =
            r.matching(filter, Instant::now()).iter().map(|m| m.topic.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn set_replace_clear() {
        let mut r = Retained::default();
        r.set(msg("a/b", "1"), Instant::now());
        r.set(msg("a/b", "2"), Instant::now());
        assert_eq!(r.len(), 1);
        assert_eq!(&r.matching("a/b", Instant::now())[0].payload[..], b"2");
        r.set(msg("a/b", ""), Instant::now());
        assert!(r.is_empty());
        assert!(topics(&r, "#").is_empty());
    }

    #[test]
    fn a_topic_is_known_with_when_it_was_kept() {
        let mut r = Retained::default();
        let (t0, t1) = (Instant::now(), Instant::now() + std::time::Duration::from_secs(5));
        r.set(msg("a/b", "1"), t0);
        r.set(msg("a/c", "1"), t0);
        r.set(msg("a/b", "2"), t1);
        assert!(r.contains("a/b") && r.contains("a/c"));
        r.set(msg("$SYS/broker/uptime", "1"), t0);
        assert_eq!((r.len(), r.clients_len()), (3, 2), "the broker's own are not the clients'");
        assert!(!r.contains("a") && !r.contains("a/b/c") && !r.contains("b"));
        let kept = r.matching_kept("a/b", t1);
        assert_eq!((kept.len(), kept[0].since), (1, t1), "a replacement is kept from its own time");
    }

    #[test]
    fn wildcards_find_every_match_but_not_dollar_topics() {
        let mut r = Retained::default();
        for t in ["sport", "sport/tennis", "sport/tennis/p1", "news/x", "$SYS/up"] {
            r.set(msg(t, "x"), Instant::now());
        }
        assert_eq!(topics(&r, "#"), ["news/x", "sport", "sport/tennis", "sport/tennis/p1"]);
        assert_eq!(topics(&r, "sport/#"), ["sport", "sport/tennis", "sport/tennis/p1"]);
        assert_eq!(topics(&r, "+/tennis"), ["sport/tennis"]);
        assert_eq!(topics(&r, "+"), ["sport"]);
        assert_eq!(topics(&r, "$SYS/#"), ["$SYS/up"]);
    }
}
