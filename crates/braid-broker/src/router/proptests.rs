//! Property test: after any sequence of subscribes and unsubscribes (plain, `$share/{g}/`,
//! `$queue/`), the router matches each topic to exactly the subscriptions that
//! [`braid_proto::topic::matches`] says match, by brute force over a model of the table, and
//! each subscription counts the others of its session that [`intersects`] it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use braid_proto::topic::{intersects, matches};
use braid_proto::{ByteString, Bytes, SubscriptionOptions};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

use super::{full_filter, Router, SubEntry, Subscriber};
use crate::config::{Overlapping, SessionConfig, SharedStrategy};
use crate::message::Message;
use crate::session::{QueueLimits, Session};
use crate::store::SubscriptionRecord;

/// Sessions 1 to `SESSIONS` subscribe.
const SESSIONS: u64 = 3;

/// A subscription: filter, shared group, session.
type Sub = (String, Option<&'static str>, u64);

/// One step of a test case.
#[derive(Debug, Clone)]
enum Op {
    Subscribe(Sub),
    /// Unsubscribes the subscription of the model at this index.
    UnsubscribeHeld(Index),
    /// Unsubscribes what may or may not be held.
    Unsubscribe(Sub),
}

/// Levels from a small set, so that filters and topics meet; `$x` first is a `$` topic.
fn level() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["a", "b", "", "$x"])
}

fn filter() -> impl Strategy<Value = String> {
    let level = prop_oneof![3 => level(), 1 => Just("+")];
    (vec(level, 0..4), any::<bool>()).prop_map(|(mut levels, hash)| {
        if hash {
            levels.push("#");
        }
        nonempty(levels.join("/"))
    })
}

fn topic() -> impl Strategy<Value = String> {
    let level = prop_oneof![4 => level(), 1 => Just("c")];
    vec(level, 1..5).prop_map(|levels| nonempty(levels.join("/")))
}

/// The levels joined are valid as a filter or topic name unless empty: then two empty levels.
fn nonempty(s: String) -> String {
    if s.is_empty() {
        "/".into()
    } else {
        s
    }
}

fn sub() -> impl Strategy<Value = Sub> {
    let group = prop::sample::select(vec![None, None, Some("g"), Some("h"), Some("$queue")]);
    (filter(), group, 1..=SESSIONS)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => sub().prop_map(Op::Subscribe),
        2 => any::<Index>().prop_map(Op::UnsubscribeHeld),
        1 => sub().prop_map(Op::Unsubscribe),
    ]
}

fn session(id: u64) -> Arc<Session> {
    let limits = Arc::new(QueueLimits::from_config(&SessionConfig::default()));
    Arc::new(Session::new(id, ByteString::from(format!("c{id}")), limits))
}

/// Checks the router against the model `held` for each topic: the subscriptions the trie
/// reaches, the deliveries `route` makes, and each subscription's count of overlaps.
fn check(r: &mut Router, held: &BTreeSet<Sub>, topics: &[String]) -> Result<(), TestCaseError> {
    for topic in topics {
        let hits: Vec<&Sub> = held.iter().filter(|(f, _, _)| matches(f, topic)).collect();

        let mut reached = Vec::new();
        r.trie.matches(topic, &mut |slot| {
            reached.extend(slot.subs.iter().map(|e| (e.to.id(), None)));
            for g in slot.groups() {
                reached.extend(g.members.iter().map(|e| (e.to.id(), Some(g.name.to_string()))));
            }
        });
        reached.sort();
        let mut expected: Vec<_> = hits.iter().map(|(_, g, s)| (*s, g.map(String::from))).collect();
        expected.sort();
        prop_assert_eq!(&reached, &expected, "subscriptions reached by {:?}", topic);

        let msg = Message::internal(ByteString::from(topic.as_str()), Bytes::new(), false);
        let mut out = Vec::new();
        r.route(&msg, &mut out);
        // Plain: one delivery per match, or under `single` one per session (its matches merge).
        let mut plain: Vec<u64> = out.iter().filter(|t| t.group.is_none()).map(|t| t.to.id()).collect();
        plain.sort();
        let mut expected: Vec<u64> = hits.iter().filter(|(_, g, _)| g.is_none()).map(|h| h.2).collect();
        expected.sort();
        if r.overlapping == Overlapping::Single {
            expected.dedup();
        }
        prop_assert_eq!(plain, expected, "plain deliveries of {:?}", topic);
        // Shared: one delivery per matching filter of a group, to a member of the group.
        let mut picked: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for t in &out {
            if let Some(g) = t.group {
                picked.entry(g).or_default().push(t.to.id());
            }
        }
        let mut groups: BTreeMap<&str, (BTreeSet<&str>, BTreeSet<u64>)> = BTreeMap::new();
        for (f, g, s) in &hits {
            if let Some(g) = g {
                let (filters, members) = groups.entry(g).or_default();
                filters.insert(f);
                members.insert(*s);
            }
        }
        prop_assert_eq!(picked.len(), groups.len(), "groups delivered to for {:?}", topic);
        for (g, (filters, members)) in &groups {
            let got = picked.get(g).map_or(&[][..], |p| p.as_slice());
            prop_assert_eq!(got.len(), filters.len(), "deliveries of group {} for {:?}", g, topic);
            prop_assert!(got.iter().all(|s| members.contains(s)), "group {} picked {:?}", g, got);
        }
    }
    for (f, g, s) in held {
        let partners = held.iter().filter(|(f2, g2, s2)| s2 == s && (f2, g2) != (f, g) && intersects(f2, f));
        let overlaps = r.trie.get_mut(f, *g, *s).map(|e| e.overlaps);
        prop_assert_eq!(overlaps, Some(partners.count() as u16), "overlaps of {:?}", (f, g, s));
    }
    prop_assert_eq!(r.len(), held.len());
    Ok(())
}

/// Subscribes as the broker does: the router first, then the session's own record.
fn subscribe(
    r: &mut Router,
    sessions: &[Arc<Session>],
    held: &mut BTreeSet<Sub>,
    sub: Sub,
) -> Result<(), TestCaseError> {
    let (f, g, s) = &sub;
    let session = &sessions[*s as usize - 1];
    let options = SubscriptionOptions::default();
    let to = Subscriber::Session(session.clone());
    let entry = SubEntry {
        to,
        options,
        sub_id: None,
        merge_overlaps: false,
        overlaps: 0,
        stream: Default::default(),
    };
    prop_assert_eq!(r.subscribe(f, *g, entry), !held.contains(&sub), "new: {:?}", sub);
    let record = SubscriptionRecord { options, sub_id: None };
    session.lock().subscriptions.insert(ByteString::from(&*full_filter(f, *g)), record);
    held.insert(sub);
    Ok(())
}

/// Unsubscribes as the broker does: the router first, then the session's own record.
fn unsubscribe(
    r: &mut Router,
    sessions: &[Arc<Session>],
    held: &mut BTreeSet<Sub>,
    sub: Sub,
) -> Result<(), TestCaseError> {
    let (f, g, s) = &sub;
    prop_assert_eq!(r.unsubscribe(f, *g, *s), held.contains(&sub), "held: {:?}", sub);
    sessions[*s as usize - 1].lock().subscriptions.remove(&full_filter(f, *g));
    held.remove(&sub);
    Ok(())
}

proptest! {
    #[test]
    fn the_router_matches_what_the_reference_matcher_matches(
        single in any::<bool>(),
        ops in vec(op(), 1..24),
        topics in vec(topic(), 1..6),
    ) {
        let overlapping = if single { Overlapping::Single } else { Overlapping::PerSubscription };
        let mut r = Router::new(SharedStrategy::RoundRobin, overlapping);
        let sessions: Vec<_> = (1..=SESSIONS).map(session).collect();
        let mut held = BTreeSet::new();
        for op in ops {
            match op {
                Op::Subscribe(sub) => subscribe(&mut r, &sessions, &mut held, sub)?,
                Op::UnsubscribeHeld(i) => {
                    if let Some(sub) = held.iter().nth(i.index(held.len().max(1))).cloned() {
                        unsubscribe(&mut r, &sessions, &mut held, sub)?;
                    }
                }
                Op::Unsubscribe(sub) => unsubscribe(&mut r, &sessions, &mut held, sub)?,
            }
            check(&mut r, &held, &topics)?;
        }
    }
}
