//! Presence (`sys.presence`): a client's connect and disconnect announced on
//! `$SYS/brokers/{node}/clients/{clientid}/connected` and `.../disconnected`, with EMQX's topics
//! and JSON fields, so that what watched EMQX's works unchanged. Off by default; who may read
//! them is the ACL's `$SYS` rule, as for every `$SYS` topic.

use std::time::Instant;

use serde_json::{Map, Value};

use super::rules::Who;
use super::Broker;
use crate::message::Message;
use crate::transport_kind::Transport;

impl Broker {
    /// Publishes `client_id`'s presence `what` (`connected` or `disconnected`) at `now`: the
    /// fields every presence message has, then `fields`.
    pub(super) fn announce_presence(
        &self,
        client_id: &str,
        who: &Who,
        what: &str,
        fields: &[(&str, Value)],
        now: Instant,
    ) {
        // A client id with a wildcard (or NUL) makes no topic name; in-process clients (the
        // node's own bridges and sinks) come through no listener and are not announced.
        if client_id.contains(['+', '#', '\0']) || who.transport.is_none() {
            return;
        }
        let mut body = Map::new();
        body.insert("clientid".into(), client_id.into());
        body.insert("username".into(), who.username.as_deref().map_or(Value::Null, Value::from));
        body.insert("ipaddress".into(), who.peer.ip().to_string().into());
        body.insert("sockport".into(), self.listener_port(who.transport).into());
        body.insert("proto_name".into(), who.proto_name().into());
        body.insert("proto_ver".into(), (who.version as u8).into());
        body.insert("ts".into(), (self.clock.unix_ms(now) as i64).into());
        for (key, value) in fields {
            body.insert((*key).into(), value.clone());
        }
        let node = match &self.config.cluster {
            c if c.enabled => c.node.as_str(),
            _ => "braid",
        };
        let topic = format!("$SYS/brokers/{node}/clients/{client_id}/{what}");
        let payload = Value::Object(body).to_string();
        // Routed like any message; its subscribers are woken as the result drops.
        let _ = self.publish(Message::internal(topic.into(), payload.into(), false), now);
    }

    /// The port of the listener a client came through, as configured.
    fn listener_port(&self, transport: Option<Transport>) -> u16 {
        let l = &self.config.listeners;
        let addr = match transport {
            Some(Transport::Tcp) => Some(l.tcp),
            Some(Transport::Tls) => l.tls,
            Some(Transport::Ws) => l.ws,
            Some(Transport::Wss) => l.wss,
            Some(Transport::Quic) => Some(l.quic),
            None => None,
        };
        addr.map_or(0, |a| a.port())
    }
}
