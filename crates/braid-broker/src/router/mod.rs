//! Routing: which sessions a message goes to. A topic trie holds normal subscriptions and
//! shared-subscription groups; [`shared`] picks one member of a group per message.

mod shared;
mod trie;

use std::sync::Arc;

use braid_proto::SubscriptionOptions;

use crate::config::SharedStrategy;
use crate::message::{Message, StreamTag};
use crate::session::Session;

use trie::Trie;

/// One subscription in the trie.
#[derive(Debug, Clone)]
pub struct SubEntry {
    /// The subscribing session.
    pub session: Arc<Session>,
    /// Subscription options.
    pub options: SubscriptionOptions,
    /// v5 Subscription Identifier.
    pub sub_id: Option<u32>,
    /// Merge overlapping matches into one delivery at the highest QoS (MQTT 3.1.x rule);
    /// v5 subscriptions each get their own copy.
    pub merge_overlaps: bool,
    /// The stream the subscription was made on (QUIC multi-stream).
    pub stream: StreamTag,
}

/// The subscription table.
#[derive(Debug)]
pub struct Router {
    trie: Trie,
    strategy: SharedStrategy,
}

impl Router {
    /// An empty table whose shared groups use `strategy`.
    pub fn new(strategy: SharedStrategy) -> Router {
        Router { trie: Trie::default(), strategy }
    }

    /// Adds or replaces the subscription of `entry.session` to `filter` (in `group` if shared).
    /// Returns true if it is new.
    pub fn subscribe(&mut self, filter: &str, group: Option<&str>, entry: SubEntry) -> bool {
        self.trie.insert(filter, group, entry, false)
    }

    /// Adds a subscription reloaded from the store at start: the session has none to
    /// `filter` yet, so the scan for one (linear in the filter's subscribers) is skipped.
    pub fn restore(&mut self, filter: &str, group: Option<&str>, entry: SubEntry) {
        self.trie.insert(filter, group, entry, true);
    }

    /// Removes a session's subscription. Returns true if it existed.
    pub fn unsubscribe(&mut self, filter: &str, group: Option<&str>, session_id: u64) -> bool {
        self.trie.remove(filter, group, session_id)
    }

    /// Number of subscriptions (each shared-group member counts once).
    pub fn len(&self) -> usize {
        self.trie.len()
    }

    /// True when there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.trie.is_empty()
    }

    /// The subscriptions `msg` goes to: every matching normal subscription (minus No Local
    /// ones of the publisher) and one member of every matching shared group.
    pub fn route<'a>(&'a self, msg: &Message, out: &mut Vec<&'a SubEntry>) {
        let strategy = self.strategy;
        self.trie.matches(&msg.topic, &mut |slot| {
            out.extend(slot.subs.iter().filter(|e| !(e.options.no_local && e.session.id == msg.origin)));
            out.extend(slot.groups.iter().filter_map(|g| g.pick(strategy, msg)));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SessionConfig;
    use crate::session::QueueLimits;
    use braid_proto::{ByteString, Bytes};

    fn session(id: u64) -> Arc<Session> {
        let limits = Arc::new(QueueLimits::from_config(&SessionConfig {
            max_queued_messages: 10,
            ..Default::default()
        }));
        Arc::new(Session::new(id, ByteString::from(format!("c{id}")), limits))
    }

    fn entry(s: &Arc<Session>) -> SubEntry {
        SubEntry {
            session: s.clone(),
            options: SubscriptionOptions::default(),
            sub_id: None,
            merge_overlaps: false,
            stream: Default::default(),
        }
    }

    fn msg(topic: &str) -> Message {
        let m = Message::internal(ByteString::from(topic), Bytes::new(), false);
        Arc::try_unwrap(m).unwrap()
    }

    fn routed(r: &Router, topic: &str) -> Vec<u64> {
        let mut out = Vec::new();
        r.route(&msg(topic), &mut out);
        let mut ids: Vec<u64> = out.iter().map(|e| e.session.id).collect();
        ids.sort();
        ids
    }

    #[test]
    fn wildcards_match_by_level() {
        let mut r = Router::new(SharedStrategy::RoundRobin);
        let filters = ["a/b", "a/+", "a/#", "#", "+/+/c", "a/+/c/#", "b"];
        let sessions: Vec<_> = (1..=filters.len() as u64).map(session).collect();
        for (f, s) in filters.iter().zip(&sessions) {
            assert!(r.subscribe(f, None, entry(s)));
        }
        assert_eq!(routed(&r, "a/b"), [1, 2, 3, 4]);
        assert_eq!(routed(&r, "a"), [3, 4], "a/# matches its parent level");
        assert_eq!(routed(&r, "a/x/c"), [3, 4, 5, 6]);
        assert_eq!(routed(&r, "a/x/c/d/e"), [3, 4, 6]);
        assert_eq!(routed(&r, "b"), [4, 7]);
        assert_eq!(routed(&r, "a//c"), [3, 4, 5, 6], "empty levels are levels");
    }

    #[test]
    fn dollar_topics_skip_leading_wildcards() {
        let mut r = Router::new(SharedStrategy::RoundRobin);
        let (s1, s2, s3) = (session(1), session(2), session(3));
        r.subscribe("#", None, entry(&s1));
        r.subscribe("+/broker/uptime", None, entry(&s2));
        r.subscribe("$SYS/#", None, entry(&s3));
        assert_eq!(routed(&r, "$SYS/broker/uptime"), [3]);
    }

    #[test]
    fn resubscribe_replaces_and_unsubscribe_prunes() {
        let mut r = Router::new(SharedStrategy::RoundRobin);
        let s = session(1);
        assert!(r.subscribe("a/+/c", None, entry(&s)));
        assert!(!r.subscribe("a/+/c", None, entry(&s)), "same filter again replaces");
        assert_eq!(r.len(), 1);
        assert!(r.unsubscribe("a/+/c", None, 1));
        assert!(!r.unsubscribe("a/+/c", None, 1));
        assert!(r.is_empty());
        assert!(routed(&r, "a/b/c").is_empty());
    }

    #[test]
    fn no_local_skips_the_publisher() {
        let mut r = Router::new(SharedStrategy::RoundRobin);
        let s = session(7);
        let mut e = entry(&s);
        e.options.no_local = true;
        r.subscribe("t", None, e);
        let mut m = msg("t");
        m.origin = 7;
        let mut out = Vec::new();
        r.route(&m, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn shared_group_gets_one_member_per_message_and_skips_offline_members() {
        let mut r = Router::new(SharedStrategy::RoundRobin);
        let (a, b) = (session(1), session(2));
        r.subscribe("t", Some("g"), entry(&a));
        r.subscribe("t", Some("g"), entry(&b));
        // Both offline: round robin alternates between first choices.
        let picks: Vec<Vec<u64>> = (0..4).map(|_| routed(&r, "t")).collect();
        assert_eq!(picks, [vec![1], vec![2], vec![1], vec![2]]);
        // Only b online: b gets everything.
        let ctl = Arc::new(crate::control::ConnControl::new(0, 0));
        let l = crate::session::Link::new(braid_proto::ProtocolVersion::V5, 10, u32::MAX, 0, ctl);
        b.lock().attach(l);
        assert!((0..4).all(|_| routed(&r, "t") == [2]));
    }

    #[test]
    fn hash_topic_is_stable_per_topic() {
        let mut r = Router::new(SharedStrategy::HashTopic);
        let sessions: Vec<_> = (1..=3).map(session).collect();
        for s in &sessions {
            r.subscribe("t/+", Some("g"), entry(s));
        }
        for topic in ["t/1", "t/2", "t/3"] {
            let first = routed(&r, topic);
            assert_eq!(first.len(), 1);
            assert!((0..5).all(|_| routed(&r, topic) == first));
        }
    }
}
