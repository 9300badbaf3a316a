//! The subscription trie: one node per topic level, with `+` and `#` as their own branches.

use std::collections::HashMap;

use super::entry::SubEntry;
use super::shared::Group;

/// The subscriptions that end at one place in the trie.
#[derive(Debug, Default)]
pub(super) struct Slot {
    /// Normal subscriptions.
    pub subs: Vec<SubEntry>,
    /// Shared-subscription groups; boxed, as most filters have none (8 bytes instead of 24).
    #[allow(clippy::box_collection)]
    groups: Option<Box<Vec<Group>>>,
}

impl Slot {
    /// Shared-subscription groups.
    pub(super) fn groups(&self) -> &[Group] {
        self.groups.as_deref().map_or(&[], |g| g)
    }

    fn is_empty(&self) -> bool {
        self.subs.is_empty() && self.groups.is_none()
    }

    /// Adds or replaces the session's entry (`unique`: known not to be there, no scan). True if new.
    fn insert(&mut self, group: Option<&str>, entry: SubEntry, unique: bool) -> bool {
        let list = match group {
            None => &mut self.subs,
            Some(name) => {
                let groups = self.groups.get_or_insert_with(Default::default);
                let i = match groups.iter().position(|g| &*g.name == name) {
                    Some(i) => i,
                    None => {
                        groups.push(Group::new(name));
                        groups.len() - 1
                    }
                };
                &mut groups[i].members
            }
        };
        match list.iter_mut().find(|e| !unique && e.to.id() == entry.to.id()) {
            Some(existing) => {
                *existing = entry;
                false
            }
            None => {
                push(list, entry);
                true
            }
        }
    }

    /// The subscriptions in `group` (the normal ones for None).
    fn members(&self, group: Option<&str>) -> &[SubEntry] {
        match group {
            None => &self.subs,
            Some(name) => self.groups().iter().find(|g| &*g.name == name).map_or(&[], |g| &g.members),
        }
    }

    /// How many subscriptions in `group` (the normal ones for None) are of this broker's
    /// sessions or relays (see [`super::Subscriber::takes_forwarded`]): 0, 1, or 2 for more.
    pub(super) fn locals(&self, group: Option<&str>) -> usize {
        self.members(group).iter().filter(|e| e.to.takes_forwarded()).take(2).count()
    }

    fn entry_mut(&mut self, group: Option<&str>, session_id: u64) -> Option<&mut SubEntry> {
        let list = match group {
            None => &mut self.subs,
            Some(name) => &mut self.groups.as_mut()?.iter_mut().find(|g| &*g.name == name)?.members,
        };
        list.iter_mut().find(|e| e.to.id() == session_id)
    }

    fn remove(&mut self, group: Option<&str>, session_id: u64) -> Option<SubEntry> {
        match group {
            None => remove_session(&mut self.subs, session_id),
            Some(name) => {
                let groups = self.groups.as_mut()?;
                let i = groups.iter().position(|g| &*g.name == name)?;
                let removed = remove_session(&mut groups[i].members, session_id);
                if groups[i].members.is_empty() {
                    groups.swap_remove(i);
                    if groups.is_empty() {
                        self.groups = None;
                    }
                }
                removed
            }
        }
    }
}

/// Subscribers a list grows to one at a time before it grows as usual (by doubling): most
/// filters have one subscriber, for which `Vec`'s first allocation of four would be 3/4 empty.
const EXACT_UP_TO: usize = 4;

fn push(list: &mut Vec<SubEntry>, entry: SubEntry) {
    if list.len() == list.capacity() && list.len() < EXACT_UP_TO {
        list.reserve_exact(1);
    }
    list.push(entry);
}

fn remove_session(list: &mut Vec<SubEntry>, session_id: u64) -> Option<SubEntry> {
    let i = list.iter().position(|e| e.to.id() == session_id)?;
    Some(list.remove(i))
}

/// One level of the trie. Most nodes are leaves (the last level of a filter): everything
/// below a node is boxed, so a leaf is its slot and one pointer.
#[derive(Debug, Default)]
struct Node {
    /// Filters that end at this level.
    here: Slot,
    below: Option<Box<Below>>,
}

/// What is below a node that is not a leaf.
#[derive(Debug, Default)]
struct Below {
    children: HashMap<Box<str>, Node>,
    plus: Option<Box<Node>>,
    /// Filters that end with `#` right below this level.
    multi: Slot,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.here.is_empty() && self.below.is_none()
    }

    fn below_mut(&mut self) -> &mut Below {
        self.below.get_or_insert_with(Default::default)
    }

    /// Drops what is below once nothing is.
    fn prune(&mut self) {
        if self
            .below
            .as_ref()
            .is_some_and(|b| b.children.is_empty() && b.plus.is_none() && b.multi.is_empty())
        {
            self.below = None;
        }
    }
}

/// Topic filters to subscriptions.
#[derive(Debug, Default)]
pub(super) struct Trie {
    root: Node,
    len: usize,
}

impl Trie {
    /// Adds or replaces a subscription to a valid `filter`. True if new. With `unique` the
    /// caller knows the session has no subscription to `filter` yet (no scan for it).
    pub(super) fn insert(
        &mut self,
        filter: &str,
        group: Option<&str>,
        entry: SubEntry,
        unique: bool,
    ) -> bool {
        let mut node = &mut self.root;
        let mut levels = filter.split('/').peekable();
        while let Some(level) = levels.next() {
            let below = node.below_mut();
            if level == "#" && levels.peek().is_none() {
                let new = below.multi.insert(group, entry, unique);
                self.len += usize::from(new);
                return new;
            }
            node = if level == "+" {
                below.plus.get_or_insert_with(Default::default)
            } else {
                below.children.entry(level.into()).or_default()
            };
        }
        let new = node.here.insert(group, entry, unique);
        self.len += usize::from(new);
        new
    }

    /// Removes a session's subscription to `filter`, pruning empty branches; returns it.
    pub(super) fn remove(&mut self, filter: &str, group: Option<&str>, session_id: u64) -> Option<SubEntry> {
        let levels: Vec<&str> = filter.split('/').collect();
        let removed = remove_at(&mut self.root, &levels, group, session_id);
        self.len -= usize::from(removed.is_some());
        removed
    }

    /// A session's subscription to `filter`.
    pub(super) fn get_mut(
        &mut self,
        filter: &str,
        group: Option<&str>,
        session_id: u64,
    ) -> Option<&mut SubEntry> {
        let mut node = &mut self.root;
        let mut levels = filter.split('/').peekable();
        let slot = loop {
            let Some(level) = levels.next() else { break &mut node.here };
            let below = node.below.as_deref_mut()?;
            match level {
                "#" if levels.peek().is_none() => break &mut below.multi,
                "+" => node = below.plus.as_deref_mut()?,
                level => node = below.children.get_mut(level)?,
            }
        };
        slot.entry_mut(group, session_id)
    }

    /// The subscriptions to exactly `filter`, if any.
    pub(super) fn slot(&self, filter: &str) -> Option<&Slot> {
        let mut node = &self.root;
        let mut levels = filter.split('/').peekable();
        loop {
            let Some(level) = levels.next() else { return Some(&node.here) };
            let below = node.below.as_deref()?;
            match level {
                "#" if levels.peek().is_none() => return Some(&below.multi),
                "+" => node = below.plus.as_deref()?,
                level => node = below.children.get(level)?,
            }
        }
    }

    /// Calls `f` with every slot that holds subscriptions and the filter that ends there.
    pub(super) fn each_slot<'a>(&'a self, f: &mut impl FnMut(&str, &'a Slot)) {
        each_slot(&self.root, &mut String::new(), true, f);
    }

    /// Number of subscriptions.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// True when there are no subscriptions.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Calls `f` with every slot whose filter matches `topic`. Topics starting with `$` are not
    /// matched by a first level of `+` or `#`.
    pub(super) fn matches<'a>(&'a self, topic: &str, f: &mut impl FnMut(&'a Slot)) {
        walk(&self.root, Some(topic), !topic.starts_with('$'), f);
    }
}

/// Matches the levels of `rest` (None once every level is consumed) below `node`.
fn walk<'a>(node: &'a Node, rest: Option<&str>, wild: bool, f: &mut impl FnMut(&'a Slot)) {
    let below = node.below.as_deref();
    if let (true, Some(below)) = (wild, below) {
        if !below.multi.is_empty() {
            f(&below.multi);
        }
    }
    let Some(rest) = rest else {
        if !node.here.is_empty() {
            f(&node.here)
        }
        return;
    };
    let Some(below) = below else { return };
    // A plain byte scan: topic levels are short, and `split_once`'s searcher costs several
    // times more per level on every routed message.
    let (level, next) = match rest.bytes().position(|b| b == b'/') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    if let Some(child) = below.children.get(level) {
        walk(child, next, true, f);
    }
    if let (true, Some(plus)) = (wild, &below.plus) {
        walk(plus, next, true, f);
    }
}

/// [`Trie::each_slot`] below `node`, whose filter is `path` (`top`: the root, no level yet).
fn each_slot<'a>(node: &'a Node, path: &mut String, top: bool, f: &mut impl FnMut(&str, &'a Slot)) {
    if !node.here.is_empty() {
        f(path, &node.here);
    }
    let Some(below) = node.below.as_deref() else { return };
    let len = path.len();
    let down = |path: &mut String, level: &str| {
        path.truncate(len);
        if !top {
            path.push('/');
        }
        path.push_str(level);
    };
    if !below.multi.is_empty() {
        down(path, "#");
        f(path, &below.multi);
    }
    if let Some(plus) = &below.plus {
        down(path, "+");
        each_slot(plus, path, false, f);
    }
    for (level, child) in &below.children {
        down(path, level);
        each_slot(child, path, false, f);
    }
    path.truncate(len);
}

fn remove_at(node: &mut Node, levels: &[&str], group: Option<&str>, session_id: u64) -> Option<SubEntry> {
    let [level, rest @ ..] = levels else { return node.here.remove(group, session_id) };
    let below = node.below.as_deref_mut()?;
    let removed = match (*level, rest) {
        ("#", []) => below.multi.remove(group, session_id),
        ("+", _) => {
            let plus = below.plus.as_mut()?;
            let removed = remove_at(plus, rest, group, session_id);
            if plus.is_empty() {
                below.plus = None;
            }
            removed
        }
        (level, _) => {
            let child = below.children.get_mut(level)?;
            let removed = remove_at(child, rest, group, session_id);
            if child.is_empty() {
                below.children.remove(level);
            }
            removed
        }
    };
    node.prune();
    removed
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::SessionConfig;
    use crate::router::Subscriber;
    use crate::session::{QueueLimits, Session};

    fn entry(id: u64) -> SubEntry {
        let limits = Arc::new(QueueLimits::from_config(&SessionConfig::default()));
        SubEntry {
            to: Subscriber::Session(Arc::new(Session::new(id, format!("c{id}").into(), limits))),
            options: Default::default(),
            sub_id: None,
            merge_overlaps: false,
            overlaps: 0,
            stream: Default::default(),
        }
    }

    /// The ids of the normal subscriptions and of every group member `topic` reaches.
    fn reached(t: &Trie, topic: &str) -> Vec<u64> {
        let mut ids = Vec::new();
        t.matches(topic, &mut |slot| {
            ids.extend(slot.subs.iter().map(|e| e.to.id()));
            ids.extend(slot.groups().iter().flat_map(|g| g.members.iter().map(|e| e.to.id())));
        });
        ids.sort();
        ids
    }

    #[test]
    fn hash_matches_its_parent_level_and_plus_exactly_one_level() {
        let mut t = Trie::default();
        t.insert("a/#", None, entry(1), false);
        t.insert("a/+", None, entry(2), false);
        t.insert("+/+/c", None, entry(3), false);
        assert_eq!(reached(&t, "a"), [1]);
        assert_eq!(reached(&t, "a/b"), [1, 2]);
        assert_eq!(reached(&t, "a/b/c"), [1, 3]);
        assert_eq!(reached(&t, "b/b/c"), [3]);
        assert_eq!(reached(&t, "$SYS/b/c"), Vec::<u64>::new(), "no leading wildcard for $ topics");
    }

    #[test]
    fn a_group_and_a_normal_subscription_to_one_filter_are_kept_apart_and_removal_prunes() {
        let mut t = Trie::default();
        assert!(t.insert("x/y", None, entry(1), false));
        assert!(t.insert("x/y", Some("g"), entry(1), false), "a group member is another subscription");
        assert!(!t.insert("x/y", Some("g"), entry(1), false), "the same member again replaces");
        assert!(t.insert("x/y", Some("g"), entry(2), true));
        assert_eq!(t.len(), 3);
        assert_eq!(reached(&t, "x/y"), [1, 1, 2]);
        assert!(t.get_mut("x/y", Some("g"), 2).is_some());
        assert!(t.get_mut("x/y", Some("h"), 2).is_none());
        assert_eq!(t.remove("x/y", Some("g"), 1).map(|e| e.to.id()), Some(1));
        assert!(t.remove("x/y", Some("g"), 1).is_none());
        assert!(t.remove("x/y", None, 1).is_some());
        assert!(t.remove("x/y", Some("g"), 2).is_some());
        assert!(t.is_empty());
        assert!(t.root.is_empty(), "every emptied branch was pruned");
    }
}
