//! The disk store's record format. A record is `[len u32][crc32 u32][kind u8][body]` (little
//! endian; `len` counts kind and body, the CRC covers them). Messages, wills and subscriptions
//! are stored as MQTT 5 packets, so the codec that reads them off the wire reads them back.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use braid_proto::{
    decode, encode, encode_publish, ByteString, BytesMut, Connect, LastWill, Packet, Properties,
    ProtocolVersion, PublishView, QoS, Subscribe,
};

use super::backend::{SessionRecord, Stage, SubscriptionRecord};
use super::record_error::RecordError;
use crate::message::{Delivery, Message};

/// Bytes before a record's kind: length and CRC.
pub(super) const FRAME_HEADER: usize = 8;

/// Record kinds.
pub(super) mod kind {
    /// Session metadata.
    pub(crate) const SESSION: u8 = 1;
    /// Session ended.
    pub(crate) const END_SESSION: u8 = 2;
    /// Delivery queued.
    pub(crate) const APPEND: u8 = 3;
    /// Delivery stage changed.
    pub(crate) const STAGE: u8 = 4;
    /// Delivery finished.
    pub(crate) const DONE: u8 = 5;
    /// Inbound QoS 2 id received or released.
    pub(crate) const QOS2: u8 = 6;
    /// Retained message set or cleared.
    pub(crate) const RETAIN: u8 = 7;
}

/// Appends one framed record to `out`; returns its length.
pub(super) fn frame(out: &mut Vec<u8>, kind: u8, body: &[u8]) -> usize {
    let len = 1 + body.len();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    crc.update(body);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
    FRAME_HEADER + len
}

/// A record read back: kind, body and total length on disk.
pub(super) type Frame<'a> = (u8, &'a [u8], usize);

/// Splits the record at the start of `buf`: `Ok(Some((kind, body, total length)))`,
/// `Ok(None)` at the end, `Err` for a truncated or damaged record.
pub(super) fn unframe(buf: &[u8]) -> Result<Option<Frame<'_>>, RecordError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf.len() < FRAME_HEADER + 1 {
        return Err(RecordError::TruncatedHeader { len: buf.len() });
    }
    let len = u32::from_le_bytes(buf[..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(buf[4..8].try_into().unwrap_or_default());
    if len == 0 || buf.len() < FRAME_HEADER + len {
        return Err(RecordError::Truncated { needs: len, left: buf.len() - FRAME_HEADER });
    }
    let data = &buf[FRAME_HEADER..FRAME_HEADER + len];
    if crc32fast::hash(data) != crc {
        return Err(RecordError::Checksum);
    }
    Ok(Some((data[0], &data[1..], FRAME_HEADER + len)))
}

/// Reads little-endian fields off a record body.
pub(super) struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        if self.0.len() < n {
            return Err(RecordError::TooShort);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    /// A u64.
    pub(super) fn u64(&mut self) -> Result<u64, RecordError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap_or_default()))
    }
    /// A u32.
    pub(super) fn u32(&mut self) -> Result<u32, RecordError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap_or_default()))
    }
    /// A u16.
    pub(super) fn u16(&mut self) -> Result<u16, RecordError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap_or_default()))
    }
    /// A byte.
    pub(super) fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    /// A u32-length-prefixed blob.
    fn blob(&mut self) -> Result<&'a [u8], RecordError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

fn put_blob(out: &mut Vec<u8>, packet: &Packet) {
    let mut buf = BytesMut::new();
    // Packets built here from accepted state always encode.
    let _ = encode(packet, ProtocolVersion::V5, &mut buf);
    out.extend_from_slice(&(buf.len() as u32).to_le_bytes());
    out.extend_from_slice(&buf);
}

/// Appends `msg` as a blob, its PUBLISH encoded in place.
fn put_message(out: &mut BytesMut, msg: &Message) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    let view = PublishView {
        dup: false,
        qos: msg.qos,
        retain: msg.retain,
        topic: &msg.topic,
        packet_id: u16::from(msg.qos != QoS::AtMostOnce),
        properties: &msg.properties,
        payload: &msg.payload,
    };
    // Packets built here from accepted state always encode.
    let _ = encode_publish(&view, ProtocolVersion::V5, out);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

fn get_packet(blob: &[u8]) -> Result<Packet, RecordError> {
    get_packet_from(BytesMut::from(blob))
}

/// The packet of a blob, its payload taken out of `buf` without a copy.
fn get_packet_from(mut buf: BytesMut) -> Result<Packet, RecordError> {
    match decode(&mut buf, ProtocolVersion::V5, u32::MAX) {
        Ok(Some(p)) => Ok(p),
        Ok(None) => Err(RecordError::IncompletePacket),
        Err(e) => Err(RecordError::BadPacket(e)),
    }
}

/// The Unix time of one reading of the monotonic clock: converts the [`Instant`]s the broker
/// works in to the Unix times records keep, and back, without reading a clock itself. Whoever
/// owns the I/O edge reads it once ([`UnixClock::read`]: the broker at its start, passing it
/// to the store it opens) and hands it to every conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnixClock {
    at: Instant,
    unix: Duration,
}

impl UnixClock {
    /// The clock by which `at` is `unix` after the Unix epoch.
    pub fn new(at: Instant, unix: Duration) -> UnixClock {
        UnixClock { at, unix }
    }

    /// Reads both clocks now.
    pub fn read() -> UnixClock {
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        UnixClock { at: Instant::now(), unix }
    }

    /// The instant of the reading.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// Time since the Unix epoch at `at`.
    pub fn unix(&self, at: Instant) -> Duration {
        match at.checked_duration_since(self.at) {
            Some(after) => self.unix + after,
            None => self.unix.saturating_sub(self.at.duration_since(at)),
        }
    }

    /// Whole seconds since the Unix epoch at `at`.
    pub fn unix_secs(&self, at: Instant) -> u64 {
        self.unix(at).as_secs()
    }

    /// Milliseconds since the Unix epoch at `at` (at least 1, as records keep 0 for none).
    pub fn unix_ms(&self, at: Instant) -> u64 {
        (self.unix(at).as_millis() as u64).max(1)
    }

    /// The instant `ms` milliseconds after the Unix epoch (the reading's instant if that is
    /// before the earliest instant there is).
    pub fn instant(&self, ms: u64) -> Instant {
        let unix = Duration::from_millis(ms);
        match unix.checked_sub(self.unix) {
            Some(after) => self.at + after,
            None => self.at.checked_sub(self.unix - unix).unwrap_or(self.at),
        }
    }
}

/// Unix milliseconds of `at` (0 for none).
fn unix_ms(at: Option<Instant>, clock: &UnixClock) -> u64 {
    at.map_or(0, |at| clock.unix_ms(at))
}

/// The instant of unix milliseconds `ms` (0 for none).
fn instant_of(ms: u64, clock: &UnixClock) -> Option<Instant> {
    (ms != 0).then(|| clock.instant(ms))
}

fn message_from(blob: BytesMut, expires_ms: u64, clock: &UnixClock) -> Result<Arc<Message>, RecordError> {
    let Packet::Publish(p) = get_packet_from(blob)? else {
        return Err(RecordError::WrongPacket { record: "record", packet: "PUBLISH" });
    };
    Ok(Arc::new(Message {
        topic: p.topic,
        payload: p.payload,
        qos: p.qos,
        retain: p.retain,
        properties: p.properties,
        expires_at: instant_of(expires_ms, clock),
        origin: 0,
        origin_client: ByteString::new(),
        remote_id: None,
    }))
}

/// Body of a SESSION record.
pub(super) fn session(r: &SessionRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&r.id.to_le_bytes());
    out.extend_from_slice(&r.offline_since.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&r.expiry_secs.to_le_bytes());
    let connect = Connect {
        protocol: ProtocolVersion::V5,
        clean_start: false,
        keep_alive: 0,
        properties: Properties::default(),
        client_id: r.client_id.clone(),
        will: r.will.clone(),
        username: None,
        password: None,
    };
    put_blob(&mut out, &Packet::Connect(Box::new(connect)));
    out.extend_from_slice(&(r.subscriptions.len() as u32).to_le_bytes());
    for (filter, s) in &r.subscriptions {
        let mut properties = Properties::default();
        if let Some(id) = s.sub_id {
            properties.subscription_identifiers.push(id);
        }
        let sub = Subscribe { packet_id: 1, properties, filters: vec![(filter.clone(), s.options)] };
        put_blob(&mut out, &Packet::Subscribe(sub));
    }
    out
}

/// Reads a SESSION record body. Its strings are copies of their own: slices would keep each
/// packet's decode buffer for as long as the restored session lasts.
pub(super) fn read_session(body: &[u8]) -> Result<SessionRecord, RecordError> {
    let mut r = Reader(body);
    let id = r.u64()?;
    let offline_since = Some(r.u64()?).filter(|t| *t != 0);
    let expiry_secs = r.u32()?;
    let Packet::Connect(c) = get_packet(r.blob()?)? else {
        return Err(RecordError::WrongPacket { record: "session record", packet: "CONNECT" });
    };
    let n = r.u32()?;
    // Each takes at least its 4-byte length: a damaged count allocates no more than the body holds.
    let mut subscriptions = Vec::with_capacity((n as usize).min(r.0.len() / 4));
    for _ in 0..n {
        let Packet::Subscribe(s) = get_packet(r.blob()?)? else {
            return Err(RecordError::WrongPacket { record: "session record", packet: "SUBSCRIBE" });
        };
        let sub_id = s.properties.subscription_identifiers.first().copied();
        for (filter, options) in s.filters {
            subscriptions.push((ByteString::from(&*filter), SubscriptionRecord { options, sub_id }));
        }
    }
    let (client_id, will) = (ByteString::from(&*c.client_id), c.will.as_ref().map(LastWill::detached));
    Ok(SessionRecord { id, client_id, expiry_secs, will, subscriptions, offline_since })
}

/// Set in an APPEND record's QoS byte when the delivery came through a shared group, whose
/// name follows the RETAIN byte (records written before it was added read as they did).
const SHARED: u8 = 0x80;

/// Body of an APPEND record. The first Subscription Identifier (0: none) precedes the message,
/// any further ones (a merged delivery's) follow it, where older records end. The message's
/// expiry is kept in Unix time, by `clock`.
pub(super) fn append(session: u64, seq: u64, d: &Delivery, clock: &UnixClock) -> Vec<u8> {
    let mut out = BytesMut::with_capacity(64 + d.msg.topic.len() + d.msg.payload.len());
    out.extend_from_slice(&session.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&[d.qos as u8 | if d.group.is_some() { SHARED } else { 0 }]);
    out.extend_from_slice(&[u8::from(d.retain)]);
    if let Some(group) = &d.group {
        out.extend_from_slice(&(group.len() as u32).to_le_bytes());
        out.extend_from_slice(group.as_bytes());
    }
    let ids = d.sub_ids.as_slice();
    out.extend_from_slice(&ids.first().copied().unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&unix_ms(d.msg.expires_at, clock).to_le_bytes());
    put_message(&mut out, &d.msg);
    for id in ids.iter().skip(1) {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.into()
}

/// Session and sequence number at the start of an APPEND, STAGE or DONE body.
pub(super) fn session_seq(body: &[u8]) -> Result<(u64, u64), RecordError> {
    let mut r = Reader(body);
    Ok((r.u64()?, r.u64()?))
}

/// Reads an APPEND record body (its expiry converted by `clock`).
pub(super) fn read_append(body: &[u8], clock: &UnixClock) -> Result<(u64, Delivery), RecordError> {
    let mut r = Reader(body);
    let (_session, seq) = (r.u64()?, r.u64()?);
    let flags = r.u8()?;
    let qos = QoS::from_u8(flags & !SHARED).ok_or(RecordError::BadQos(flags & !SHARED))?;
    let retain = r.u8()? != 0;
    let group = match flags & SHARED {
        0 => None,
        _ => Some(std::str::from_utf8(r.blob()?).map_err(RecordError::BadGroupName)?.into()),
    };
    let first = r.u32()?;
    let expires = r.u64()?;
    let msg = message_from(BytesMut::from(r.blob()?), expires, clock)?;
    let sub_ids = std::iter::once(first).chain(std::iter::from_fn(|| r.u32().ok())).collect();
    Ok((seq, Delivery { msg, qos, retain, sub_ids, seq, stream: Default::default(), group }))
}

/// Body of a STAGE record.
pub(super) fn stage(session: u64, seq: u64, stage: Stage) -> Vec<u8> {
    let mut out = ids(session, seq);
    out.push(match stage {
        Stage::Queued => 0,
        Stage::Sent => 1,
        Stage::Released => 2,
    });
    out
}

/// The stage in a STAGE record body.
pub(super) fn read_stage(body: &[u8]) -> Result<Stage, RecordError> {
    match body.get(16) {
        Some(0) => Ok(Stage::Queued),
        Some(1) => Ok(Stage::Sent),
        Some(2) => Ok(Stage::Released),
        _ => Err(RecordError::BadStage),
    }
}

/// Body of a DONE record (and the prefix of others): session and sequence number.
pub(super) fn ids(session: u64, seq: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(17);
    out.extend_from_slice(&session.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out
}

/// Body of a QOS2 record.
pub(super) fn qos2(session: u64, packet_id: u16, pending: bool) -> Vec<u8> {
    let mut out = session.to_le_bytes().to_vec();
    out.extend_from_slice(&packet_id.to_le_bytes());
    out.push(u8::from(pending));
    out
}

/// Reads a QOS2 record body.
pub(super) fn read_qos2(body: &[u8]) -> Result<(u64, u16, bool), RecordError> {
    let mut r = Reader(body);
    Ok((r.u64()?, r.u16()?, r.u8()? != 0))
}

/// Body of a RETAIN record (its expiry in Unix time, by `clock`).
pub(super) fn retain(msg: &Message, clock: &UnixClock) -> Vec<u8> {
    let mut out = BytesMut::with_capacity(32 + msg.topic.len() + msg.payload.len());
    put_retain(&mut out, msg, clock);
    out.into()
}

/// Appends [`retain`]'s body to `out`.
pub(super) fn put_retain(out: &mut BytesMut, msg: &Message, clock: &UnixClock) {
    out.extend_from_slice(&unix_ms(msg.expires_at, clock).to_le_bytes());
    put_message(out, msg);
}

/// Reads a RETAIN record body (its expiry converted by `clock`).
pub(super) fn read_retain(body: &[u8], clock: &UnixClock) -> Result<Arc<Message>, RecordError> {
    read_retain_from(BytesMut::from(body), clock)
}

/// Reads a RETAIN record body, its payload taken out of `body` without a copy.
pub(super) fn read_retain_from(mut body: BytesMut, clock: &UnixClock) -> Result<Arc<Message>, RecordError> {
    let (expires, len) = {
        let mut r = Reader(&body);
        let expires = r.u64()?;
        (expires, r.blob()?.len())
    };
    let _ = body.split_to(12);
    body.truncate(len);
    message_from(body, expires, clock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::{ByteString, Bytes};

    #[test]
    fn an_append_keeps_the_shared_group_it_came_through() {
        let msg = Message::internal(ByteString::from_static("a/b"), Bytes::from_static(b"x"), false);
        let mut d = Delivery {
            retain: true,
            sub_ids: [3, 5].into_iter().collect(),
            group: Some("g1".into()),
            ..Delivery::of(msg, QoS::AtLeastOnce)
        };
        let clock = UnixClock::read();
        let (seq, back) = read_append(&append(1, 9, &d, &clock), &clock).unwrap();
        assert_eq!(
            (seq, back.qos, back.retain, back.group.as_deref()),
            (9, QoS::AtLeastOnce, true, Some("g1"))
        );
        assert_eq!(back.sub_ids.as_slice(), &[3, 5]);
        d.group = None;
        let (_, back) = read_append(&append(1, 9, &d, &clock), &clock).unwrap();
        assert_eq!((back.qos, back.group), (QoS::AtLeastOnce, None));
        assert_eq!(back.sub_ids.as_slice(), &[3, 5]);
    }

    #[test]
    fn a_damaged_subscription_count_is_an_error_not_an_allocation() {
        let r = SessionRecord {
            id: 1,
            client_id: ByteString::from_static("c"),
            expiry_secs: 0,
            will: None,
            subscriptions: Vec::new(),
            offline_since: None,
        };
        let mut body = session(&r);
        let at = body.len() - 4;
        body[at..].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = read_session(&body).unwrap_err();
        assert!(matches!(err, RecordError::TooShort), "{err:?}");
        assert_eq!(err.to_string(), "record body too short");
    }

    #[test]
    fn the_clock_converts_without_reading_the_time() {
        let at = Instant::now();
        let clock = UnixClock::new(at, Duration::from_millis(1_795_731_530_250));
        assert_eq!(clock.unix_ms(at), 1_795_731_530_250);
        assert_eq!(clock.unix_secs(at + Duration::from_millis(750)), 1_795_731_531);
        assert_eq!(clock.unix_ms(at + Duration::from_secs(60)), 1_795_731_590_250);
        assert_eq!(clock.instant(1_795_731_590_250), at + Duration::from_secs(60));
        if let Some(before) = at.checked_sub(Duration::from_millis(250)) {
            assert_eq!(clock.unix_ms(before), 1_795_731_530_000);
            assert_eq!(clock.instant(1_795_731_530_000), before);
        }
        // A message's expiry goes through the record in Unix time and back.
        let msg = Message {
            expires_at: Some(at + Duration::from_secs(30)),
            ..(*Message::internal(ByteString::from_static("a/b"), Bytes::from_static(b"x"), true)).clone()
        };
        let body = retain(&msg, &clock);
        assert_eq!(body[..8], 1_795_731_560_250u64.to_le_bytes());
        assert_eq!(read_retain(&body, &clock).unwrap().expires_at, msg.expires_at);
        let later = UnixClock::new(at, Duration::from_millis(1_795_731_540_250));
        assert_eq!(read_retain(&body, &later).unwrap().expires_at, Some(at + Duration::from_secs(20)));
    }
}
