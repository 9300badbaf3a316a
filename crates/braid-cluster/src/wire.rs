//! What nodes write into each other's inbox streams: messages and the requests and answers of
//! a session handover. An entry is a few fields. Messages go packed: one entry holds every
//! message a writer's round trip carries to that node (see [`Pack`]), each keeping its
//! encoding from the store.

use std::sync::Arc;

use redis::{Cmd, Value};

use braid_broker::message::{Message, RemoteId};
use braid_broker::router::{Forward, Scope};
use braid_broker::store::{codec, RecordError, UnixClock};
use braid_proto::{ByteString, BytesMut};
use bytes::{Buf, BufMut};

use crate::redis::bytes;

/// An inbox entry or link frame that does not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    /// An entry without a field its kind needs.
    #[error("no {0} field")]
    NoField(&'static str),
    /// An entry's text field that is not UTF-8.
    #[error("a field is not UTF-8")]
    FieldNotUtf8,
    /// A packed messages entry without its messages.
    #[error("no messages")]
    NoMessages,
    /// An entry of a kind this version does not know.
    #[error("unknown entry kind")]
    UnknownKind,
    /// A packed message or field that runs past the end.
    #[error("a packed message is cut short")]
    CutShort,
    /// A packed text field that is not UTF-8.
    #[error("a packed field is not UTF-8")]
    PackedNotUtf8,
    /// A packed message's record that does not read back.
    #[error("{0}")]
    Message(#[from] RecordError),
}

/// One inbox entry, read.
#[derive(Debug)]
pub(crate) enum Entry {
    /// Messages to route to this node's sessions, in the order they were sent.
    Messages(Vec<Incoming>),
    /// Another node claims `client_id` (for a client that starts `clean`): close its
    /// connection here and hand its session over.
    Release { client_id: ByteString, from: String, clean: bool },
    /// The node asked has handed `client_id`'s session over.
    Released { client_id: ByteString },
}

/// A message read from an inbox.
#[derive(Debug)]
pub(crate) struct Incoming {
    /// The message, its publisher's client id and remote id set.
    pub msg: Arc<Message>,
    /// Which subscriptions it is for.
    pub scope: Scope,
    /// Passed on by the node a session moved from (see [`crate::routes::relay_sink`]).
    pub relayed: bool,
}

/// Messages for one inbox, packed into one entry: each is a length-prefixed record of its
/// scope, publisher's client id, sender, number and the message itself. A link frame carries
/// the same records (see [`put_forward`]).
#[derive(Debug, Default)]
pub(crate) struct Pack(Vec<u8>);

impl Pack {
    /// Adds a [`record`].
    pub(crate) fn push(&mut self, record: &[u8]) {
        put(&mut self.0, record);
    }

    /// The packed size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// XADD of the packed messages to `inbox`.
    pub(crate) fn into_cmd(self, inbox: &str) -> Cmd {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(inbox).arg("*").arg("k").arg("p").arg("p").arg(self.0);
        cmd
    }
}

/// `fwd` as a record of a [`Pack`], sent by `incarnation` (`node@start_ms`: with the
/// message's number there, what a receiver recognises a message it got twice by), `relayed`
/// or not. Its expiry is in Unix time, by `clock`.
pub(crate) fn record(incarnation: &str, fwd: &Forward, relayed: bool, clock: &UnixClock) -> Vec<u8> {
    let mut record = BytesMut::with_capacity(fwd.msg.payload.len() + fwd.msg.topic.len() + 64);
    write_record(&mut record, incarnation, fwd, relayed, clock);
    record.into()
}

/// Appends `fwd` to `out` as a [`Pack`] holds it (its [`record`], length first), made in
/// place: a link's task encodes straight into the connection's write buffer.
pub(crate) fn put_forward(out: &mut BytesMut, incarnation: &str, fwd: &Forward, clock: &UnixClock) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    write_record(out, incarnation, fwd, false, clock);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Appends [`record`]'s bytes to `out`.
fn write_record(out: &mut BytesMut, incarnation: &str, fwd: &Forward, relayed: bool, clock: &UnixClock) {
    // A message passed on again keeps the identity it came with.
    let (sender, n) = match &fwd.msg.remote_id {
        Some(id) => (&*id.sender, id.number),
        None => (incarnation, fwd.id),
    };
    out.put_u8(if fwd.scope.plain { PLAIN } else { 0 } | if relayed { RELAYED } else { 0 });
    out.put_u32_le(fwd.scope.groups.len() as u32);
    for g in &fwd.scope.groups {
        put(out, g.as_bytes());
    }
    put(out, fwd.msg.origin_client.as_bytes());
    put(out, sender.as_bytes());
    out.put_u64_le(n);
    codec::put_message(out, &fwd.msg, clock);
}

/// XADD to `inbox` of a request to hand `client_id`'s session over to `from`, for a client
/// that starts `clean`.
pub(crate) fn release_cmd(inbox: &str, client_id: &str, from: &str, clean: bool) -> Cmd {
    let mut cmd = control_cmd(inbox, "r", client_id, from);
    cmd.arg("s").arg(u8::from(clean));
    cmd
}

/// XADD to `inbox` of the answer that `client_id`'s session was handed over by `from`.
pub(crate) fn released_cmd(inbox: &str, client_id: &str, from: &str) -> Cmd {
    control_cmd(inbox, "d", client_id, from)
}

fn control_cmd(inbox: &str, kind: &str, client_id: &str, from: &str) -> Cmd {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(inbox).arg("*").arg("k").arg(kind).arg("c").arg(client_id).arg("f").arg(from);
    cmd
}

/// Reads an entry's fields (alternating names and values), converting expiries by `clock`.
pub(crate) fn read(fields: &[Value], clock: &UnixClock) -> Result<Entry, WireError> {
    let get = |name: &str| -> Option<&[u8]> {
        fields
            .chunks(2)
            .find(|c| c.first().and_then(bytes) == Some(name.as_bytes()))
            .and_then(|c| bytes(c.get(1)?))
    };
    let text = |name: &'static str| -> Result<String, WireError> {
        let b = get(name).ok_or(WireError::NoField(name))?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::FieldNotUtf8)
    };
    match get("k") {
        Some(b"p") => {
            unpack(BytesMut::from(get("p").ok_or(WireError::NoMessages)?), clock).map(Entry::Messages)
        }
        Some(b"r") => Ok(Entry::Release {
            client_id: text("c")?.into(),
            from: text("f")?,
            clean: get("s") == Some(b"1"),
        }),
        Some(b"d") => Ok(Entry::Released { client_id: text("c")?.into() }),
        _ => Err(WireError::UnknownKind),
    }
}

/// In a record's first byte: a plain subscription matched.
const PLAIN: u8 = 1;
/// In a record's first byte: passed on by a relay.
const RELAYED: u8 = 2;

/// The messages of a [`Pack`] (their expiries converted by `clock`). Each message's topic,
/// payload and publisher's client id are taken out of `packed` without a copy.
pub(crate) fn unpack(mut packed: BytesMut, clock: &UnixClock) -> Result<Vec<Incoming>, WireError> {
    let mut out = Vec::new();
    // The sender of the record before: a frame's records mostly share theirs.
    let mut last_sender: Option<Arc<str>> = None;
    while !packed.is_empty() {
        let len = u32::from_le_bytes(take_n(&mut &packed[..])?) as usize;
        if packed.len() - 4 < len {
            return Err(WireError::CutShort);
        }
        packed.advance(4);
        let mut record = packed.split_to(len);
        let mut r = &record[..];
        let flags = take_n::<1>(&mut r)?[0];
        let groups = u32::from_le_bytes(take_n(&mut r)?);
        let groups = (0..groups)
            .map(|_| Ok(String::from_utf8_lossy(take(&mut r)?).into()))
            .collect::<Result<_, WireError>>()?;
        let client_at = record.len() - r.len() + 4;
        let client_len = take(&mut r)?.len();
        let sender = match (std::str::from_utf8(take(&mut r)?), &last_sender) {
            (Err(_), _) => return Err(WireError::PackedNotUtf8),
            (Ok(s), Some(last)) if **last == *s => last.clone(),
            (Ok(s), _) => Arc::from(s),
        };
        last_sender = Some(sender.clone());
        let number = u64::from_le_bytes(take_n(&mut r)?);
        let head = record.split_to(record.len() - r.len()).freeze();
        let client = ByteString::try_from(head.slice(client_at..client_at + client_len))
            .map_err(|_| WireError::PackedNotUtf8)?;
        let mut msg = codec::read_message(record, clock)?;
        if let Some(m) = Arc::get_mut(&mut msg) {
            m.origin_client = client;
            m.remote_id = Some(RemoteId { sender, number });
        }
        let scope = Scope { plain: flags & PLAIN != 0, groups };
        out.push(Incoming { msg, scope, relayed: flags & RELAYED != 0 });
    }
    Ok(out)
}

/// Appends `b`, prefixed by its length.
pub(crate) fn put(out: &mut impl BufMut, b: &[u8]) {
    out.put_u32_le(b.len() as u32);
    out.put_slice(b);
}

/// Takes what [`put`] wrote from the front of `input`.
pub(crate) fn take<'a>(input: &mut &'a [u8]) -> Result<&'a [u8], WireError> {
    let len = u32::from_le_bytes(take_n(input)?) as usize;
    if input.len() < len {
        return Err(WireError::CutShort);
    }
    let (b, rest) = input.split_at(len);
    *input = rest;
    Ok(b)
}

/// Takes what [`put`] wrote from the front of `input`, as UTF-8 text.
pub(crate) fn take_text(input: &mut &[u8]) -> Result<String, WireError> {
    String::from_utf8(take(input)?.to_vec()).map_err(|_| WireError::PackedNotUtf8)
}

/// Takes `N` bytes from the front of `input`.
pub(crate) fn take_n<const N: usize>(input: &mut &[u8]) -> Result<[u8; N], WireError> {
    let (head, rest) = input.split_first_chunk::<N>().ok_or(WireError::CutShort)?;
    *input = rest;
    Ok(*head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::{Properties, QoS};

    fn message(payload: Vec<u8>) -> Message {
        Message {
            topic: "a/b".into(),
            payload: payload.into(),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: Properties::default(),
            expires_at: None,
            origin: 7,
            origin_client: "pub".into(),
            remote_id: None,
        }
    }

    #[test]
    fn a_pack_reads_back_in_order_with_identity_and_scope() {
        let clock = UnixClock::read();
        let mut pack = Pack::default();
        for (i, plain) in [(1u64, true), (2, false)] {
            let msg = message(vec![i as u8; 3]);
            let scope = Scope { plain, groups: if plain { vec![] } else { vec!["g1".into(), "g2".into()] } };
            pack.push(&record("n1@5", &Forward { msg: Arc::new(msg), scope, id: i }, i == 2, &clock));
        }
        let mut fields = vec![];
        for arg in pack.into_cmd("inbox").args_iter().skip(3) {
            if let redis::Arg::Simple(b) = arg {
                fields.push(Value::BulkString(b.to_vec()));
            }
        }
        let Entry::Messages(got) = read(&fields, &clock).unwrap() else { panic!("not messages") };
        assert_eq!(got.len(), 2);
        assert_eq!(&got[0].msg.payload[..], &[1, 1, 1]);
        assert!(got[0].scope.plain && got[0].scope.groups.is_empty() && !got[0].relayed);
        assert_eq!(got[1].scope.groups, vec![Box::from("g1"), Box::from("g2")]);
        assert!(!got[1].scope.plain && got[1].relayed);
        let id = got[1].msg.remote_id.clone().unwrap();
        assert_eq!((&*id.sender, id.number, &*got[1].msg.origin_client), ("n1@5", 2, "pub"));
    }

    #[test]
    fn each_message_of_a_frame_keeps_its_own_sender_and_publisher() {
        let clock = UnixClock::read();
        let mut frame = BytesMut::new();
        let senders = [("n1@5", "a"), ("n1@5", "b"), ("n3@9", "c"), ("n1@5", "d")];
        for (i, (sender, client)) in senders.iter().enumerate() {
            let mut msg = message(vec![i as u8; 2]);
            msg.origin_client = (*client).into();
            msg.remote_id = (*sender != "n1@5").then(|| RemoteId { sender: (*sender).into(), number: 40 });
            let fwd =
                Forward { msg: Arc::new(msg), scope: Scope { plain: true, groups: vec![] }, id: i as u64 };
            put_forward(&mut frame, "n1@5", &fwd, &clock);
        }
        let got = unpack(frame, &clock).unwrap();
        let read: Vec<(String, u64, String, u8)> = got
            .iter()
            .map(|m| {
                let id = m.msg.remote_id.clone().unwrap();
                (id.sender.to_string(), id.number, m.msg.origin_client.to_string(), m.msg.payload[0])
            })
            .collect();
        let want = [("n1@5", 0, "a", 0), ("n1@5", 1, "b", 1), ("n3@9", 40, "c", 2), ("n1@5", 3, "d", 3)];
        let want: Vec<_> = want.iter().map(|(s, n, c, p)| (s.to_string(), *n, c.to_string(), *p)).collect();
        assert_eq!(read, want);
    }

    #[test]
    fn a_record_made_in_place_is_the_record() {
        let fwd = Forward {
            msg: Arc::new(message(vec![5; 7])),
            scope: Scope { plain: true, groups: vec![] },
            id: 3,
        };
        let (mut pushed, mut made, clock) = (Pack::default(), BytesMut::new(), UnixClock::read());
        pushed.push(&record("n1@5", &fwd, false, &clock));
        put_forward(&mut made, "n1@5", &fwd, &clock);
        assert_eq!(&made[..], &pushed.0[..]);
    }

    #[test]
    fn a_cut_pack_is_an_error_not_a_panic() {
        let mut pack = Pack::default();
        let msg = message(vec![0; 10]);
        let fwd = Forward { msg: Arc::new(msg), scope: Scope { plain: true, groups: vec![] }, id: 1 };
        let clock = UnixClock::read();
        pack.push(&record("n1@5", &fwd, false, &clock));
        let whole = pack.0.clone();
        for cut in [1, 5, whole.len() - 1] {
            assert!(unpack(BytesMut::from(&whole[..cut]), &clock).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_message_that_does_not_read_keeps_the_record_error() {
        let fwd = Forward {
            msg: Arc::new(message(vec![1; 4])),
            scope: Scope { plain: true, groups: vec![] },
            id: 1,
        };
        let clock = UnixClock::read();
        let mut bad = record("n1@5", &fwd, false, &clock);
        // The message's record ends 4 bytes early: its packet's length runs past it.
        bad.truncate(bad.len() - 4);
        let mut pack = Pack::default();
        pack.push(&bad);
        let err = unpack(BytesMut::from(&pack.0[..]), &clock).unwrap_err();
        assert!(matches!(err, WireError::Message(RecordError::TooShort)), "{err:?}");
        let source = std::error::Error::source(&err).and_then(|e| e.downcast_ref::<RecordError>());
        assert!(source.is_some(), "{err:?}");
        assert_eq!(err.to_string(), "record body too short");
    }
}
