//! The subscription trie: one node per topic level, with `+` and `#` as their own branches.

use std::collections::HashMap;

use super::entry::SubEntry;
use super::shared::Group;

/// The subscriptions that end at one place in the trie.
#[derive(Debug, Default)]
pub(super) struct Slot {
    /// Normal subscriptions.
    pub subs: Vec<SubEntry>,
    /// Shared-subscription groups.
    pub groups: Vec<Group>,
}

impl Slot {
    fn is_empty(&self) -> bool {
        self.subs.is_empty() && self.groups.is_empty()
    }

    /// Adds or replaces the session's entry (`unique`: known not to be there, no scan). True if new.
    fn insert(&mut self, group: Option<&str>, entry: SubEntry, unique: bool) -> bool {
        let list = match group {
            None => &mut self.subs,
            Some(name) => {
                let i = match self.groups.iter().position(|g| &*g.name == name) {
                    Some(i) => i,
                    None => {
                        self.groups.push(Group::new(name));
                        self.groups.len() - 1
                    }
                };
                &mut self.groups[i].members
            }
        };
        match list.iter_mut().find(|e| !unique && e.to.id() == entry.to.id()) {
            Some(existing) => {
                *existing = entry;
                false
            }
            None => {
                list.push(entry);
                true
            }
        }
    }

    fn entry_mut(&mut self, group: Option<&str>, session_id: u64) -> Option<&mut SubEntry> {
        let list = match group {
            None => &mut self.subs,
            Some(name) => &mut self.groups.iter_mut().find(|g| &*g.name == name)?.members,
        };
        list.iter_mut().find(|e| e.to.id() == session_id)
    }

    fn remove(&mut self, group: Option<&str>, session_id: u64) -> Option<SubEntry> {
        match group {
            None => remove_session(&mut self.subs, session_id),
            Some(name) => {
                let i = self.groups.iter().position(|g| &*g.name == name)?;
                let removed = remove_session(&mut self.groups[i].members, session_id);
                if self.groups[i].members.is_empty() {
                    self.groups.swap_remove(i);
                }
                removed
            }
        }
    }
}

fn remove_session(list: &mut Vec<SubEntry>, session_id: u64) -> Option<SubEntry> {
    let i = list.iter().position(|e| e.to.id() == session_id)?;
    Some(list.remove(i))
}

#[derive(Debug, Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    plus: Option<Box<Node>>,
    /// Filters that end at this level.
    here: Slot,
    /// Filters that end with `#` right below this level.
    multi: Slot,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.plus.is_none() && self.here.is_empty() && self.multi.is_empty()
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
            if level == "#" && levels.peek().is_none() {
                let new = node.multi.insert(group, entry, unique);
                self.len += usize::from(new);
                return new;
            }
            node = if level == "+" {
                node.plus.get_or_insert_with(Default::default)
            } else {
                node.children.entry(level.into()).or_default()
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
            match levels.next() {
                None => break &mut node.here,
                Some("#") if levels.peek().is_none() => break &mut node.multi,
                Some("+") => node = node.plus.as_deref_mut()?,
                Some(level) => node = node.children.get_mut(level)?,
            }
        };
        slot.entry_mut(group, session_id)
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
    if wild && !node.multi.is_empty() {
        f(&node.multi);
    }
    let Some(rest) = rest else {
        if !node.here.is_empty() {
            f(&node.here)
        }
        return;
    };
    // A plain byte scan: topic levels are short, and `split_once`'s searcher costs several
    // times more per level on every routed message.
    let (level, next) = match rest.bytes().position(|b| b == b'/') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    if let Some(child) = node.children.get(level) {
        walk(child, next, true, f);
    }
    if let (true, Some(plus)) = (wild, &node.plus) {
        walk(plus, next, true, f);
    }
}

fn remove_at(node: &mut Node, levels: &[&str], group: Option<&str>, session_id: u64) -> Option<SubEntry> {
    match levels {
        [] => node.here.remove(group, session_id),
        ["#"] => node.multi.remove(group, session_id),
        [level, rest @ ..] if *level == "+" => {
            let plus = node.plus.as_mut()?;
            let removed = remove_at(plus, rest, group, session_id);
            if plus.is_empty() {
                node.plus = None;
            }
            removed
        }
        [level, rest @ ..] => {
            let child = node.children.get_mut(*level)?;
            let removed = remove_at(child, rest, group, session_id);
            if child.is_empty() {
                node.children.remove(*level);
            }
            removed
        }
    }
}
