//! MQTT 5.0 properties: the Property Length, then identifier/value pairs.
//!
//! Which property may appear in which packet follows the table of section 2.2.2.2 of the
//! v5 spec. The decoder rejects an unknown identifier as Malformed, and a property not allowed
//! in the packet, a repeated single-valued property or a forbidden value (0 where the spec
//! forbids 0, a "boolean" other than 0 or 1, a Response Topic with wildcards) as Protocol
//! errors. The encoder writes only the properties the packet allows, so a `Properties` shared
//! between packets never makes the codec emit something the peer must reject.

use bytes::{BufMut, BytesMut};

use super::primitives::{put_varint, varint_len, Reader, Wire};
use crate::{DecodeError, EncodeError, Properties, ProtocolVersion};

/// The packet (or the CONNECT will) a property block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Context {
    /// CONNECT properties.
    Connect,
    /// Will properties in the CONNECT payload.
    Will,
    /// CONNACK.
    ConnAck,
    /// PUBLISH.
    Publish,
    /// PUBACK, PUBREC, PUBREL and PUBCOMP, which allow the same properties.
    Ack,
    /// SUBSCRIBE.
    Subscribe,
    /// SUBACK.
    SubAck,
    /// UNSUBSCRIBE.
    Unsubscribe,
    /// UNSUBACK.
    UnsubAck,
    /// DISCONNECT.
    Disconnect,
    /// AUTH.
    Auth,
}

impl Context {
    const fn bit(self) -> u16 {
        1 << self as u16
    }

    fn allows(self, set: u16) -> bool {
        set & self.bit() != 0
    }
}

const CONNECT: u16 = Context::Connect.bit();
const WILL: u16 = Context::Will.bit();
const CONNACK: u16 = Context::ConnAck.bit();
const PUBLISH: u16 = Context::Publish.bit();
const ACK: u16 = Context::Ack.bit();
const SUBSCRIBE: u16 = Context::Subscribe.bit();
const SUBACK: u16 = Context::SubAck.bit();
const UNSUBACK: u16 = Context::UnsubAck.bit();
const DISCONNECT: u16 = Context::Disconnect.bit();
const AUTH: u16 = Context::Auth.bit();

const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
const USER_PROPERTY: u8 = 0x26;

fn any<T>(_: &T) -> bool {
    true
}

fn zero_or_one(value: &u8) -> bool {
    *value <= 1
}

fn non_zero_u16(value: &u16) -> bool {
    *value != 0
}

fn non_zero_u32(value: &u32) -> bool {
    *value != 0
}

fn topic_name(value: &bytestring::ByteString) -> bool {
    crate::topic::valid_topic_name(value)
}

fn check_allowed(set: u16, ctx: Context) -> Result<(), DecodeError> {
    if ctx.allows(set) {
        Ok(())
    } else {
        Err(DecodeError::Protocol("property not allowed in this packet"))
    }
}

/// Generates read, size and write for the properties that hold one value of a `Wire` type.
macro_rules! single_valued {
    ($($id:literal $field:ident: $ty:ty, allowed in $allowed:expr, valid if $valid:ident;)*) => {
        /// Reads the value of single-valued property `id` into `props`; `Ok(false)` when `id`
        /// is not a single-valued property.
        fn read_single(
            id: u8,
            r: &mut Reader,
            ctx: Context,
            props: &mut Properties,
        ) -> Result<bool, DecodeError> {
            match id {
                $($id => {
                    check_allowed($allowed, ctx)?;
                    let value = <$ty as Wire>::read(r)?;
                    if !$valid(&value) {
                        return Err(DecodeError::Protocol(concat!(
                            "invalid value of property ",
                            stringify!($field)
                        )));
                    }
                    if props.$field.replace(value).is_some() {
                        return Err(DecodeError::Protocol(concat!(
                            "duplicate property ",
                            stringify!($field)
                        )));
                    }
                    Ok(true)
                })*
                _ => Ok(false),
            }
        }

        /// Bytes the single-valued properties allowed in `ctx` take.
        fn singles_len(props: &Properties, ctx: Context) -> usize {
            let mut len = 0;
            $(
                if let Some(value) = &props.$field {
                    if ctx.allows($allowed) {
                        len += 1 + value.wire_len();
                    }
                }
            )*
            len
        }

        /// Writes the single-valued properties allowed in `ctx`.
        fn write_singles(
            props: &Properties,
            ctx: Context,
            buf: &mut BytesMut,
        ) -> Result<(), EncodeError> {
            $(
                if let Some(value) = &props.$field {
                    if ctx.allows($allowed) {
                        buf.put_u8($id);
                        value.write(buf)?;
                    }
                }
            )*
            Ok(())
        }
    };
}

single_valued! {
    0x01 payload_format_indicator: u8, allowed in PUBLISH | WILL, valid if zero_or_one;
    0x02 message_expiry_interval: u32, allowed in PUBLISH | WILL, valid if any;
    0x03 content_type: bytestring::ByteString, allowed in PUBLISH | WILL, valid if any;
    0x08 response_topic: bytestring::ByteString, allowed in PUBLISH | WILL, valid if topic_name;
    0x09 correlation_data: bytes::Bytes, allowed in PUBLISH | WILL, valid if any;
    0x11 session_expiry_interval: u32, allowed in CONNECT | CONNACK | DISCONNECT, valid if any;
    0x12 assigned_client_identifier: bytestring::ByteString, allowed in CONNACK, valid if any;
    0x13 server_keep_alive: u16, allowed in CONNACK, valid if any;
    0x15 authentication_method: bytestring::ByteString, allowed in CONNECT | CONNACK | AUTH,
        valid if any;
    0x16 authentication_data: bytes::Bytes, allowed in CONNECT | CONNACK | AUTH, valid if any;
    0x17 request_problem_information: u8, allowed in CONNECT, valid if zero_or_one;
    0x18 will_delay_interval: u32, allowed in WILL, valid if any;
    0x19 request_response_information: u8, allowed in CONNECT, valid if zero_or_one;
    0x1A response_information: bytestring::ByteString, allowed in CONNACK, valid if any;
    0x1C server_reference: bytestring::ByteString, allowed in CONNACK | DISCONNECT, valid if any;
    0x1F reason_string: bytestring::ByteString,
        allowed in CONNACK | ACK | SUBACK | UNSUBACK | DISCONNECT | AUTH, valid if any;
    0x21 receive_maximum: u16, allowed in CONNECT | CONNACK, valid if non_zero_u16;
    0x22 topic_alias_maximum: u16, allowed in CONNECT | CONNACK, valid if any;
    0x23 topic_alias: u16, allowed in PUBLISH, valid if non_zero_u16;
    0x24 maximum_qos: u8, allowed in CONNACK, valid if zero_or_one;
    0x25 retain_available: u8, allowed in CONNACK, valid if zero_or_one;
    0x27 maximum_packet_size: u32, allowed in CONNECT | CONNACK, valid if non_zero_u32;
    0x28 wildcard_subscription_available: u8, allowed in CONNACK, valid if zero_or_one;
    0x29 subscription_identifier_available: u8, allowed in CONNACK, valid if zero_or_one;
    0x2A shared_subscription_available: u8, allowed in CONNACK, valid if zero_or_one;
}

/// How many Subscription Identifiers `ctx` carries: any number in PUBLISH, one in SUBSCRIBE.
fn subscription_identifiers(props: &Properties, ctx: Context) -> &[u32] {
    let ids = &props.subscription_identifiers[..];
    match ctx {
        Context::Publish => ids,
        Context::Subscribe => &ids[..ids.len().min(1)],
        _ => &[],
    }
}

/// Reads a Property Length and the properties it covers.
pub(super) fn read_properties(r: &mut Reader, ctx: Context) -> Result<Properties, DecodeError> {
    let len = r.varint()?;
    let mut block = Reader::new(r.take(len)?);
    let mut props = Properties::default();
    while !block.is_empty() {
        let id = block.u8()?;
        if read_single(id, &mut block, ctx, &mut props)? {
            continue;
        }
        match id {
            SUBSCRIPTION_IDENTIFIER => {
                check_allowed(PUBLISH | SUBSCRIBE, ctx)?;
                let id = block.varint()?;
                if id == 0 {
                    return Err(DecodeError::Protocol("subscription identifier 0"));
                }
                if ctx == Context::Subscribe && !props.subscription_identifiers.is_empty() {
                    return Err(DecodeError::Protocol("duplicate property subscription_identifier"));
                }
                // A Variable Byte Integer is at most 268,435,455, so this cannot fail.
                let id = u32::try_from(id).map_err(|_| DecodeError::Malformed("varint"))?;
                props.subscription_identifiers.push(id);
            }
            USER_PROPERTY => {
                let name = block.string()?;
                let value = block.string()?;
                props.user_properties.push((name, value));
            }
            _ => return Err(DecodeError::Malformed("unknown property identifier")),
        }
    }
    Ok(props)
}

/// Bytes the properties allowed in `ctx` take, without the Property Length.
pub(super) fn properties_len(props: &Properties, ctx: Context) -> usize {
    if props.is_unset() {
        return 0;
    }
    let ids: usize = subscription_identifiers(props, ctx).iter().map(|&id| 1 + varint_len(id as usize)).sum();
    let users: usize =
        props.user_properties.iter().map(|(name, value)| 1 + name.wire_len() + value.wire_len()).sum();
    singles_len(props, ctx) + ids + users
}

/// Bytes the Property Length and the properties allowed in `ctx` take.
pub(super) fn properties_block_len(props: &Properties, ctx: Context) -> usize {
    let len = properties_len(props, ctx);
    varint_len(len) + len
}

/// Writes the Property Length and the properties allowed in `ctx`.
pub(super) fn write_properties(
    props: &Properties,
    ctx: Context,
    buf: &mut BytesMut,
) -> Result<(), EncodeError> {
    put_varint(buf, properties_len(props, ctx))?;
    if props.is_unset() {
        return Ok(());
    }
    write_singles(props, ctx, buf)?;
    for &id in subscription_identifiers(props, ctx) {
        buf.put_u8(SUBSCRIPTION_IDENTIFIER);
        put_varint(buf, id as usize)?;
    }
    for (name, value) in &props.user_properties {
        buf.put_u8(USER_PROPERTY);
        name.write(buf)?;
        value.write(buf)?;
    }
    Ok(())
}

/// [`read_properties`] in v5; no properties (and no bytes read) in 3.1.x.
pub(super) fn read_v5_properties(
    r: &mut Reader,
    version: ProtocolVersion,
    ctx: Context,
) -> Result<Properties, DecodeError> {
    if version.is_v5() {
        read_properties(r, ctx)
    } else {
        Ok(Properties::default())
    }
}

/// [`properties_block_len`] in v5; 0 in 3.1.x.
pub(super) fn v5_properties_len(props: &Properties, version: ProtocolVersion, ctx: Context) -> usize {
    if version.is_v5() {
        properties_block_len(props, ctx)
    } else {
        0
    }
}

/// [`write_properties`] in v5; nothing in 3.1.x.
pub(super) fn write_v5_properties(
    props: &Properties,
    version: ProtocolVersion,
    ctx: Context,
    buf: &mut BytesMut,
) -> Result<(), EncodeError> {
    if version.is_v5() {
        write_properties(props, ctx, buf)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::codec::test_util::all_properties;

    const CONTEXTS: [Context; 11] = [
        Context::Connect,
        Context::Will,
        Context::ConnAck,
        Context::Publish,
        Context::Ack,
        Context::Subscribe,
        Context::SubAck,
        Context::Unsubscribe,
        Context::UnsubAck,
        Context::Disconnect,
        Context::Auth,
    ];

    /// Every property with a valid value, and the packets the spec's table (2.2.2.2) allows it
    /// in, written out independently of the codec's table.
    fn spec_table() -> Vec<(&'static [u8], Vec<Context>)> {
        use Context::*;
        let everywhere = CONTEXTS.to_vec();
        vec![
            (&[0x01, 0x01], vec![Publish, Will]),
            (&[0x02, 0, 0, 0, 9], vec![Publish, Will]),
            (&[0x03, 0, 1, b't'], vec![Publish, Will]),
            (&[0x08, 0, 1, b't'], vec![Publish, Will]),
            (&[0x09, 0, 1, 0xFF], vec![Publish, Will]),
            (&[0x0B, 0x81, 0x01], vec![Publish, Subscribe]),
            (&[0x11, 0, 0, 0, 9], vec![Connect, ConnAck, Disconnect]),
            (&[0x12, 0, 1, b'c'], vec![ConnAck]),
            (&[0x13, 0, 9], vec![ConnAck]),
            (&[0x15, 0, 1, b'm'], vec![Connect, ConnAck, Auth]),
            (&[0x16, 0, 1, 0xFF], vec![Connect, ConnAck, Auth]),
            (&[0x17, 0x01], vec![Connect]),
            (&[0x18, 0, 0, 0, 9], vec![Will]),
            (&[0x19, 0x01], vec![Connect]),
            (&[0x1A, 0, 1, b'r'], vec![ConnAck]),
            (&[0x1C, 0, 1, b's'], vec![ConnAck, Disconnect]),
            (&[0x1F, 0, 1, b'r'], vec![ConnAck, Ack, SubAck, UnsubAck, Disconnect, Auth]),
            (&[0x21, 0, 9], vec![Connect, ConnAck]),
            (&[0x22, 0, 9], vec![Connect, ConnAck]),
            (&[0x23, 0, 9], vec![Publish]),
            (&[0x24, 0x01], vec![ConnAck]),
            (&[0x25, 0x01], vec![ConnAck]),
            (&[0x26, 0, 1, b'k', 0, 1, b'v'], everywhere),
            (&[0x27, 0, 0, 0, 9], vec![Connect, ConnAck]),
            (&[0x28, 0x01], vec![ConnAck]),
            (&[0x29, 0x01], vec![ConnAck]),
            (&[0x2A, 0x01], vec![ConnAck]),
        ]
    }

    fn read(block: &[u8], ctx: Context) -> Result<Properties, DecodeError> {
        let mut bytes = vec![u8::try_from(block.len()).unwrap()];
        bytes.extend_from_slice(block);
        let mut r = Reader::new(Bytes::from(bytes));
        let props = read_properties(&mut r, ctx)?;
        r.finish()?;
        Ok(props)
    }

    #[test]
    fn allowed_sets_follow_the_spec_table() {
        for (block, allowed) in spec_table() {
            for ctx in CONTEXTS {
                let result = read(block, ctx);
                if allowed.contains(&ctx) {
                    let props = result.unwrap_or_else(|e| panic!("{block:02X?} in {ctx:?}: {e}"));
                    // Encoding in the same packet writes the same bytes back.
                    assert_eq!(properties_len(&props, ctx), block.len());
                    let mut buf = BytesMut::new();
                    write_properties(&props, ctx, &mut buf).unwrap();
                    assert_eq!(&buf[1..], block);
                } else {
                    assert_eq!(
                        result,
                        Err(DecodeError::Protocol("property not allowed in this packet")),
                        "{block:02X?} in {ctx:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn unknown_identifiers_are_malformed() {
        let known: Vec<u8> = spec_table().iter().map(|(block, _)| block[0]).collect();
        for id in (0..=255u8).filter(|id| !known.contains(id)) {
            for ctx in CONTEXTS {
                assert!(matches!(read(&[id, 0, 0, 0, 0], ctx), Err(DecodeError::Malformed(_))), "{id:#04X}");
            }
        }
    }

    #[test]
    fn single_valued_properties_may_not_repeat() {
        for (block, allowed) in spec_table() {
            let twice = [block, block].concat();
            let ctx = allowed[0];
            let repeatable =
                block[0] == USER_PROPERTY || (block[0] == SUBSCRIPTION_IDENTIFIER && ctx == Context::Publish);
            let result = read(&twice, ctx);
            if repeatable {
                assert!(result.is_ok(), "{block:02X?}");
            } else {
                assert!(matches!(result, Err(DecodeError::Protocol(_))), "{block:02X?}: {result:?}");
            }
        }
        assert!(matches!(read(&[0x0B, 0x01, 0x0B, 0x02], Context::Subscribe), Err(DecodeError::Protocol(_))));
    }

    #[test]
    fn forbidden_values_are_protocol_errors() {
        let cases: [(&[u8], Context); 15] = [
            (&[0x01, 0x02], Context::Publish),
            (&[0x0B, 0x00], Context::Publish),
            (&[0x0B, 0x80, 0x00], Context::Subscribe),
            (&[0x08, 0, 3, b'a', b'/', b'+'], Context::Will),
            (&[0x08, 0, 0], Context::Publish),
            (&[0x17, 0x02], Context::Connect),
            (&[0x19, 0xFF], Context::Connect),
            (&[0x21, 0, 0], Context::ConnAck),
            (&[0x23, 0, 0], Context::Publish),
            (&[0x24, 0x02], Context::ConnAck),
            (&[0x25, 0x02], Context::ConnAck),
            (&[0x27, 0, 0, 0, 0], Context::Connect),
            (&[0x28, 0x02], Context::ConnAck),
            (&[0x29, 0x02], Context::ConnAck),
            (&[0x2A, 0x02], Context::ConnAck),
        ];
        for (block, ctx) in cases {
            assert!(matches!(read(block, ctx), Err(DecodeError::Protocol(_))), "{block:02X?}");
        }
    }

    #[test]
    fn truncated_blocks_are_malformed() {
        for (block, allowed) in spec_table() {
            for end in 1..block.len() {
                assert!(
                    matches!(read(&block[..end], allowed[0]), Err(DecodeError::Malformed(_))),
                    "{block:02X?} cut at {end}"
                );
            }
        }
        // Property Length larger than what follows.
        let mut r = Reader::new(Bytes::from_static(&[0x05, 0x01, 0x00]));
        assert!(matches!(read_properties(&mut r, Context::Publish), Err(DecodeError::Malformed(_))));
        // User property with invalid UTF-8.
        assert!(matches!(read(&[0x26, 0, 1, 0xFF, 0, 0], Context::Publish), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn encoder_writes_only_allowed_properties_in_order_of_use() {
        let all = all_properties();
        for ctx in CONTEXTS {
            let mut buf = BytesMut::new();
            write_properties(&all, ctx, &mut buf).unwrap();
            assert_eq!(buf.len(), properties_block_len(&all, ctx));
            let mut r = Reader::new(buf.freeze());
            let props = read_properties(&mut r, ctx).unwrap();
            assert!(r.is_empty());
            assert_eq!(props.user_properties, all.user_properties, "{ctx:?}");
        }
        let mut buf = BytesMut::new();
        write_properties(&Properties::default(), Context::Publish, &mut buf).unwrap();
        assert_eq!(&buf[..], [0x00]);
    }

    #[test]
    fn subscription_identifier_above_the_varint_range_is_not_encoded() {
        let props = Properties::from(crate::PropertyValues {
            subscription_identifiers: vec![MAX_SUBSCRIPTION_ID + 1],
            ..Default::default()
        });
        let mut buf = BytesMut::new();
        assert_eq!(write_properties(&props, Context::Publish, &mut buf), Err(EncodeError::TooLarge));
    }

    const MAX_SUBSCRIPTION_ID: u32 = 268_435_455;
}
