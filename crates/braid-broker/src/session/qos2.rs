//! Inbound QoS 2 packet ids received and not yet released by PUBREL.

use super::small::SmallSet;

/// The ids, made at the first QoS 2 PUBLISH: a session that never gets one (most) carries one
/// pointer for them.
#[derive(Debug, Default)]
pub struct Qos2Ids(Option<Box<SmallSet<u16>>>);

impl Qos2Ids {
    /// True if `id` was received and not released.
    pub fn contains(&self, id: u16) -> bool {
        self.0.as_ref().is_some_and(|s| s.contains(&id))
    }

    /// Number of ids awaiting PUBREL.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.len())
    }

    /// True if no id awaits PUBREL.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records `id`; true if it was new.
    pub fn insert(&mut self, id: u16) -> bool {
        self.0.get_or_insert_with(Box::default).insert(id)
    }

    /// Forgets `id` (PUBREL); true if it was known.
    pub fn remove(&mut self, id: u16) -> bool {
        self.0.as_mut().is_some_and(|s| s.remove(&id))
    }
}

impl FromIterator<u16> for Qos2Ids {
    fn from_iter<I: IntoIterator<Item = u16>>(ids: I) -> Self {
        let set: SmallSet<u16> = ids.into_iter().collect();
        Qos2Ids((!set.is_empty()).then(|| Box::new(set)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_kept_until_released() {
        let mut ids = Qos2Ids::default();
        assert!(!ids.contains(7) && ids.is_empty());
        assert!(ids.insert(7));
        assert!(!ids.insert(7), "a resent PUBLISH is not new");
        assert_eq!(ids.len(), 1);
        assert!(ids.remove(7));
        assert!(!ids.remove(7), "a second PUBREL finds nothing");
        let restored: Qos2Ids = [1, 2].into_iter().collect();
        assert!(restored.contains(2) && restored.len() == 2);
    }
}
