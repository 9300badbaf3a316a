//! MQTT 5.0 reason codes, the one vocabulary the broker speaks for every version.

macro_rules! reason_codes {
    ($($name:ident = $value:literal, $text:literal;)*) => {
        /// A v5 reason code. For 3.1.x the codec maps CONNACK and SUBACK codes to the older
        /// return codes; other packets of 3.1.x carry no reason.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum ReasonCode {
            $(
                #[doc = $text]
                $name = $value,
            )*
        }

        impl ReasonCode {
            /// The code for a wire byte, if it is a known reason code.
            pub fn from_u8(v: u8) -> Option<ReasonCode> {
                match v {
                    $($value => Some(ReasonCode::$name),)*
                    _ => None,
                }
            }

            /// The spec's name for the code, for logs and reason strings.
            pub fn description(self) -> &'static str {
                match self {
                    $(ReasonCode::$name => $text,)*
                }
            }
        }
    };
}

reason_codes! {
    Success = 0x00, "Success";
    GrantedQoS1 = 0x01, "Granted QoS 1";
    GrantedQoS2 = 0x02, "Granted QoS 2";
    DisconnectWithWill = 0x04, "Disconnect with Will Message";
    NoMatchingSubscribers = 0x10, "No matching subscribers";
    NoSubscriptionExisted = 0x11, "No subscription existed";
    ContinueAuthentication = 0x18, "Continue authentication";
    ReAuthenticate = 0x19, "Re-authenticate";
    UnspecifiedError = 0x80, "Unspecified error";
    MalformedPacket = 0x81, "Malformed Packet";
    ProtocolError = 0x82, "Protocol Error";
    ImplementationSpecificError = 0x83, "Implementation specific error";
    UnsupportedProtocolVersion = 0x84, "Unsupported Protocol Version";
    ClientIdentifierNotValid = 0x85, "Client Identifier not valid";
    BadUserNameOrPassword = 0x86, "Bad User Name or Password";
    NotAuthorized = 0x87, "Not authorized";
    ServerUnavailable = 0x88, "Server unavailable";
    ServerBusy = 0x89, "Server busy";
    Banned = 0x8A, "Banned";
    ServerShuttingDown = 0x8B, "Server shutting down";
    BadAuthenticationMethod = 0x8C, "Bad authentication method";
    KeepAliveTimeout = 0x8D, "Keep Alive timeout";
    SessionTakenOver = 0x8E, "Session taken over";
    TopicFilterInvalid = 0x8F, "Topic Filter invalid";
    TopicNameInvalid = 0x90, "Topic Name invalid";
    PacketIdentifierInUse = 0x91, "Packet Identifier in use";
    PacketIdentifierNotFound = 0x92, "Packet Identifier not found";
    ReceiveMaximumExceeded = 0x93, "Receive Maximum exceeded";
    TopicAliasInvalid = 0x94, "Topic Alias invalid";
    PacketTooLarge = 0x95, "Packet too large";
    MessageRateTooHigh = 0x96, "Message rate too high";
    QuotaExceeded = 0x97, "Quota exceeded";
    AdministrativeAction = 0x98, "Administrative action";
    PayloadFormatInvalid = 0x99, "Payload format invalid";
    RetainNotSupported = 0x9A, "Retain not supported";
    QoSNotSupported = 0x9B, "QoS not supported";
    UseAnotherServer = 0x9C, "Use another server";
    ServerMoved = 0x9D, "Server moved";
    SharedSubscriptionsNotSupported = 0x9E, "Shared Subscriptions not supported";
    ConnectionRateExceeded = 0x9F, "Connection rate exceeded";
    MaximumConnectTime = 0xA0, "Maximum connect time";
    SubscriptionIdentifiersNotSupported = 0xA1, "Subscription Identifiers not supported";
    WildcardSubscriptionsNotSupported = 0xA2, "Wildcard Subscriptions not supported";
}

impl ReasonCode {
    /// True for codes 0x80 and above, which report failure.
    pub fn is_error(self) -> bool {
        self as u8 >= 0x80
    }
}
