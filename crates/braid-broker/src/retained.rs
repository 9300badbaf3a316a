//! Retained messages, kept in a topic tree so a wildcard subscription finds its matches
//! without scanning every retained topic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::message::Message;

#[derive(Debug, Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    msg: Option<Arc<Message>>,
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
}

impl Retained {
    /// Stores `msg` for its topic, or clears the topic when the payload is empty.
    pub fn set(&mut self, msg: Arc<Message>) {
        let levels: Vec<&str> = msg.topic.split('/').collect();
        if msg.payload.is_empty() {
            if clear(&mut self.root, &levels) {
                self.len -= 1;
            }
            return;
        }
        let mut node = &mut self.root;
        for level in levels {
            node = node.children.entry(level.into()).or_default();
        }
        if node.msg.replace(msg).is_none() {
            self.len += 1;
        }
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
        let levels: Vec<&str> = filter.split('/').collect();
        let mut out = Vec::new();
        collect(&self.root, &levels, true, &mut out);
        out.retain(|m| !m.is_expired(now));
        out
    }

    /// Removes expired messages; returns them.
    pub fn purge_expired(&mut self, now: Instant) -> Vec<Arc<Message>> {
        let mut purged = Vec::new();
        purge(&mut self.root, now, &mut purged);
        self.len -= purged.len();
        purged
    }
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

fn collect(node: &Node, levels: &[&str], root: bool, out: &mut Vec<Arc<Message>>) {
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
    if node.msg.as_ref().is_some_and(|m| m.is_expired(now)) {
        purged.extend(node.msg.take());
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
        r.set(msg("a/b", "1"));
        r.set(msg("a/b", "2"));
        assert_eq!(r.len(), 1);
        assert_eq!(&r.matching("a/b", Instant::now())[0].payload[..], b"2");
        r.set(msg("a/b", ""));
        assert!(r.is_empty());
        assert!(topics(&r, "#").is_empty());
    }

    #[test]
    fn wildcards_find_every_match_but_not_dollar_topics() {
        let mut r = Retained::default();
        for t in ["sport", "sport/tennis", "sport/tennis/p1", "news/x", "$SYS/up"] {
            r.set(msg(t, "x"));
        }
        assert_eq!(topics(&r, "#"), ["news/x", "sport", "sport/tennis", "sport/tennis/p1"]);
        assert_eq!(topics(&r, "sport/#"), ["sport", "sport/tennis", "sport/tennis/p1"]);
        assert_eq!(topics(&r, "+/tennis"), ["sport/tennis"]);
        assert_eq!(topics(&r, "+"), ["sport"]);
        assert_eq!(topics(&r, "$SYS/#"), ["$SYS/up"]);
    }
}
