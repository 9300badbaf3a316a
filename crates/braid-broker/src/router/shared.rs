//! Shared-subscription groups and their member selection strategies.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::SharedStrategy;
use crate::message::Message;

use super::entry::SubEntry;

/// The members of one `$share/{group}/{filter}`.
#[derive(Debug)]
pub(super) struct Group {
    /// Group name (`$queue` for the legacy `$queue/` prefix).
    pub name: Box<str>,
    /// Members in join order.
    pub members: Vec<SubEntry>,
    cursor: AtomicUsize,
}

impl Group {
    /// An empty group.
    pub(super) fn new(name: &str) -> Group {
        Group { name: name.into(), members: Vec::new(), cursor: AtomicUsize::new(0) }
    }

    /// The member that gets `msg`. The strategy names a first choice; a member that is offline
    /// or whose queue is full is passed over for the next one that can take the message, so
    /// nothing is lost while any member can. With no such member, the first choice gets it
    /// (an offline persistent member queues it). `local_only`: only sessions of this broker
    /// count as members (for a message another node picked this one for).
    pub(super) fn pick(
        &self,
        strategy: SharedStrategy,
        msg: &Message,
        local_only: bool,
    ) -> Option<&SubEntry> {
        if local_only && self.members.iter().any(|m| m.to.session().is_none()) {
            return self.pick_where(strategy, msg, |m| m.to.session().is_some(), false);
        }
        self.choose(strategy, msg, self.members.len(), |j| j, false)
    }

    /// As [`Group::pick`], among the members `keep` lets count; with `must_accept`, one that
    /// can take the message now or none.
    pub(super) fn pick_where(
        &self,
        strategy: SharedStrategy,
        msg: &Message,
        keep: impl Fn(&SubEntry) -> bool,
        must_accept: bool,
    ) -> Option<&SubEntry> {
        let kept: Vec<usize> = (0..self.members.len()).filter(|&i| keep(&self.members[i])).collect();
        self.choose(strategy, msg, kept.len(), |j| kept[j], must_accept)
    }

    /// Picks among `k` candidates, the j-th of which is member `at(j)` (see [`Group::pick`]).
    fn choose(
        &self,
        strategy: SharedStrategy,
        msg: &Message,
        k: usize,
        at: impl Fn(usize) -> usize,
        must_accept: bool,
    ) -> Option<&SubEntry> {
        if k == 0 {
            return None;
        }
        let first = match strategy {
            SharedStrategy::RoundRobin => self.cursor.fetch_add(1, Ordering::Relaxed),
            SharedStrategy::Random => rand::random::<usize>(),
            SharedStrategy::HashClientid => hash(msg.origin_client.as_bytes()),
            SharedStrategy::HashTopic => hash(msg.topic.as_bytes()),
            SharedStrategy::Sticky => self.cursor.load(Ordering::Relaxed),
        } % k;
        let chosen = match (0..k).map(|j| (first + j) % k).find(|&j| self.members[at(j)].to.can_accept()) {
            Some(j) => j,
            None if must_accept => return None,
            None => first,
        };
        if strategy == SharedStrategy::Sticky && chosen != first {
            self.cursor.store(chosen, Ordering::Relaxed);
        }
        Some(&self.members[at(chosen)])
    }
}

fn hash(bytes: &[u8]) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish() as usize
}
