//! The broker's side of rules (see [`crate::rules`]): they run on a client's PUBLISH once it
//! is routed, and what they republish is routed as the broker routes its own messages (`$SYS`,
//! wills): no ACL, and no rule runs on it again.

use std::time::Instant;

use super::{Broker, Published};
use crate::message::Message;
use crate::rules::{Publisher, Rules};

impl Broker {
    /// The rules, with their counters.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Runs the rules on `msg`, which a client published at `now`, and routes what they
    /// republish; returns what that routing woke.
    pub(crate) fn apply_rules(&self, msg: &Message, publisher: Publisher<'_>, now: Instant) -> Published {
        let mut out = Published::default();
        self.rules.apply(msg, publisher, self.clock.unix_ms(now) as i64, |p| {
            let mut published =
                self.publish(Message::from_publish(p, now, 0, msg.origin_client.clone()), now);
            out.wakes.append(&mut published.wakes);
        });
        out
    }
}
