//! CONNECT and CONNACK.

use bytes::{BufMut, BytesMut};

use super::primitives::{prefixed_len, put_prefixed, Reader};
use super::properties::{read_v5_properties, v5_properties_len, write_v5_properties, Context};
use super::Body;
use crate::topic::valid_topic_name;
use crate::{ConnAck, Connect, DecodeError, EncodeError, LastWill, ProtocolVersion, QoS, ReasonCode};

/// Connect Flags bits.
const USERNAME: u8 = 0x80;
const PASSWORD: u8 = 0x40;
const WILL_RETAIN: u8 = 0x20;
const WILL_QOS_SHIFT: u8 = 3;
const WILL: u8 = 0x04;
const CLEAN_START: u8 = 0x02;
const RESERVED: u8 = 0x01;

/// The protocol name a version puts in CONNECT.
fn protocol_name(version: ProtocolVersion) -> &'static [u8] {
    match version {
        ProtocolVersion::V3_1 => b"MQIsdp",
        ProtocolVersion::V3_1_1 | ProtocolVersion::V5 => b"MQTT",
    }
}

/// Decodes the body of a CONNECT, in the version named by its protocol name and level.
///
/// Besides the grammar this checks the Connect Flags (reserved bit 0 clear in 3.1.1 and 5.0,
/// will QoS and retain clear without a will, will QoS not 3, in 3.1.x no password without a
/// user name) and that the will topic is a valid topic name
/// ([`DecodeError::TopicNameInvalid`]). Client identifier rules are left to the broker.
pub(super) fn decode_connect(mut r: Reader) -> Result<Connect, DecodeError> {
    let name = r.binary()?;
    let level = r.u8()?;
    let protocol = match (&name[..], level) {
        (b"MQIsdp", 3) => ProtocolVersion::V3_1,
        (b"MQTT", 4) => ProtocolVersion::V3_1_1,
        (b"MQTT", 5) => ProtocolVersion::V5,
        _ => return Err(DecodeError::UnsupportedProtocol),
    };
    let flags = r.u8()?;
    if flags & RESERVED != 0 && protocol != ProtocolVersion::V3_1 {
        return Err(DecodeError::Malformed("reserved connect flag set"));
    }
    let has_will = flags & WILL != 0;
    let will_retain = flags & WILL_RETAIN != 0;
    let will_qos =
        QoS::from_u8((flags >> WILL_QOS_SHIFT) & 0b11).ok_or(DecodeError::Malformed("will QoS 3"))?;
    if !has_will && (will_retain || will_qos != QoS::AtMostOnce) {
        return Err(DecodeError::Malformed("will QoS or retain without will flag"));
    }
    let has_username = flags & USERNAME != 0;
    let has_password = flags & PASSWORD != 0;
    if has_password && !has_username && !protocol.is_v5() {
        return Err(DecodeError::Malformed("password without user name"));
    }
    let keep_alive = r.u16()?;
    let properties = read_v5_properties(&mut r, protocol, Context::Connect)?;
    let client_id = r.string()?;
    let will = if has_will {
        let properties = read_v5_properties(&mut r, protocol, Context::Will)?;
        let topic = r.string()?;
        if !valid_topic_name(&topic) {
            return Err(DecodeError::TopicNameInvalid);
        }
        let payload = r.binary()?;
        Some(LastWill { topic, payload, qos: will_qos, retain: will_retain, properties })
    } else {
        None
    };
    let username = if has_username { Some(r.string()?) } else { None };
    let password = if has_password { Some(r.binary()?) } else { None };
    r.finish()?;
    Ok(Connect {
        protocol,
        clean_start: flags & CLEAN_START != 0,
        keep_alive,
        properties,
        client_id,
        will,
        username,
        password,
    })
}

impl Connect {
    fn flags(&self) -> u8 {
        let mut flags = 0;
        if self.clean_start {
            flags |= CLEAN_START;
        }
        if let Some(will) = &self.will {
            flags |= WILL | (will.qos as u8) << WILL_QOS_SHIFT;
            if will.retain {
                flags |= WILL_RETAIN;
            }
        }
        if self.username.is_some() {
            flags |= USERNAME;
        }
        if self.password.is_some() {
            flags |= PASSWORD;
        }
        flags
    }
}

/// CONNECT is sized and written for its own `protocol`; the connection's version is ignored.
impl Body for Connect {
    fn body_len(&self, _: ProtocolVersion) -> usize {
        let v = self.protocol;
        let mut len = prefixed_len(protocol_name(v).len()) + 1 + 1 + 2;
        len += v5_properties_len(&self.properties, v, Context::Connect);
        len += prefixed_len(self.client_id.len());
        if let Some(will) = &self.will {
            len += v5_properties_len(&will.properties, v, Context::Will);
            len += prefixed_len(will.topic.len()) + prefixed_len(will.payload.len());
        }
        if let Some(username) = &self.username {
            len += prefixed_len(username.len());
        }
        if let Some(password) = &self.password {
            len += prefixed_len(password.len());
        }
        len
    }

    fn write_body(&self, _: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        let v = self.protocol;
        put_prefixed(buf, protocol_name(v))?;
        buf.put_u8(v as u8);
        buf.put_u8(self.flags());
        buf.put_u16(self.keep_alive);
        write_v5_properties(&self.properties, v, Context::Connect, buf)?;
        put_prefixed(buf, self.client_id.as_bytes())?;
        if let Some(will) = &self.will {
            write_v5_properties(&will.properties, v, Context::Will, buf)?;
            put_prefixed(buf, will.topic.as_bytes())?;
            put_prefixed(buf, &will.payload)?;
        }
        if let Some(username) = &self.username {
            put_prefixed(buf, username.as_bytes())?;
        }
        if let Some(password) = &self.password {
            put_prefixed(buf, password)?;
        }
        Ok(())
    }
}

/// The 3.1.x CONNACK return code for a v5 reason code.
///
/// Success is 0, Unsupported Protocol Version 1, Client Identifier not valid 2, Bad User Name
/// or Password and Bad authentication method 4 (both are bad credentials), Not authorized and
/// Banned 5 (both refuse this client). Every other code, failures such as Server busy, Quota
/// exceeded or Use another server and the meaningless non-error codes alike, becomes 3 (Server
/// unavailable), the only "try again later" answer 3.1.x has.
fn v3_return_code(reason: ReasonCode) -> u8 {
    match reason {
        ReasonCode::Success => 0,
        ReasonCode::UnsupportedProtocolVersion => 1,
        ReasonCode::ClientIdentifierNotValid => 2,
        ReasonCode::BadUserNameOrPassword | ReasonCode::BadAuthenticationMethod => 4,
        ReasonCode::NotAuthorized | ReasonCode::Banned => 5,
        _ => 3,
    }
}

/// The v5 reason code for a 3.1.x CONNACK return code 0..=5.
fn v3_reason(code: u8) -> Result<ReasonCode, DecodeError> {
    Ok(match code {
        0 => ReasonCode::Success,
        1 => ReasonCode::UnsupportedProtocolVersion,
        2 => ReasonCode::ClientIdentifierNotValid,
        3 => ReasonCode::ServerUnavailable,
        4 => ReasonCode::BadUserNameOrPassword,
        5 => ReasonCode::NotAuthorized,
        _ => return Err(DecodeError::Malformed("unknown CONNACK return code")),
    })
}

/// Decodes the body of a CONNACK. MQTT 3.1 has no Session Present flag (the byte is reserved
/// and ignored); 3.1.1 and 5.0 require its other bits to be 0.
pub(super) fn decode_connack(mut r: Reader, version: ProtocolVersion) -> Result<ConnAck, DecodeError> {
    let flags = r.u8()?;
    let session_present = match version {
        ProtocolVersion::V3_1 => false,
        _ if flags & !1 != 0 => return Err(DecodeError::Malformed("reserved CONNACK flags set")),
        _ => flags & 1 != 0,
    };
    let reason = if version.is_v5() { r.reason()? } else { v3_reason(r.u8()?)? };
    let properties = read_v5_properties(&mut r, version, Context::ConnAck)?;
    r.finish()?;
    Ok(ConnAck { session_present, reason, properties })
}

impl Body for ConnAck {
    fn body_len(&self, version: ProtocolVersion) -> usize {
        2 + v5_properties_len(&self.properties, version, Context::ConnAck)
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        let session_present = self.session_present && version != ProtocolVersion::V3_1;
        buf.put_u8(u8::from(session_present));
        let code = if version.is_v5() { self.reason as u8 } else { v3_return_code(self.reason) };
        buf.put_u8(code);
        write_v5_properties(&self.properties, version, Context::ConnAck, buf)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::test_util::*;
    use crate::{
        ConnAck, Connect, DecodeError, LastWill, Packet, Properties, ProtocolVersion, QoS, ReasonCode,
    };

    const V3_1: ProtocolVersion = ProtocolVersion::V3_1;
    const V3_1_1: ProtocolVersion = ProtocolVersion::V3_1_1;
    const V5: ProtocolVersion = ProtocolVersion::V5;
    const VERSIONS: [ProtocolVersion; 3] = [V3_1, V3_1_1, V5];

    fn minimal(protocol: ProtocolVersion) -> Connect {
        Connect {
            protocol,
            clean_start: true,
            keep_alive: 60,
            properties: Properties::default(),
            client_id: "abc".into(),
            will: None,
            username: None,
            password: None,
        }
    }

    fn full(protocol: ProtocolVersion, connect: Properties, will: Properties) -> Connect {
        Connect {
            protocol,
            clean_start: false,
            keep_alive: 0xFFFF,
            properties: connect,
            client_id: "client-é".into(),
            will: Some(LastWill {
                topic: "will/topic".into(),
                payload: Bytes::from_static(b"\x00gone\xFF"),
                qos: QoS::ExactlyOnce,
                retain: true,
                properties: will,
            }),
            username: Some("user".into()),
            password: Some(Bytes::from_static(b"\xFFsecret")),
        }
    }

    fn packet(connect: Connect) -> Packet {
        Packet::Connect(Box::new(connect))
    }

    /// A CONNECT frame: protocol name, level, flags, keep alive 60, then `rest`.
    fn connect_bytes(name: &[u8], level: u8, flags: u8, rest: &[u8]) -> Vec<u8> {
        let mut body = vec![0x00, u8::try_from(name.len()).unwrap()];
        body.extend_from_slice(name);
        body.extend_from_slice(&[level, flags, 0x00, 0x3C]);
        body.extend_from_slice(rest);
        frame(0x10, &body)
    }

    #[test]
    fn known_bytes_3_1_1() {
        let bytes = [
            0x10, 0x0F, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, 0x02, 0x00, 0x3C, 0x00, 0x03, b'a', b'b',
            b'c',
        ];
        assert_eq!(round_trip(&packet(minimal(V3_1_1)), V3_1_1), bytes);
    }

    #[test]
    fn known_bytes_3_1_mqisdp() {
        let bytes = [
            0x10, 0x11, 0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p', 0x03, 0x02, 0x00, 0x3C, 0x00, 0x03,
            b'a', b'b', b'c',
        ];
        assert_eq!(round_trip(&packet(minimal(V3_1)), V3_1), bytes);
    }

    #[test]
    fn known_bytes_5() {
        // The variable header of the spec's example (3.1.2.11): flags 0xCE, keep alive 10,
        // Session Expiry Interval 10.
        let bytes = [
            0x10, 0x21, // fixed header
            0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0xCE, 0x00, 0x0A, // variable header
            0x05, 0x11, 0x00, 0x00, 0x00, 0x0A, // properties
            0x00, 0x01, b'c', // client id
            0x00, // will properties
            0x00, 0x01, b'w', 0x00, 0x01, b'p', // will topic and payload
            0x00, 0x01, b'u', 0x00, 0x02, b'p', b'w', // user name and password
        ];
        let connect = Connect {
            protocol: V5,
            clean_start: true,
            keep_alive: 10,
            properties: Properties::from(crate::PropertyValues {
                session_expiry_interval: Some(10),
                ..Default::default()
            }),
            client_id: "c".into(),
            will: Some(LastWill {
                topic: "w".into(),
                payload: Bytes::from_static(b"p"),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: Properties::default(),
            }),
            username: Some("u".into()),
            password: Some(Bytes::from_static(b"pw")),
        };
        assert_eq!(round_trip(&packet(connect), V5), bytes);
    }

    #[test]
    fn a_detached_will_holds_bytes_of_its_own() {
        let sent = packet(full(V5, allowed::connect(), allowed::will()));
        let Ok(Packet::Connect(c)) = decode_one(&encode_to_vec(&sent, V5), V5) else { panic!("a CONNECT") };
        let will = c.will.as_ref().expect("a will");
        assert!(!will.payload.is_unique(), "decoded, it is a slice of the packet's buffer");
        let own = will.detached();
        assert_eq!(&own, will);
        let p = &own.properties;
        let users = p.user_properties.iter().flat_map(|(k, v)| [k, v]);
        let strings = [&own.topic].into_iter().chain(&p.content_type).chain(&p.response_topic).chain(users);
        let bytes: Vec<&Bytes> =
            strings.map(|s| s.as_bytes()).chain([&own.payload]).chain(&p.correlation_data).collect();
        assert_eq!(bytes.len(), 5 + 2 * p.user_properties.len(), "every string and byte field is set");
        // An empty one is static: it holds no buffer.
        assert!(bytes.into_iter().all(|b| b.is_empty() || b.is_unique()));
    }

    #[test]
    fn round_trip_every_version() {
        for version in VERSIONS {
            round_trip(&packet(minimal(version)), version);
            let props = if version.is_v5() { allowed::connect() } else { Properties::default() };
            let will = if version.is_v5() { allowed::will() } else { Properties::default() };
            round_trip_as(
                &packet(full(version, all_properties(), all_properties())),
                version,
                &packet(full(version, props, will)),
            );
        }
        // v5 allows a password without a user name.
        let connect = Connect { password: Some(Bytes::from_static(b"pw")), ..minimal(V5) };
        round_trip(&packet(connect), V5);
    }

    #[test]
    fn connect_uses_its_own_version() {
        for own in VERSIONS {
            let connect = packet(full(own, Properties::default(), Properties::default()));
            let bytes = encode_to_vec(&connect, own);
            for connection in VERSIONS {
                assert_eq!(encode_to_vec(&connect, connection), bytes);
                assert_eq!(decode_one(&bytes, connection).as_ref(), Ok(&connect));
            }
        }
    }

    #[test]
    fn unsupported_protocols() {
        let payload = [0x00, 0x01, b'c'];
        for (name, level) in [
            (&b"MQTT"[..], 3),
            (b"MQTT", 6),
            (b"MQTT", 0),
            (b"MQIsdp", 4),
            (b"MQIsdp", 5),
            (b"MQTX", 4),
            (b"mqtt", 4),
            (b"", 4),
        ] {
            let bytes = connect_bytes(name, level, 0x02, &payload);
            assert_eq!(decode_one(&bytes, V5), Err(DecodeError::UnsupportedProtocol), "{name:?} {level}");
        }
        // Not even a protocol level: too short to be a CONNECT.
        assert_malformed(&[0x10, 0x06, 0x00, 0x04, b'M', b'Q', b'T', b'T'], V3_1_1);
        assert_malformed(&[0x10, 0x03, 0x00, 0x04, b'M'], V3_1_1);
    }

    #[test]
    fn connect_flags_are_checked() {
        let payload = [0x00, 0x01, b'c'];
        for (name, level) in [(&b"MQTT"[..], 4), (b"MQTT", 5)] {
            // Reserved bit.
            assert_malformed(&connect_bytes(name, level, 0x03, &payload), V5);
        }
        // MQTT 3.1 did not reserve bit 0.
        assert!(decode_one(&connect_bytes(b"MQIsdp", 3, 0x03, &payload), V3_1).is_ok());
        for (name, level) in [(&b"MQIsdp"[..], 3), (b"MQTT", 4), (b"MQTT", 5)] {
            // Will QoS or retain without the will flag.
            assert_malformed(&connect_bytes(name, level, 0x08, &payload), V5);
            assert_malformed(&connect_bytes(name, level, 0x10, &payload), V5);
            assert_malformed(&connect_bytes(name, level, 0x20, &payload), V5);
        }
        // Will QoS 3.
        let will = [0x00, 0x01, b'c', 0x00, 0x01, b'w', 0x00, 0x00];
        assert_malformed(&connect_bytes(b"MQTT", 4, 0x1C, &will), V3_1_1);
        assert!(decode_one(&connect_bytes(b"MQTT", 4, 0x14, &will), V3_1_1).is_ok());
        // Password without user name: malformed in 3.1.x, fine in v5.
        let password = [0x00, 0x01, b'c', 0x00, 0x01, b'p'];
        assert_malformed(&connect_bytes(b"MQTT", 4, 0x40, &password), V3_1_1);
        assert_malformed(&connect_bytes(b"MQIsdp", 3, 0x40, &password), V3_1);
        let password_v5 = [0x00, 0x00, 0x01, b'c', 0x00, 0x01, b'p'];
        assert!(decode_one(&connect_bytes(b"MQTT", 5, 0x40, &password_v5), V5).is_ok());
    }

    #[test]
    fn connect_strings_are_checked() {
        // Client identifier: invalid UTF-8, U+0000.
        assert_malformed(&connect_bytes(b"MQTT", 4, 0x02, &[0x00, 0x01, 0xFF]), V3_1_1);
        assert_malformed(&connect_bytes(b"MQTT", 4, 0x02, &[0x00, 0x01, 0x00]), V3_1_1);
        // User name.
        let username = [0x00, 0x01, b'c', 0x00, 0x02, 0xC0, 0x80];
        assert_malformed(&connect_bytes(b"MQTT", 4, 0x80, &username), V3_1_1);
        // Will topic: invalid UTF-8, wildcards, empty.
        let will = |topic: &[u8]| {
            let mut rest = vec![0x00, 0x01, b'c', 0x00, u8::try_from(topic.len()).unwrap()];
            rest.extend_from_slice(topic);
            rest.extend_from_slice(&[0x00, 0x00]);
            connect_bytes(b"MQTT", 4, 0x04, &rest)
        };
        assert!(decode_one(&will(b"a/b"), V3_1_1).is_ok());
        assert_malformed(&will(&[0xED, 0xA0, 0x80]), V3_1_1);
        assert_eq!(decode_one(&will(b"a/+"), V3_1_1), Err(DecodeError::TopicNameInvalid));
        assert_eq!(decode_one(&will(b"#"), V3_1_1), Err(DecodeError::TopicNameInvalid));
        assert_eq!(decode_one(&will(b""), V3_1_1), Err(DecodeError::TopicNameInvalid));
    }

    #[test]
    fn connect_lengths_are_checked() {
        // User name flag without a user name.
        assert_malformed(&connect_bytes(b"MQTT", 4, 0x80, &[0x00, 0x01, b'c']), V3_1_1);
        // Will flag without a will.
        assert_malformed(&connect_bytes(b"MQTT", 4, 0x04, &[0x00, 0x01, b'c']), V3_1_1);
        // No client identifier.
        assert_malformed(&connect_bytes(b"MQTT", 4, 0x02, &[]), V3_1_1);
        // Trailing bytes.
        assert_malformed(&connect_bytes(b"MQTT", 4, 0x02, &[0x00, 0x01, b'c', 0x00]), V3_1_1);
    }

    #[test]
    fn connect_properties_are_checked() {
        // Will Delay Interval belongs in the will properties, not the CONNECT's.
        let rest = [0x05, 0x18, 0, 0, 0, 1, 0x00, 0x01, b'c'];
        assert_protocol(&connect_bytes(b"MQTT", 5, 0x02, &rest), V5);
        // Session Expiry Interval belongs in the CONNECT properties, not the will's.
        let rest = [0x00, 0x00, 0x01, b'c', 0x05, 0x11, 0, 0, 0, 1, 0x00, 0x01, b'w', 0x00, 0x00];
        assert_protocol(&connect_bytes(b"MQTT", 5, 0x06, &rest), V5);
        let rest = [0x00, 0x00, 0x01, b'c', 0x05, 0x18, 0, 0, 0, 1, 0x00, 0x01, b'w', 0x00, 0x00];
        assert!(decode_one(&connect_bytes(b"MQTT", 5, 0x06, &rest), V5).is_ok());
        // Receive Maximum 0.
        let rest = [0x03, 0x21, 0x00, 0x00, 0x00, 0x01, b'c'];
        assert_protocol(&connect_bytes(b"MQTT", 5, 0x02, &rest), V5);
    }

    fn connack(session_present: bool, reason: ReasonCode, properties: Properties) -> Packet {
        Packet::ConnAck(ConnAck { session_present, reason, properties })
    }

    #[test]
    fn connack_known_bytes_and_round_trips() {
        let ok = connack(false, ReasonCode::Success, Properties::default());
        let resumed = connack(true, ReasonCode::Success, Properties::default());
        assert_eq!(round_trip(&ok, V3_1_1), [0x20, 0x02, 0x00, 0x00]);
        assert_eq!(round_trip(&resumed, V3_1_1), [0x20, 0x02, 0x01, 0x00]);
        assert_eq!(round_trip(&ok, V3_1), [0x20, 0x02, 0x00, 0x00]);
        // 3.1 has no Session Present flag.
        assert_eq!(round_trip_as(&resumed, V3_1, &ok), [0x20, 0x02, 0x00, 0x00]);
        assert_eq!(round_trip(&resumed, V5), [0x20, 0x03, 0x01, 0x00, 0x00]);
        let full = connack(true, ReasonCode::Success, all_properties());
        round_trip_as(&full, V5, &connack(true, ReasonCode::Success, allowed::connack()));
        for version in [V3_1, V3_1_1] {
            round_trip_as(
                &full,
                version,
                &connack(version == V3_1_1, ReasonCode::Success, Properties::default()),
            );
        }
        let refused = connack(false, ReasonCode::QuotaExceeded, Properties::default());
        assert_eq!(round_trip(&refused, V5), [0x20, 0x03, 0x00, 0x97, 0x00]);
    }

    #[test]
    fn connack_v3_return_codes() {
        let mapped = [
            (ReasonCode::Success, 0, ReasonCode::Success),
            (ReasonCode::UnsupportedProtocolVersion, 1, ReasonCode::UnsupportedProtocolVersion),
            (ReasonCode::ClientIdentifierNotValid, 2, ReasonCode::ClientIdentifierNotValid),
            (ReasonCode::ServerUnavailable, 3, ReasonCode::ServerUnavailable),
            (ReasonCode::BadUserNameOrPassword, 4, ReasonCode::BadUserNameOrPassword),
            (ReasonCode::NotAuthorized, 5, ReasonCode::NotAuthorized),
            (ReasonCode::Banned, 5, ReasonCode::NotAuthorized),
            (ReasonCode::BadAuthenticationMethod, 4, ReasonCode::BadUserNameOrPassword),
            (ReasonCode::ServerBusy, 3, ReasonCode::ServerUnavailable),
            (ReasonCode::QuotaExceeded, 3, ReasonCode::ServerUnavailable),
            (ReasonCode::UseAnotherServer, 3, ReasonCode::ServerUnavailable),
            (ReasonCode::UnspecifiedError, 3, ReasonCode::ServerUnavailable),
            (ReasonCode::MalformedPacket, 3, ReasonCode::ServerUnavailable),
        ];
        for version in [V3_1, V3_1_1] {
            for (reason, code, decoded) in mapped {
                let bytes = round_trip_as(
                    &connack(false, reason, Properties::default()),
                    version,
                    &connack(false, decoded, Properties::default()),
                );
                assert_eq!(bytes, [0x20, 0x02, 0x00, code], "{reason:?}");
            }
        }
    }

    #[test]
    fn invalid_connacks_are_rejected() {
        assert_malformed(&[0x20, 0x02, 0x00, 0x06], V3_1_1);
        assert_malformed(&[0x20, 0x02, 0x00, 0x80], V3_1);
        assert_malformed(&[0x20, 0x02, 0x02, 0x00], V3_1_1);
        assert_malformed(&[0x20, 0x03, 0x80, 0x00, 0x00], V5);
        assert_malformed(&[0x20, 0x03, 0x00, 0x03, 0x00], V5);
        assert_malformed(&[0x20, 0x02, 0x00, 0x00], V5);
        assert_malformed(&[0x20, 0x03, 0x00, 0x00, 0x00], V3_1_1);
        assert_malformed(&[0x20, 0x01, 0x00], V3_1_1);
        // 3.1 ignores the reserved flags byte.
        assert_eq!(
            decode_one(&[0x20, 0x02, 0xFF, 0x00], V3_1),
            Ok(connack(false, ReasonCode::Success, Properties::default()))
        );
        // Will Delay Interval is not allowed in CONNACK; Maximum QoS must be 0 or 1.
        assert_protocol(&[0x20, 0x08, 0x00, 0x00, 0x05, 0x18, 0, 0, 0, 1], V5);
        assert_protocol(&[0x20, 0x05, 0x00, 0x00, 0x02, 0x24, 0x02], V5);
    }
}
