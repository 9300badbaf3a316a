//! What a rule is evaluated on, and how a named field is read from it.

use braid_proto::ByteString;
use serde_json::{Map, Value};

use crate::events::Event;

/// A message or client event, borrowed from the broker for one evaluation.
///
/// Build one with struct update syntax: `Context { topic: "t/1", payload: b"{}", ..Context::default() }`.
/// Fields a source does not have are ignored: for [`Event::ClientConnected`] the message fields
/// read as null whatever they hold. For a subscription event `topic` and `qos` are the
/// subscription's. Fields without a member here (`reason`, `keepalive`, `node`, ...) come from
/// [`Context::fields`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Context<'a> {
    /// The source: a publish or one of the client events.
    pub event: Event,
    /// Message id (`id`).
    pub id: Option<&'a str>,
    /// The client the event is about; for a delivery or ack, the receiver (`clientid`).
    pub clientid: &'a str,
    /// The client's user name (`username`).
    pub username: Option<&'a str>,
    /// The client's IP address (`peerhost`).
    pub peerhost: Option<&'a str>,
    /// The message's topic, or the subscription's topic filter (`topic`).
    pub topic: &'a str,
    /// The message's payload (`payload`).
    pub payload: &'a [u8],
    /// QoS of the message or subscription (`qos`).
    pub qos: u8,
    /// The message's retain flag (`retain`, `flags.retain`).
    pub retain: bool,
    /// When the event happened, in milliseconds since the Unix epoch (`timestamp`).
    pub timestamp: i64,
    /// The message's MQTT 5 user properties (`pub_props.'User-Property'.key`).
    pub user_properties: &'a [(ByteString, ByteString)],
    /// Every other field of the source, by name (see [`Event::fields`]).
    pub fields: &'a [(&'a str, Value)],
}

/// A field a rule reads, resolved when the rule is compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    Event,
    Id,
    Clientid,
    Username,
    Peerhost,
    Topic,
    Payload,
    Qos,
    Retain,
    Flags,
    PubProps,
    Timestamp,
    /// A field passed in [`Context::fields`].
    Other(&'static str),
}

impl Field {
    /// The field called `name`, which is one of [`Event::fields`].
    pub(crate) fn named(name: &'static str) -> Field {
        match name {
            "event" => Field::Event,
            "id" => Field::Id,
            "clientid" => Field::Clientid,
            "username" => Field::Username,
            "peerhost" => Field::Peerhost,
            "topic" => Field::Topic,
            "payload" => Field::Payload,
            "qos" => Field::Qos,
            "retain" => Field::Retain,
            "flags" => Field::Flags,
            "pub_props" => Field::PubProps,
            "timestamp" => Field::Timestamp,
            other => Field::Other(other),
        }
    }

    /// The field's value in `ctx`; null when the source does not have it. `payload` is the raw
    /// payload as a string (paths into it are handled by the evaluator).
    pub(crate) fn read(self, ctx: &Context<'_>) -> Value {
        let str_or_null = |s: Option<&str>| s.map_or(Value::Null, |s| Value::String(s.to_owned()));
        let message = ctx.event.carries_message();
        match self {
            Field::Event => Value::String(ctx.event.name().to_owned()),
            Field::Clientid => Value::String(ctx.clientid.to_owned()),
            Field::Username => str_or_null(ctx.username),
            Field::Peerhost => str_or_null(ctx.peerhost),
            Field::Timestamp => Value::from(ctx.timestamp),
            Field::Topic if ctx.event.has_topic() => Value::String(ctx.topic.to_owned()),
            Field::Qos if ctx.event.has_topic() => Value::from(ctx.qos),
            Field::Id if message => str_or_null(ctx.id),
            Field::Payload if message => Value::String(String::from_utf8_lossy(ctx.payload).into_owned()),
            Field::Retain if message => Value::Bool(ctx.retain),
            Field::Flags if message => {
                Value::Object(Map::from_iter([("retain".to_owned(), Value::Bool(ctx.retain))]))
            }
            Field::PubProps if message => {
                let props =
                    ctx.user_properties.iter().map(|(k, v)| (k.to_string(), Value::String(v.to_string())));
                Value::Object(Map::from_iter([("User-Property".to_owned(), Value::Object(props.collect()))]))
            }
            Field::Other(name) => {
                ctx.fields.iter().find(|(n, _)| *n == name).map_or(Value::Null, |(_, v)| v.clone())
            }
            _ => Value::Null,
        }
    }

    /// True when `ctx` has this field: a field of its source, and for other fields, passed in.
    pub(crate) fn present(self, ctx: &Context<'_>) -> bool {
        match self {
            Field::Other(name) => ctx.fields.iter().any(|(n, _)| *n == name),
            _ => true,
        }
    }
}
