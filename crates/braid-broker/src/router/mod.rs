//! Routing: which sessions a message goes to. A topic trie holds normal subscriptions and
//! shared-subscription groups; [`shared`] picks one member of a group per message.

mod shared;
mod trie;

use std::sync::Arc;

use braid_proto::SubscriptionOptions;

use crate::config::SharedStrategy;
use crate::message::Message;
use crate::session::Session;

pub use trie::Trie;

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
        self.trie.insert(filter, group, entry)
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
        self.trie.len() == 0
    }

    /// The subscriptions `msg` goes to: every matching normal subscription (minus No Local
    /// ones of the publisher) and one member of every matching shared group.
    pub fn route<'a>(&'a self, msg: &Message, out: &mut Vec<&'a SubEntry>) {
        let strategy = self.strategy;
        self.trie.matches(&msg.topic, &mut |slot| {
            out.extend(
                slot.subs.iter().filter(|e| !(e.options.no_local && e.session.id == msg.origin)),
            );
            out.extend(slot.groups.iter().filter_map(|g| g.pick(strategy, msg)));
        });
    }
}
