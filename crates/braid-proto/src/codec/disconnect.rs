//! DISCONNECT and AUTH: in v5 both are just the reason code / properties [`Tail`]; in 3.1.x
//! DISCONNECT has no body and AUTH does not exist.

use bytes::BytesMut;

use super::ack::Tail;
use super::primitives::Reader;
use super::properties::Context;
use super::Body;
use crate::{Auth, DecodeError, Disconnect, EncodeError, Properties, ProtocolVersion, ReasonCode};

/// Decodes the body of DISCONNECT: empty in 3.1.x (reason Success); in v5 a missing reason
/// means Normal disconnection (0x00).
pub(super) fn decode_disconnect(r: &mut Reader, version: ProtocolVersion) -> Result<Disconnect, DecodeError> {
    if !version.is_v5() {
        r.finish()?;
        return Ok(Disconnect { reason: ReasonCode::Success, properties: Properties::default() });
    }
    let (reason, properties) = Tail::read(r, Context::Disconnect)?;
    Ok(Disconnect { reason, properties })
}

/// Decodes the body of AUTH (v5 only; the fixed header check rejects it in 3.1.x). An empty
/// body means Success.
pub(super) fn decode_auth(r: &mut Reader) -> Result<Auth, DecodeError> {
    let (reason, properties) = Tail::read(r, Context::Auth)?;
    Ok(Auth { reason, properties })
}

impl Disconnect {
    fn tail(&self) -> Tail<'_> {
        Tail {
            reason: self.reason,
            properties: &self.properties,
            ctx: Context::Disconnect,
            reason_only: true,
        }
    }
}

impl Body for Disconnect {
    fn body_len(&self, version: ProtocolVersion) -> usize {
        if version.is_v5() {
            self.tail().len()
        } else {
            0
        }
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        if version.is_v5() {
            self.tail().write(buf)?;
        }
        Ok(())
    }
}

impl Auth {
    fn tail(&self) -> Tail<'_> {
        Tail { reason: self.reason, properties: &self.properties, ctx: Context::Auth, reason_only: false }
    }
}

impl Body for Auth {
    fn body_len(&self, _: ProtocolVersion) -> usize {
        self.tail().len()
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        if !version.is_v5() {
            return Err(EncodeError::Unsupported);
        }
        self.tail().write(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::{Auth, Disconnect, EncodeError, Packet, Properties, ProtocolVersion, ReasonCode};

    const V5: ProtocolVersion = ProtocolVersion::V5;

    fn disconnect(reason: ReasonCode, properties: Properties) -> Packet {
        Packet::Disconnect(Disconnect { reason, properties })
    }

    fn auth(reason: ReasonCode, properties: Properties) -> Packet {
        Packet::Auth(Auth { reason, properties })
    }

    #[test]
    fn disconnect_round_trips() {
        let normal = disconnect(ReasonCode::Success, Properties::default());
        let full = disconnect(ReasonCode::ServerShuttingDown, all_properties());
        for version in [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1] {
            assert_eq!(round_trip(&normal, version), [0xE0, 0x00]);
            assert_eq!(round_trip_as(&full, version, &normal), [0xE0, 0x00]);
        }
        assert_eq!(round_trip(&normal, V5), [0xE0, 0x00]);
        round_trip_as(&full, V5, &disconnect(ReasonCode::ServerShuttingDown, allowed::disconnect()));
        let with_will = disconnect(ReasonCode::DisconnectWithWill, Properties::default());
        assert_eq!(round_trip(&with_will, V5), [0xE0, 0x01, 0x04]);
    }

    #[test]
    fn disconnect_short_forms_decode() {
        assert_eq!(decode_one(&[0xE0, 0x00], V5), Ok(disconnect(ReasonCode::Success, Properties::default())));
        assert_eq!(
            decode_one(&[0xE0, 0x02, 0x8E, 0x00], V5),
            Ok(disconnect(ReasonCode::SessionTakenOver, Properties::default()))
        );
        let expiry = Properties::from(crate::PropertyValues {
            session_expiry_interval: Some(5),
            ..Default::default()
        });
        assert_eq!(
            decode_one(&[0xE0, 0x07, 0x00, 0x05, 0x11, 0, 0, 0, 5], V5),
            Ok(disconnect(ReasonCode::Success, expiry))
        );
    }

    #[test]
    fn invalid_disconnects_are_rejected() {
        assert_malformed(&[0xE0, 0x01, 0x00], ProtocolVersion::V3_1_1);
        assert_malformed(&[0xE0, 0x01, 0x00], ProtocolVersion::V3_1);
        assert_malformed(&[0xE0, 0x01, 0x03], V5);
        assert_malformed(&[0xE0, 0x03, 0x00, 0x00, 0x00], V5);
        // Authentication Method is not allowed in DISCONNECT.
        assert_protocol(&[0xE0, 0x05, 0x00, 0x03, 0x15, 0x00, 0x00], V5);
    }

    #[test]
    fn auth_round_trips_and_short_forms() {
        let success = auth(ReasonCode::Success, Properties::default());
        assert_eq!(round_trip(&success, V5), [0xF0, 0x00]);
        // AUTH has no "reason code alone" form: the Property Length follows.
        let cont = auth(ReasonCode::ContinueAuthentication, Properties::default());
        assert_eq!(round_trip(&cont, V5), [0xF0, 0x02, 0x18, 0x00]);
        assert_eq!(decode_one(&[0xF0, 0x01, 0x18], V5), Ok(cont));
        let full = auth(ReasonCode::ReAuthenticate, all_properties());
        round_trip_as(&full, V5, &auth(ReasonCode::ReAuthenticate, allowed::auth()));
    }

    #[test]
    fn invalid_auth_is_rejected() {
        assert_malformed(&[0xF0, 0x01, 0x7F], V5);
        // Session Expiry Interval is not allowed in AUTH.
        assert_protocol(&[0xF0, 0x07, 0x18, 0x05, 0x11, 0, 0, 0, 1], V5);
        let mut buf = bytes::BytesMut::new();
        let packet = auth(ReasonCode::Success, Properties::default());
        assert_eq!(
            super::super::encode(&packet, ProtocolVersion::V3_1_1, &mut buf),
            Err(EncodeError::Unsupported)
        );
    }
}
