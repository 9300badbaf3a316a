//! MQTT 5.0 properties: one struct of optional fields, boxed only when a packet has any.

use std::fmt;
use std::ops::{Deref, DerefMut};

use bytes::Bytes;
use bytestring::ByteString;

/// The properties of one packet. Most packets have none, so an empty `Properties` is one null
/// pointer: no allocation, nothing to copy or drop. Fields are read and written through
/// `Deref`/`DerefMut` (`props.topic_alias = Some(1)` boxes the values on first write).
#[derive(Clone, Default)]
pub struct Properties(Option<Box<PropertyValues>>);

static NONE: PropertyValues = PropertyValues::NONE;

impl Properties {
    /// True when no property is set.
    pub fn is_empty(&self) -> bool {
        self.0.as_deref().is_none_or(|v| *v == NONE)
    }

    /// True when no property was ever set (nothing is boxed): the cheap form of `is_empty`.
    pub(crate) fn is_unset(&self) -> bool {
        self.0.is_none()
    }

    /// The values, unboxed.
    pub fn into_values(self) -> PropertyValues {
        self.0.map(|b| *b).unwrap_or_default()
    }
}

impl Deref for Properties {
    type Target = PropertyValues;

    fn deref(&self) -> &PropertyValues {
        self.0.as_deref().unwrap_or(&NONE)
    }
}

impl DerefMut for Properties {
    fn deref_mut(&mut self) -> &mut PropertyValues {
        self.0.get_or_insert_with(Default::default)
    }
}

impl From<PropertyValues> for Properties {
    fn from(values: PropertyValues) -> Properties {
        Properties(Some(Box::new(values)))
    }
}

impl PartialEq for Properties {
    fn eq(&self, other: &Properties) -> bool {
        **self == **other
    }
}

impl Eq for Properties {}

impl fmt::Debug for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

/// Every MQTT 5.0 property. A packet uses the subset the spec allows for it; the decoder
/// rejects a property that is not allowed in the packet it arrived in (Protocol Error) and a
/// property given twice where the spec allows it once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PropertyValues {
    /// 0x01 Payload Format Indicator.
    pub payload_format_indicator: Option<u8>,
    /// 0x02 Message Expiry Interval (seconds).
    pub message_expiry_interval: Option<u32>,
    /// 0x03 Content Type.
    pub content_type: Option<ByteString>,
    /// 0x08 Response Topic.
    pub response_topic: Option<ByteString>,
    /// 0x09 Correlation Data.
    pub correlation_data: Option<Bytes>,
    /// 0x0B Subscription Identifier (several in a PUBLISH from the server).
    pub subscription_identifiers: Vec<u32>,
    /// 0x11 Session Expiry Interval (seconds).
    pub session_expiry_interval: Option<u32>,
    /// 0x12 Assigned Client Identifier.
    pub assigned_client_identifier: Option<ByteString>,
    /// 0x13 Server Keep Alive (seconds).
    pub server_keep_alive: Option<u16>,
    /// 0x15 Authentication Method.
    pub authentication_method: Option<ByteString>,
    /// 0x16 Authentication Data.
    pub authentication_data: Option<Bytes>,
    /// 0x17 Request Problem Information.
    pub request_problem_information: Option<u8>,
    /// 0x18 Will Delay Interval (seconds).
    pub will_delay_interval: Option<u32>,
    /// 0x19 Request Response Information.
    pub request_response_information: Option<u8>,
    /// 0x1A Response Information.
    pub response_information: Option<ByteString>,
    /// 0x1C Server Reference.
    pub server_reference: Option<ByteString>,
    /// 0x1F Reason String.
    pub reason_string: Option<ByteString>,
    /// 0x21 Receive Maximum.
    pub receive_maximum: Option<u16>,
    /// 0x22 Topic Alias Maximum.
    pub topic_alias_maximum: Option<u16>,
    /// 0x23 Topic Alias.
    pub topic_alias: Option<u16>,
    /// 0x24 Maximum QoS.
    pub maximum_qos: Option<u8>,
    /// 0x25 Retain Available.
    pub retain_available: Option<u8>,
    /// 0x26 User Property, in order, repeats allowed.
    pub user_properties: Vec<(ByteString, ByteString)>,
    /// 0x27 Maximum Packet Size.
    pub maximum_packet_size: Option<u32>,
    /// 0x28 Wildcard Subscription Available.
    pub wildcard_subscription_available: Option<u8>,
    /// 0x29 Subscription Identifier Available.
    pub subscription_identifier_available: Option<u8>,
    /// 0x2A Shared Subscription Available.
    pub shared_subscription_available: Option<u8>,
}

impl PropertyValues {
    /// No property set.
    pub const NONE: PropertyValues = PropertyValues {
        payload_format_indicator: None,
        message_expiry_interval: None,
        content_type: None,
        response_topic: None,
        correlation_data: None,
        subscription_identifiers: Vec::new(),
        session_expiry_interval: None,
        assigned_client_identifier: None,
        server_keep_alive: None,
        authentication_method: None,
        authentication_data: None,
        request_problem_information: None,
        will_delay_interval: None,
        request_response_information: None,
        response_information: None,
        server_reference: None,
        reason_string: None,
        receive_maximum: None,
        topic_alias_maximum: None,
        topic_alias: None,
        maximum_qos: None,
        retain_available: None,
        user_properties: Vec::new(),
        maximum_packet_size: None,
        wildcard_subscription_available: None,
        subscription_identifier_available: None,
        shared_subscription_available: None,
    };
}
