//! Routing: which sessions a message goes to. A topic trie holds normal subscriptions and
//! shared-subscription groups; `shared.rs` picks one member of a group per message. Overlapping
//! subscriptions of one session may be merged into one delivery (see [`Router::route`]).

mod entry;
mod shared;
mod trie;

pub use entry::{Confirm, Delivered, Forward, RemoteRef, RemoteSink, Scope, SubEntry, Subscriber, Watermark};

use std::cmp::Reverse;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use braid_proto::topic::{intersects, parse_shared};
use braid_proto::QoS;

use crate::config::{Overlapping, SharedStrategy};
use crate::message::{Delivery, Message, SubIds};
use crate::session::SessionState;

use shared::Group;
use trie::Trie;

/// One delivery of a routed message: for one matching subscription, or for several of one
/// session merged.
#[derive(Debug)]
pub struct Target<'a> {
    /// The receiver.
    pub to: &'a Subscriber,
    /// The shared group it was picked from, if any.
    pub group: Option<&'a str>,
    /// The subscription, or of merged ones the one with the highest QoS.
    entry: &'a SubEntry,
    /// What the merged ones make of the delivery.
    merged: Option<Box<Merged>>,
}

/// Several subscriptions' part in one delivery.
#[derive(Debug)]
struct Merged {
    retain_as_published: bool,
    sub_ids: SubIds,
}

impl<'a> Target<'a> {
    fn new(entry: &'a SubEntry, group: Option<&'a str>) -> Target<'a> {
        Target { to: &entry.to, group, entry, merged: None }
    }

    /// May be merged with another target of its session.
    fn merges(&self) -> bool {
        self.entry.merge_overlaps && self.entry.overlaps > 0
    }

    /// Takes in `other`, a target of the same session whose QoS is not higher.
    fn absorb(&mut self, other: &Target) {
        let e = self.entry;
        let m = self.merged.get_or_insert_with(|| {
            Box::new(Merged { retain_as_published: e.options.retain_as_published, sub_ids: e.sub_id.into() })
        });
        m.retain_as_published |= other.entry.options.retain_as_published;
        m.sub_ids.merge(&other.entry.sub_id.into());
    }

    /// The QoS `msg` is delivered at: the lower of its own and the subscription's.
    pub fn qos(&self, msg: &Message) -> QoS {
        msg.qos.min(self.entry.options.qos)
    }

    /// The delivery of `msg`.
    pub fn delivery(&self, msg: &Arc<Message>) -> Delivery {
        let e = self.entry;
        let (retain_as_published, sub_ids) = match &self.merged {
            None => (e.options.retain_as_published, e.sub_id.into()),
            Some(m) => (m.retain_as_published, m.sub_ids.clone()),
        };
        Delivery {
            msg: msg.clone(),
            qos: msg.qos.min(e.options.qos),
            retain: msg.retain && retain_as_published,
            sub_ids,
            seq: 0,
            stream: e.stream,
            group: self.group.map(Arc::from),
        }
    }
}

/// A filter that gained its first or lost its last subscription by a session of this broker
/// or a relay (see [`RemoteSink::relays`], [`Router::watch`]): the full filter,
/// `$share/{group}/` included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterChange {
    /// Its first local subscription.
    Added(Box<str>),
    /// Its last local subscription went.
    Removed(Box<str>),
}

/// The subscription table.
#[derive(Debug)]
pub struct Router {
    trie: Trie,
    strategy: SharedStrategy,
    overlapping: Overlapping,
    watcher: Option<UnboundedSender<(u64, FilterChange)>>,
    /// How many changes were sent to the watcher.
    changes: u64,
}

impl Router {
    /// An empty table whose shared groups use `strategy` and whose v5 subscriptions overlap
    /// as `overlapping` says.
    pub fn new(strategy: SharedStrategy, overlapping: Overlapping) -> Router {
        Router { trie: Trie::default(), strategy, overlapping, watcher: None, changes: 0 }
    }

    /// From now on, sends `to` every [`FilterChange`] with its number (see
    /// [`Router::changes`]); first an `Added` for each filter that has local subscriptions now.
    /// A watcher set before is replaced.
    pub fn watch(&mut self, to: UnboundedSender<(u64, FilterChange)>) {
        let mut filters = Vec::new();
        self.trie.each_slot(&mut |filter, slot| {
            let groups = slot.groups().iter().map(|g| Some(&*g.name));
            for group in std::iter::once(None).chain(groups) {
                if slot.locals(group) > 0 {
                    filters.push(full_filter(filter, group));
                }
            }
        });
        for filter in filters {
            self.changes += 1;
            let _ = to.send((self.changes, FilterChange::Added(filter)));
        }
        self.watcher = Some(to);
    }

    /// How many [`FilterChange`]s were sent so far (see [`Router::watch`]).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Tells the watcher, if any, of a local subscription to `filter` in `group` that was
    /// just added (`up`) or removed, if it was the first or the last one there.
    fn count_local(&mut self, filter: &str, group: Option<&str>, up: bool) {
        let Some(to) = &self.watcher else { return };
        let locals = self.trie.slot(filter).map_or(0, |slot| slot.locals(group));
        let change = match (up, locals) {
            (true, 1) => FilterChange::Added(full_filter(filter, group)),
            (false, 0) => FilterChange::Removed(full_filter(filter, group)),
            _ => return,
        };
        self.changes += 1;
        let _ = to.send((self.changes, change));
    }

    /// Adds or replaces the subscription of `entry.to` to `filter` (in `group` if shared).
    /// Returns true if it is new. The session's `subscriptions` must hold its other ones.
    pub fn subscribe(&mut self, filter: &str, group: Option<&str>, entry: SubEntry) -> bool {
        self.insert(filter, group, entry, false)
    }

    /// Adds a subscription reloaded from the store at start: the session has none to
    /// `filter` yet, so the scan for one (linear in the filter's subscribers) is skipped.
    pub fn restore(&mut self, filter: &str, group: Option<&str>, entry: SubEntry) {
        self.insert(filter, group, entry, true);
    }

    fn insert(&mut self, filter: &str, group: Option<&str>, mut entry: SubEntry, unique: bool) -> bool {
        entry.merge_overlaps |= group.is_none() && self.overlapping == Overlapping::Single;
        let Subscriber::Session(session) = entry.to.clone() else {
            // A remote sink's subscriptions never merge.
            entry.merge_overlaps = false;
            let relays = entry.to.takes_forwarded();
            let is_new = self.trie.insert(filter, group, entry, unique);
            if is_new && relays {
                self.count_local(filter, group, true);
            }
            return is_new;
        };
        let counted = entry.to.takes_forwarded();
        let st = session.lock();
        let partners: Vec<_> = overlapping(&st, filter, group).collect();
        entry.overlaps = u16::try_from(partners.len()).unwrap_or(u16::MAX);
        let is_new = self.trie.insert(filter, group, entry, unique);
        if is_new {
            for (f, g) in partners {
                if let Some(p) = self.trie.get_mut(f, g, session.id) {
                    p.overlaps = p.overlaps.saturating_add(1);
                }
            }
            drop(st);
            if counted {
                self.count_local(filter, group, true);
            }
        }
        is_new
    }

    /// Removes a session's subscription. Returns true if it existed. Call it before the
    /// session's `subscriptions` lose it.
    pub fn unsubscribe(&mut self, filter: &str, group: Option<&str>, session_id: u64) -> bool {
        let Some(removed) = self.trie.remove(filter, group, session_id) else {
            return false;
        };
        if removed.to.takes_forwarded() {
            self.count_local(filter, group, false);
        }
        if let (true, Subscriber::Session(session)) = (removed.overlaps > 0, &removed.to) {
            for (f, g) in overlapping(&session.lock(), filter, group) {
                // A saturated count is no longer exact: it stays. Never below 0: one entry can
                // have two keys in `subscriptions` (`$queue/f`, `$share/$queue/f`).
                if let Some(p) = self.trie.get_mut(f, g, session_id).filter(|p| p.overlaps < u16::MAX) {
                    p.overlaps = p.overlaps.saturating_sub(1);
                }
            }
        }
        true
    }

    /// The filters (`$share/{group}/...` for a group) subscriber `id` has subscriptions to.
    /// A walk over the whole table: for rare work (a node's routes reset, a resync).
    pub fn filters_of(&self, id: u64) -> Vec<Box<str>> {
        let mut filters = Vec::new();
        self.trie.each_slot(&mut |filter, slot| {
            if slot.subs.iter().any(|e| e.to.id() == id) {
                filters.push(full_filter(filter, None));
            }
            for g in slot.groups().iter().filter(|g| g.members.iter().any(|e| e.to.id() == id)) {
                filters.push(full_filter(filter, Some(&g.name)));
            }
        });
        filters
    }

    /// Number of subscriptions (each shared-group member counts once).
    pub fn len(&self) -> usize {
        self.trie.len()
    }

    /// True when there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.trie.is_empty()
    }

    /// The deliveries of `msg`: one for every matching normal subscription (minus No Local
    /// ones of the publisher) and for one member of every matching shared group. Matches of
    /// one session that merge (3.1.x; v5 non-shared under `mqtt.overlapping = "single"`) become
    /// one delivery at the highest QoS, with their Subscription Identifiers and RETAIN kept if
    /// any of them has Retain As Published. Only subscriptions that overlap another of their
    /// session take part, and only when two of them match.
    pub fn route<'a>(&'a self, msg: &Message, out: &mut Vec<Target<'a>>) {
        let strategy = self.strategy;
        let mut merging = 0;
        self.trie.matches(&msg.topic, &mut |slot| {
            let subs = slot.subs.iter().filter(|e| !(e.options.no_local && e.to.id() == msg.origin));
            let picks = slot
                .groups()
                .iter()
                .filter_map(|g| g.pick(strategy, msg, false).map(|e| (e, Some(&*g.name))));
            push_targets(out, &mut merging, subs.map(|e| (e, None)).chain(picks));
        });
        if merging > 1 {
            merge_overlaps(out);
        }
    }

    /// The deliveries of `msg`, forwarded by another node, within `scope`: to this broker's
    /// sessions and relays (see [`RemoteSink::relays`]), by their normal subscriptions if
    /// `scope.plain`, and to one such member of each shared group `scope.groups` names (the
    /// sender picked this node for them), or, if the group has none left here, to a member on
    /// another node. With `spread` (a message read from a gone node's inbox, for sessions that
    /// are offline now), a group with no member here that can take it passes it on to a
    /// member elsewhere that can.
    pub fn route_forwarded<'a>(
        &'a self,
        msg: &Message,
        scope: &Scope,
        spread: bool,
        out: &mut Vec<Target<'a>>,
    ) {
        let strategy = self.strategy;
        let mut merging = 0;
        self.trie.matches(&msg.topic, &mut |slot| {
            let subs = slot.subs.iter().filter(|e| scope.plain && e.to.takes_forwarded());
            let groups = slot.groups().iter().filter(|g| scope.groups.iter().any(|n| **n == *g.name));
            // A group with no member here any more (the sender did not know yet) passes the
            // message on to a member elsewhere.
            let picks = groups.filter_map(|g| {
                let local = |m: &SubEntry| m.to.session().is_some();
                let pick = match spread {
                    true => g
                        .pick_where(strategy, msg, local, true)
                        .or_else(|| g.pick_where(strategy, msg, |_| true, true)),
                    false => None,
                };
                let pick =
                    pick.or_else(|| g.pick(strategy, msg, true)).or_else(|| g.pick(strategy, msg, false));
                pick.map(|e| (e, Some(&*g.name)))
            });
            push_targets(out, &mut merging, subs.map(|e| (e, None)).chain(picks));
        });
        if merging > 1 {
            merge_overlaps(out);
        }
    }

    /// True if the shared group `group` of `filter` has a member other than `from`.
    pub fn has_other_member(&self, filter: &str, group: &str, from: u64) -> bool {
        self.group(filter, group).is_some_and(|g| g.members.iter().any(|m| m.to.id() != from))
    }

    /// Who gets `msg` instead of `from`, a member of the shared group `group` of `filter` that
    /// went offline without acknowledging it: another member, one that can take it now if
    /// any (else the strategy's choice among them); None if `from` is the only member.
    pub fn pick_instead<'a>(
        &'a self,
        filter: &str,
        group: &str,
        from: u64,
        msg: &Message,
    ) -> Option<Target<'a>> {
        let g = self.group(filter, group)?;
        let others = |m: &SubEntry| m.to.id() != from;
        let pick = g
            .pick_where(self.strategy, msg, others, true)
            .or_else(|| g.pick_where(self.strategy, msg, others, false));
        pick.map(|e| Target::new(e, Some(&*g.name)))
    }

    fn group(&self, filter: &str, group: &str) -> Option<&Group> {
        self.trie.slot(filter)?.groups().iter().find(|g| &*g.name == group)
    }
}

/// `filter` in `group` as a client writes it: `$share/{group}/` (`$queue/`) and the filter.
fn full_filter(filter: &str, group: Option<&str>) -> Box<str> {
    match group {
        None => filter.into(),
        Some("$queue") => format!("$queue/{filter}").into(),
        Some(g) => format!("$share/{g}/{filter}").into(),
    }
}

/// Adds a target for each matching subscription (with the group it was picked from), counting
/// in `merging` those that may merge.
fn push_targets<'a>(
    out: &mut Vec<Target<'a>>,
    merging: &mut usize,
    matches: impl Iterator<Item = (&'a SubEntry, Option<&'a str>)>,
) {
    for (e, group) in matches {
        let t = Target::new(e, group);
        *merging += usize::from(t.merges());
        out.push(t);
    }
}

/// The session's subscriptions (filter and group) other than `filter` in `group` that some
/// topic matches together with it.
fn overlapping<'a>(
    st: &'a SessionState,
    filter: &'a str,
    group: Option<&'a str>,
) -> impl Iterator<Item = (&'a str, Option<&'a str>)> {
    let others = st.subscriptions.keys().map(|f| match parse_shared(f) {
        Ok(Some(shared)) => (shared.filter, Some(shared.group)),
        _ => (&**f, None),
    });
    others.filter(move |&(f, g)| (f, g) != (filter, group) && intersects(f, filter))
}

/// Merges the targets that may merge into one per session: the one of the highest QoS (and
/// its stream) takes in the others' Subscription Identifiers and Retain As Published.
fn merge_overlaps(targets: &mut Vec<Target<'_>>) {
    let mut merging = Vec::new();
    let mut i = 0;
    while i < targets.len() {
        if targets[i].merges() {
            merging.push(targets.swap_remove(i));
        } else {
            i += 1;
        }
    }
    merging.sort_by_key(|t| (t.to.id(), Reverse(t.entry.options.qos)));
    merging.dedup_by(|later, kept| {
        let same = later.to.id() == kept.to.id();
        if same {
            kept.absorb(later);
        }
        same
    });
    targets.append(&mut merging);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SessionConfig;
    use crate::session::QueueLimits;
    use crate::session::Session;
    use crate::store::SubscriptionRecord;
    use braid_proto::SubscriptionOptions;
    use braid_proto::{ByteString, Bytes, QoS};

    fn session(id: u64) -> Arc<Session> {
        let limits = Arc::new(QueueLimits::from_config(&SessionConfig {
            max_queued_messages: 10,
            ..Default::default()
        }));
        Arc::new(Session::new(id, ByteString::from(format!("c{id}")), limits))
    }

    fn entry(s: &Arc<Session>) -> SubEntry {
        SubEntry {
            to: Subscriber::Session(s.clone()),
            options: SubscriptionOptions::default(),
            sub_id: None,
            merge_overlaps: false,
            overlaps: 0,
            stream: Default::default(),
        }
    }

    fn msg(topic: &str) -> Arc<Message> {
        Message::internal(ByteString::from(topic), Bytes::new(), false)
    }

    fn routed(r: &Router, topic: &str) -> Vec<u64> {
        let mut out = Vec::new();
        r.route(&msg(topic), &mut out);
        let mut ids: Vec<u64> = out.iter().map(|e| e.to.id()).collect();
        ids.sort();
        ids
    }

    #[test]
    fn wildcards_match_by_level() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
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
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
        let (s1, s2, s3) = (session(1), session(2), session(3));
        r.subscribe("#", None, entry(&s1));
        r.subscribe("+/broker/uptime", None, entry(&s2));
        r.subscribe("$SYS/#", None, entry(&s3));
        assert_eq!(routed(&r, "$SYS/broker/uptime"), [3]);
    }

    #[test]
    fn resubscribe_replaces_and_unsubscribe_prunes() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
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
    fn filters_of_lists_a_subscribers_plain_and_group_filters() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
        let (s1, s2) = (session(1), session(2));
        r.subscribe("a/+", None, entry(&s1));
        r.subscribe("a/+", Some("g"), entry(&s1));
        r.subscribe("q", Some("$queue"), entry(&s1));
        r.subscribe("a/b", None, entry(&s2));
        let mut of_1 = r.filters_of(1);
        of_1.sort();
        assert_eq!(of_1, ["$queue/q".into(), "$share/g/a/+".into(), "a/+".into()] as [Box<str>; 3]);
        assert_eq!(r.filters_of(2), ["a/b".into()] as [Box<str>; 1]);
        assert!(r.filters_of(3).is_empty());
    }

    #[test]
    fn no_local_skips_the_publisher() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
        let s = session(7);
        let mut e = entry(&s);
        e.options.no_local = true;
        r.subscribe("t", None, e);
        let mut m = Arc::try_unwrap(msg("t")).unwrap();
        m.origin = 7;
        let mut out = Vec::new();
        r.route(&m, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn shared_group_gets_one_member_per_message_and_skips_offline_members() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
        let (a, b) = (session(1), session(2));
        r.subscribe("t", Some("g"), entry(&a));
        r.subscribe("t", Some("g"), entry(&b));
        // Both offline: round robin alternates between first choices.
        let picks: Vec<Vec<u64>> = (0..4).map(|_| routed(&r, "t")).collect();
        assert_eq!(picks, [vec![1], vec![2], vec![1], vec![2]]);
        // Only b online: b gets everything.
        let ctl = crate::control::ConnControl::new(&Default::default(), 0, 0);
        let l = crate::session::Link::new(braid_proto::ProtocolVersion::V5, 10, u32::MAX, 0, ctl);
        b.lock().attach(l);
        assert!((0..4).all(|_| routed(&r, "t") == [2]));
    }

    #[test]
    fn a_gone_members_message_goes_to_another_member_that_can_take_it() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
        let (a, b, c) = (session(1), session(2), session(3));
        for s in [&a, &b, &c] {
            r.subscribe("t/+", Some("g"), entry(s));
        }
        assert!(r.has_other_member("t/+", "g", 1));
        assert!(!r.has_other_member("t/#", "g", 1), "another filter is another group");
        let instead = |r: &Router| r.pick_instead("t/+", "g", 1, &msg("t/x")).map(|t| t.to.id());
        // All offline: another member's queue takes it, never the one that went.
        assert!((0..6).all(|_| matches!(instead(&r), Some(2 | 3))));
        // c online: c takes it.
        let ctl = crate::control::ConnControl::new(&Default::default(), 0, 0);
        c.lock().attach(crate::session::Link::new(braid_proto::ProtocolVersion::V5, 10, u32::MAX, 0, ctl));
        assert!((0..4).all(|_| instead(&r) == Some(3)));
        // The only member left: no one instead.
        r.unsubscribe("t/+", Some("g"), 2);
        r.unsubscribe("t/+", Some("g"), 3);
        assert!(!r.has_other_member("t/+", "g", 1));
        assert_eq!(instead(&r), None);
    }

    #[test]
    fn hash_topic_is_stable_per_topic() {
        let mut r = Router::new(SharedStrategy::HashTopic, Overlapping::Single);
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

    /// Subscribes as the broker does: the router first, then the session's own record.
    fn subscribe(r: &mut Router, filter: &str, e: SubEntry) {
        let (inner, group) = match parse_shared(filter).unwrap() {
            Some(shared) => (shared.filter, Some(shared.group)),
            None => (filter, None),
        };
        let (s, record) =
            (e.to.session().unwrap().clone(), SubscriptionRecord { options: e.options, sub_id: e.sub_id });
        r.subscribe(inner, group, e);
        s.lock().subscriptions.insert(ByteString::from(filter), record);
    }

    fn with(s: &Arc<Session>, sub_id: u32, qos: QoS) -> SubEntry {
        let mut e = entry(s);
        e.sub_id = Some(sub_id);
        e.options.qos = qos;
        e
    }

    /// The deliveries of a QoS 1 message to `topic` from session `origin`: session, QoS, ids,
    /// RETAIN.
    fn deliveries(r: &Router, topic: &str, retain: bool, origin: u64) -> Vec<(u64, QoS, Vec<u32>, bool)> {
        let mut m =
            Arc::try_unwrap(Message::internal(ByteString::from(topic), Bytes::new(), retain)).unwrap();
        (m.qos, m.origin) = (QoS::AtLeastOnce, origin);
        let (m, mut out) = (Arc::new(m), Vec::new());
        r.route(&m, &mut out);
        let d = |t: &Target| {
            let d = t.delivery(&m);
            (t.to.id(), d.qos, d.sub_ids.as_slice().to_vec(), d.retain)
        };
        let mut got: Vec<_> = out.iter().map(d).collect();
        got.sort();
        got
    }

    #[test]
    fn single_mode_merges_a_sessions_matches_into_one_delivery() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
        let (s1, s2) = (session(1), session(2));
        subscribe(&mut r, "a/+", with(&s1, 1, QoS::AtMostOnce));
        subscribe(&mut r, "a/#", with(&s1, 2, QoS::ExactlyOnce));
        subscribe(&mut r, "a/b", with(&s2, 3, QoS::AtLeastOnce));
        let one = (QoS::AtLeastOnce, vec![1, 2], false);
        assert_eq!(
            deliveries(&r, "a/b", false, 0),
            [(1, one.0, one.1, one.2), (2, QoS::AtLeastOnce, vec![3], false)]
        );
        // Only one of them matches: its own id.
        assert_eq!(deliveries(&r, "a/b/c", false, 0), [(1, QoS::AtLeastOnce, vec![2], false)]);

        let mut per = Router::new(SharedStrategy::RoundRobin, Overlapping::PerSubscription);
        let s3 = session(3);
        subscribe(&mut per, "a/+", with(&s3, 1, QoS::AtMostOnce));
        subscribe(&mut per, "a/#", with(&s3, 2, QoS::ExactlyOnce));
        let copies = [(3, QoS::AtMostOnce, vec![1], false), (3, QoS::AtLeastOnce, vec![2], false)];
        assert_eq!(deliveries(&per, "a/b", false, 0), copies);
    }

    #[test]
    fn mqtt3_subscriptions_merge_in_per_subscription_mode_too() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::PerSubscription);
        let s = session(1);
        for (filter, qos) in [("a/#", QoS::ExactlyOnce), ("a/b", QoS::AtMostOnce)] {
            let mut e = entry(&s);
            (e.options.qos, e.merge_overlaps) = (qos, true);
            subscribe(&mut r, filter, e);
        }
        assert_eq!(deliveries(&r, "a/b", false, 0), [(1, QoS::AtLeastOnce, vec![], false)]);
    }

    #[test]
    fn merged_delivery_keeps_retain_if_any_match_retains_as_published() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
        let s = session(1);
        let mut e = with(&s, 1, QoS::AtMostOnce);
        e.options.retain_as_published = true;
        subscribe(&mut r, "a/+", e);
        subscribe(&mut r, "a/#", with(&s, 2, QoS::AtLeastOnce));
        assert_eq!(deliveries(&r, "a/b", true, 0), [(1, QoS::AtLeastOnce, vec![1, 2], true)]);
    }

    #[test]
    fn shared_subscriptions_and_no_local_ones_are_not_merged() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
        let s = session(1);
        let mut local = with(&s, 1, QoS::AtMostOnce);
        local.options.no_local = true;
        subscribe(&mut r, "a/+", local);
        subscribe(&mut r, "a/#", with(&s, 2, QoS::AtMostOnce));
        subscribe(&mut r, "$share/g/a/b", with(&s, 3, QoS::AtLeastOnce));
        let shared = (1, QoS::AtLeastOnce, vec![3], false);
        let merged = (1, QoS::AtMostOnce, vec![1, 2], false);
        assert_eq!(deliveries(&r, "a/b", false, 0), [merged, shared.clone()]);
        // From the session itself: the No Local subscription does not match.
        assert_eq!(deliveries(&r, "a/b", false, 1), [(1, QoS::AtMostOnce, vec![2], false), shared]);
    }

    #[test]
    fn the_watcher_hears_of_first_and_last_local_subscriptions_and_gets_every_filter_at_start() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
        let (a, b) = (session(1), session(2));
        let internal =
            Arc::new(Session::new(3, ByteString::from("$internal/x"), a.lock().queue.limits().clone()));
        for (filter, group) in [("#", None), ("+", Some("g")), ("/a/+/#", None), ("a/b", Some("$queue"))] {
            r.subscribe(filter, group, entry(&a));
        }
        r.subscribe("a/b", None, entry(&internal));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        r.watch(tx);
        let mut heard = || std::iter::from_fn(|| rx.try_recv().ok()).collect::<Vec<_>>();
        let mut at_start: Vec<_> = heard().into_iter().map(|(_, c)| c).collect();
        at_start.sort_by_key(|c| format!("{c:?}"));
        let added = |f: &str| FilterChange::Added(f.into());
        assert_eq!(at_start, [added("#"), added("$queue/a/b"), added("$share/g/+"), added("/a/+/#")]);
        r.subscribe("#", None, entry(&b));
        r.subscribe("a/b", None, entry(&internal));
        assert_eq!(heard(), [], "not the first local one; an in-process client's is not local");
        r.unsubscribe("#", None, 1);
        assert_eq!(heard(), [], "not the last");
        r.unsubscribe("#", None, 2);
        r.subscribe("+", Some("h"), entry(&b));
        assert_eq!(heard(), [(5, FilterChange::Removed("#".into())), (6, added("$share/h/+"))]);
        assert_eq!(r.changes(), 6);
    }

    #[test]
    fn each_subscription_counts_the_others_it_overlaps() {
        let mut r = Router::new(SharedStrategy::RoundRobin, Overlapping::Single);
        let s = session(1);
        let filters = ["a/b", "c/d", "$SYS/x", "+/b", "#"];
        let counts = |r: &mut Router| filters.map(|f| r.trie.get_mut(f, None, 1).map_or(0, |e| e.overlaps));
        for filter in &filters[..3] {
            subscribe(&mut r, filter, entry(&s));
        }
        assert_eq!(counts(&mut r), [0, 0, 0, 0, 0], "no topic matches two of them");
        subscribe(&mut r, "+/b", entry(&s));
        subscribe(&mut r, "#", entry(&s));
        assert_eq!(counts(&mut r), [2, 1, 0, 2, 3], "# does not match $SYS/x");
        subscribe(&mut r, "#", entry(&s));
        assert_eq!(counts(&mut r), [2, 1, 0, 2, 3], "a subscription replaced");
        for filter in ["#", "a/b"] {
            assert!(r.unsubscribe(filter, None, s.id));
            s.lock().subscriptions.remove(filter);
        }
        assert_eq!(counts(&mut r), [0; 5]);
    }
}

#[cfg(test)]
mod proptests;
