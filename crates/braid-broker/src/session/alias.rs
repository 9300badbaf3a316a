//! Server-assigned topic aliases for deliveries to a v5 client (per connection).

use std::collections::HashMap;

use braid_proto::ByteString;

/// Topic aliases this connection has told its client about.
#[derive(Debug, Default)]
pub struct OutboundAliases {
    max: u16,
    /// Made at the first alias: most clients never get one (8 bytes in every session instead
    /// of an empty map's 48).
    #[allow(clippy::box_collection)]
    assigned: Option<Box<HashMap<ByteString, u16>>>,
}

/// How to send a topic on this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AliasUse {
    /// No alias: send the topic.
    None,
    /// A new alias: send the topic and the alias.
    Define(u16),
    /// A known alias: send an empty topic and the alias.
    Reuse(u16),
}

impl OutboundAliases {
    /// Aliases for a client that accepts up to `max` (its Topic Alias Maximum).
    pub fn new(max: u16) -> OutboundAliases {
        OutboundAliases { max, assigned: None }
    }

    /// The alias to use for `topic`, defining a new one while the client's maximum allows.
    pub fn lookup(&mut self, topic: &ByteString) -> AliasUse {
        if self.max == 0 {
            return AliasUse::None;
        }
        let assigned = self.assigned.get_or_insert_with(Default::default);
        if let Some(&alias) = assigned.get(topic) {
            return AliasUse::Reuse(alias);
        }
        if assigned.len() >= usize::from(self.max) {
            return AliasUse::None;
        }
        let alias = assigned.len() as u16 + 1;
        assigned.insert(topic.clone(), alias);
        AliasUse::Define(alias)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defines_once_then_reuses_until_the_maximum() {
        let mut a = OutboundAliases::new(1);
        let t = ByteString::from_static("a/b");
        assert_eq!(a.lookup(&t), AliasUse::Define(1));
        assert_eq!(a.lookup(&t), AliasUse::Reuse(1));
        assert_eq!(a.lookup(&ByteString::from_static("c")), AliasUse::None);
        assert_eq!(OutboundAliases::new(0).lookup(&t), AliasUse::None);
    }
}
