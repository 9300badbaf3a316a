//! Maps and sets without per-map random hash keys (16 bytes less in every session). Their keys
//! are a session's own subscriptions and packet ids, bounded by the session's limits.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, DefaultHasher};

/// A map of a session's own keys.
pub(super) type SmallMap<K, V> = HashMap<K, V, BuildHasherDefault<DefaultHasher>>;
/// The set counterpart of [`SmallMap`].
pub(super) type SmallSet<K> = HashSet<K, BuildHasherDefault<DefaultHasher>>;
