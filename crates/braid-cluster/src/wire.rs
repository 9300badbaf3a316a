//! What nodes write into each other's inbox streams: messages and the requests and answers of
//! a session handover. An entry is a few fields; a message keeps its encoding from the store.

use std::sync::Arc;

use redis::{Cmd, Value};

use braid_broker::message::{Message, RemoteId};
use braid_broker::router::{Forward, Scope};
use braid_broker::store::codec;
use braid_proto::ByteString;

use crate::redis::bytes;

/// One inbox entry, read.
#[derive(Debug)]
pub(crate) enum Entry {
    /// A message to route to this node's sessions.
    Message {
        /// The message (its publisher's client id and its remote id set).
        msg: Arc<Message>,
        /// Which subscriptions it is for.
        scope: Scope,
    },
    /// Another node claims `client_id`: close its connection here and hand its session over.
    Release { client_id: ByteString, from: String },
    /// The node asked has handed `client_id`'s session over.
    Released { client_id: ByteString },
}

/// XADD of `fwd` to `inbox`, from `incarnation` (`node@start_ms`: with the message's number
/// there, what a receiver recognises a message it got twice by).
pub(crate) fn message_cmd(inbox: &str, incarnation: &str, fwd: &Forward) -> Cmd {
    // A message passed on again keeps the identity it came with.
    let (sender, n) = match &fwd.msg.remote_id {
        Some(id) => (&*id.sender, id.number),
        None => (incarnation, fwd.id),
    };
    let mut scope = vec![u8::from(fwd.scope.plain)];
    for g in &fwd.scope.groups {
        scope.push(0);
        scope.extend_from_slice(g.as_bytes());
    }
    let mut cmd = redis::cmd("XADD");
    cmd.arg(inbox)
        .arg("*")
        .arg("k")
        .arg("m")
        .arg("m")
        .arg(codec::message(&fwd.msg))
        .arg("s")
        .arg(scope)
        .arg("c")
        .arg(&*fwd.msg.origin_client)
        .arg("o")
        .arg(sender)
        .arg("n")
        .arg(n);
    cmd
}

/// XADD of a handover request or answer to `inbox`.
pub(crate) fn control_cmd(inbox: &str, kind: &str, client_id: &str, from: &str) -> Cmd {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(inbox).arg("*").arg("k").arg(kind).arg("c").arg(client_id).arg("f").arg(from);
    cmd
}

/// Reads an entry's fields (alternating names and values).
pub(crate) fn read(fields: &[Value]) -> Result<Entry, String> {
    let get = |name: &[u8]| -> Option<&[u8]> {
        fields.chunks(2).find(|c| c.first().and_then(bytes) == Some(name)).and_then(|c| bytes(c.get(1)?))
    };
    let text = |name: &[u8]| -> Result<String, String> {
        let b = get(name).ok_or_else(|| format!("no {} field", String::from_utf8_lossy(name)))?;
        String::from_utf8(b.to_vec()).map_err(|_| "a field is not UTF-8".to_string())
    };
    match get(b"k") {
        Some(b"m") => {
            let mut msg = codec::read_message(get(b"m").ok_or("no message")?)?;
            let client = text(b"c").unwrap_or_default();
            let n = text(b"n")?.parse().map_err(|_| "bad message number")?;
            if let Some(m) = Arc::get_mut(&mut msg) {
                m.origin_client = ByteString::from(client);
                m.remote_id = Some(RemoteId { sender: text(b"o")?.into(), number: n });
            }
            let s = get(b"s").ok_or("no scope")?;
            let plain = s.first() == Some(&1);
            let groups = s
                .get(1..)
                .unwrap_or_default()
                .split(|b| *b == 0)
                .skip(1)
                .map(|g| String::from_utf8_lossy(g).into())
                .collect();
            Ok(Entry::Message { msg, scope: Scope { plain, groups } })
        }
        Some(b"r") => Ok(Entry::Release { client_id: text(b"c")?.into(), from: text(b"f")? }),
        Some(b"d") => Ok(Entry::Released { client_id: text(b"c")?.into() }),
        _ => Err("unknown entry kind".into()),
    }
}
