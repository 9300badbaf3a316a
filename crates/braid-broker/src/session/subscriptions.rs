//! A session's subscriptions by full filter. Most sessions have a few: they are kept in a
//! list, searched in order, until there are more than [`FEW`]; then in a hash map. (A hash
//! map's smallest table, room for three, takes over 200 bytes; a list of two takes 96.)

use braid_proto::ByteString;

use super::small::SmallMap;
use crate::store::SubscriptionRecord;

/// Subscriptions a session keeps in a list; one more moves them to a hash map.
const FEW: usize = 8;

/// Subscriptions by full filter (including any `$share/group/` prefix).
#[derive(Debug, Default)]
pub struct Subscriptions(Repr);

#[derive(Debug)]
enum Repr {
    Few(Vec<(ByteString, SubscriptionRecord)>),
    /// Boxed: a session's subscriptions then take 24 bytes in it, not 32.
    #[allow(clippy::box_collection)]
    Many(Box<SmallMap<ByteString, SubscriptionRecord>>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Few(Vec::new())
    }
}

impl Subscriptions {
    /// Number of subscriptions.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Few(list) => list.len(),
            Repr::Many(map) => map.len(),
        }
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The subscription to `filter`.
    pub fn get(&self, filter: &str) -> Option<&SubscriptionRecord> {
        match &self.0 {
            Repr::Few(list) => list.iter().find(|(f, _)| f == filter).map(|(_, r)| r),
            Repr::Many(map) => map.get(filter),
        }
    }

    /// True if there is a subscription to `filter`.
    pub fn contains_key(&self, filter: &str) -> bool {
        self.get(filter).is_some()
    }

    /// Adds or replaces the subscription to `filter`; returns the one it replaced.
    pub fn insert(&mut self, filter: ByteString, record: SubscriptionRecord) -> Option<SubscriptionRecord> {
        let list = match &mut self.0 {
            Repr::Many(map) => return map.insert(filter, record),
            Repr::Few(list) => list,
        };
        if let Some((_, r)) = list.iter_mut().find(|(f, _)| *f == filter) {
            return Some(std::mem::replace(r, record));
        }
        if list.len() < FEW {
            // One at a time: most sessions stop at one or two.
            list.reserve_exact(1);
            list.push((filter, record));
        } else {
            let mut map: SmallMap<_, _> = list.drain(..).collect();
            map.insert(filter, record);
            self.0 = Repr::Many(Box::new(map));
        }
        None
    }

    /// Removes the subscription to `filter`; returns it.
    pub fn remove(&mut self, filter: &str) -> Option<SubscriptionRecord> {
        match &mut self.0 {
            Repr::Few(list) => {
                let i = list.iter().position(|(f, _)| f == filter)?;
                Some(list.swap_remove(i).1)
            }
            Repr::Many(map) => map.remove(filter),
        }
    }

    /// The filters.
    pub fn keys(&self) -> impl Iterator<Item = &ByteString> {
        self.iter().map(|(f, _)| f)
    }

    /// The filters with their subscriptions.
    pub fn iter(&self) -> impl Iterator<Item = (&ByteString, &SubscriptionRecord)> {
        let (few, many) = match &self.0 {
            Repr::Few(list) => (&list[..], None),
            Repr::Many(map) => (&[][..], Some(&**map)),
        };
        few.iter().map(|(f, r)| (f, r)).chain(many.into_iter().flatten())
    }

    /// Removes every subscription.
    pub fn clear(&mut self) {
        self.0 = Repr::default();
    }

    /// Takes every subscription out.
    pub fn drain(&mut self) -> impl Iterator<Item = (ByteString, SubscriptionRecord)> {
        let (few, many) = match std::mem::take(&mut self.0) {
            Repr::Few(list) => (list, None),
            Repr::Many(map) => (Vec::new(), Some(*map)),
        };
        few.into_iter().chain(many.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(sub_id: u32) -> SubscriptionRecord {
        SubscriptionRecord { options: Default::default(), sub_id: Some(sub_id) }
    }

    #[test]
    fn a_list_until_more_than_few_then_a_map_with_the_same_answers() {
        let mut s = Subscriptions::default();
        for n in 0..3 * FEW as u32 {
            assert!(s.insert(ByteString::from(format!("t/{n}")), record(n)).is_none());
            assert_eq!(s.insert(ByteString::from(format!("t/{n}")), record(n + 100)), Some(record(n)));
            assert_eq!(matches!(s.0, Repr::Many(_)), n as usize >= FEW, "after {} filters", n + 1);
            assert_eq!(s.len(), n as usize + 1);
            let mut ids: Vec<u32> = s.iter().map(|(_, r)| r.sub_id.unwrap() - 100).collect();
            ids.sort();
            assert_eq!(ids, (0..=n).collect::<Vec<_>>());
            assert!(s.keys().all(|f| s.contains_key(f)));
        }
        assert_eq!(s.remove("t/3"), Some(record(103)));
        assert!(s.remove("t/3").is_none() && s.get("t/3").is_none());
        assert_eq!(s.drain().count(), 3 * FEW - 1);
        assert!(s.is_empty());
    }

    #[test]
    fn a_few_take_just_their_room() {
        let mut s = Subscriptions::default();
        s.insert(ByteString::from("a"), record(1));
        s.insert(ByteString::from("b"), record(2));
        let Repr::Few(list) = &s.0 else { panic!("two are a list") };
        assert_eq!(list.capacity(), 2);
        assert_eq!(s.remove("a"), Some(record(1)));
        assert_eq!(s.keys().collect::<Vec<_>>(), ["b"]);
        s.clear();
        assert!(s.is_empty() && s.get("b").is_none());
    }
}
