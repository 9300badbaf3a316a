//! Maps and sets without per-map random hash keys (16 bytes less in every session). Their keys
//! are a session's own subscriptions and packet ids, bounded by the session's limits
//! (`max_subscriptions` is unlimited by default), and chosen by its client: they are hashed
//! with SipHash keyed at random once per process ([`ProcessKeys`]), so a client cannot pick
//! filters that all collide without knowing the keys.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, DefaultHasher};
use std::sync::OnceLock;

/// Builds hashers with this process's random keys: zero-sized, where a [`RandomState`] would
/// keep its 16 bytes of keys in every map.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ProcessKeys;

impl BuildHasher for ProcessKeys {
    type Hasher = DefaultHasher;

    fn build_hasher(&self) -> DefaultHasher {
        static KEYS: OnceLock<RandomState> = OnceLock::new();
        KEYS.get_or_init(RandomState::new).build_hasher()
    }
}

/// A map of a session's own keys.
pub(super) type SmallMap<K, V> = HashMap<K, V, ProcessKeys>;
/// The set counterpart of [`SmallMap`].
pub(super) type SmallSet<K> = HashSet<K, ProcessKeys>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasherDefault;

    #[test]
    fn keyed_once_per_process_and_no_larger_than_unkeyed() {
        assert_eq!(std::mem::size_of::<ProcessKeys>(), 0);
        assert_eq!(
            std::mem::size_of::<SmallMap<u64, u64>>(),
            std::mem::size_of::<HashMap<u64, u64, BuildHasherDefault<DefaultHasher>>>()
        );
        // The same keys for every map: equal keys hash alike across maps.
        assert_eq!(ProcessKeys.hash_one("a/b/#"), ProcessKeys.hash_one("a/b/#"));
        // Not SipHash's fixed keys (equal only with a chance of one in 2^64).
        assert_ne!(
            ProcessKeys.hash_one("a/b/#"),
            BuildHasherDefault::<DefaultHasher>::default().hash_one("a/b/#")
        );
        let map: SmallMap<&str, u8> = [("x", 1), ("y", 2)].into_iter().collect();
        assert_eq!((map["x"], map["y"]), (1, 2));
    }
}
