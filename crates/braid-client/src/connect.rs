//! Opening a connection: transport, CONNECT, CONNACK.

use braid_proto::{
    decode, encode, BytesMut, ConnAck, Connect, LastWill, Packet, Properties, ProtocolVersion,
};
use tokio::io::AsyncWriteExt;

use crate::transport::{self, ReadHalf, WriteHalf};
use crate::{ClientOptions, Error};
use braid_proto::ReadBuffer;

/// Largest packet MQTT can express (fixed header included), our limit when none is set.
const MQTT_MAX_PACKET: u32 = 268_435_455 + 5;

/// An established connection, CONNACK received.
#[derive(Debug)]
pub(crate) struct Link {
    pub rd: ReadHalf,
    pub wr: WriteHalf,
    /// Bytes already read after the CONNACK.
    pub rbuf: ReadBuffer,
    /// The QUIC connection, for opening data streams.
    pub quic: Option<quinn::Connection>,
}

/// What we announced in CONNECT and therefore enforce.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Announced {
    /// Maximum Packet Size for decoding.
    pub max_packet_size: u32,
    /// Topic Alias Maximum.
    pub topic_alias_maximum: u16,
}

/// The CONNECT properties: `connect_properties` with the dedicated options laid over it.
fn connect_properties(opts: &ClientOptions) -> Properties {
    let mut p = opts.connect_properties.clone();
    if let Some(e) = opts.session_expiry {
        p.session_expiry_interval = Some(e);
    }
    if opts.receive_maximum != u16::MAX {
        p.receive_maximum = Some(opts.receive_maximum.max(1));
    }
    if let Some(max) = opts.max_packet_size {
        p.maximum_packet_size = Some(max.max(1));
    }
    if opts.topic_alias_maximum > 0 {
        p.topic_alias_maximum = Some(opts.topic_alias_maximum);
    }
    p
}

/// The limits the CONNECT built from `opts` announces.
pub(crate) fn announced(opts: &ClientOptions) -> Announced {
    if !opts.version.is_v5() {
        return Announced { max_packet_size: MQTT_MAX_PACKET, topic_alias_maximum: 0 };
    }
    let p = connect_properties(opts);
    Announced {
        max_packet_size: p.maximum_packet_size.unwrap_or(MQTT_MAX_PACKET),
        topic_alias_maximum: p.topic_alias_maximum.unwrap_or(0),
    }
}

fn connect_packet(opts: &ClientOptions, client_id: &str, clean_start: bool) -> Connect {
    let v5 = opts.version.is_v5();
    let will = opts.will.as_ref().map(|w| LastWill {
        topic: w.topic.as_str().into(),
        payload: w.payload.clone(),
        qos: w.qos,
        retain: w.retain,
        properties: if v5 { w.properties.clone() } else { Properties::default() },
    });
    Connect {
        protocol: opts.version,
        clean_start,
        keep_alive: opts.keep_alive,
        properties: if v5 { connect_properties(opts) } else { Properties::default() },
        client_id: client_id.into(),
        will,
        username: opts.username.as_deref().map(Into::into),
        password: opts.password.clone(),
    }
}

/// Opens the transport, sends CONNECT and waits for CONNACK (no timeout here; the caller
/// bounds it). A refusing CONNACK is [`Error::Refused`].
pub(crate) async fn handshake(
    opts: &ClientOptions,
    client_id: &str,
    clean_start: bool,
) -> Result<(Link, ConnAck), Error> {
    let (mut rd, mut wr, mut quic) = transport::open(opts).await?;
    let mut connect = BytesMut::new();
    let packet = Packet::Connect(Box::new(connect_packet(opts, client_id, clean_start)));
    encode(&packet, opts.version, &mut connect)
        .map_err(|e| Error::Protocol(format!("cannot encode CONNECT: {e}")))?;
    let mut exchanged = exchange(&mut rd, &mut wr, &connect, opts).await;
    if let (Err(Error::Io(_)), Some(q)) = (&exchanged, quic.as_mut()) {
        if let Some((send, recv)) = q.reopen_after_rejected_0rtt().await {
            (rd, wr) = (ReadHalf::Quic(recv), WriteHalf::Quic(send));
            exchanged = exchange(&mut rd, &mut wr, &connect, opts).await;
        }
    }
    let (rbuf, ack) = exchanged?;
    Ok((Link { rd, wr, rbuf, quic: quic.map(|q| q.connection) }, ack))
}

/// Sends `connect` and waits for CONNACK; returns it with the bytes read after it.
async fn exchange(
    rd: &mut ReadHalf,
    wr: &mut WriteHalf,
    connect: &[u8],
    opts: &ClientOptions,
) -> Result<(ReadBuffer, ConnAck), Error> {
    wr.write_all(connect).await?;
    let version: ProtocolVersion = opts.version;
    let max = announced(opts).max_packet_size;
    let mut rbuf = ReadBuffer::default();
    loop {
        match decode(rbuf.bytes(), version, max) {
            Ok(Some(Packet::ConnAck(ack))) => {
                if ack.reason.is_error() {
                    return Err(Error::Refused(ack.reason));
                }
                return Ok((rbuf, ack));
            }
            Ok(Some(other)) => {
                return Err(Error::Protocol(format!("expected CONNACK, got {}", other.name())));
            }
            Ok(None) => {}
            Err(e) => return Err(Error::Protocol(format!("bad CONNACK: {e}"))),
        }
        if rbuf.read_from(rd).await? == 0 {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before CONNACK",
            )));
        }
    }
}
