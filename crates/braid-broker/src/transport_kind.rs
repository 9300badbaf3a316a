//! The list of transports clients connect through, written once: [`Transport`], its names,
//! and [`PerTransport`] (one value for each, such as the `[session.listeners.<transport>]`
//! settings) all come from the one list below. A base type: the configuration, the metrics and
//! the sessions name transports without depending on the listeners (`crate::transport`).

use serde::{Deserialize, Serialize};

/// Defines [`Transport`] and [`PerTransport`] from one list of (variant, key, description).
macro_rules! transports {
    ($($variant:ident $key:ident $doc:literal),+ $(,)?) => {
        /// A listener (transport) clients connect through.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Transport {
            $(#[doc = $doc] $variant,)+
        }

        impl Transport {
            /// Every transport, in declaration order.
            pub const ALL: [Transport; [$(Transport::$variant),+].len()] = [$(Transport::$variant),+];

            /// Its key under `[listeners]` and `[session.listeners]`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Transport::$variant => stringify!($key),)+
                }
            }
        }

        /// One `T` for each transport (a configuration table with a key per transport).
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct PerTransport<T> {
            $(#[doc = $doc] pub $key: T,)+
        }

        impl<T> PerTransport<T> {
            /// The value for `transport`.
            pub fn get(&self, transport: Transport) -> &T {
                match transport {
                    $(Transport::$variant => &self.$key,)+
                }
            }

            /// A value for each transport, made from its own.
            pub fn map<U>(&self, mut f: impl FnMut(Transport, &T) -> U) -> PerTransport<U> {
                PerTransport { $($key: f(Transport::$variant, &self.$key),)+ }
            }
        }
    };
}

transports! {
    Tcp tcp "MQTT over TCP.",
    Tls tls "MQTT over TLS.",
    Ws ws "MQTT over WebSocket.",
    Wss wss "MQTT over WebSocket over TLS.",
    Quic quic "MQTT over QUIC.",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_tables_follow_the_one_list() {
        let names: Vec<&str> = Transport::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["tcp", "tls", "ws", "wss", "quic"]);
        let table = PerTransport::<u8>::default().map(|t, _| t as u8);
        assert!(Transport::ALL.iter().all(|&t| *table.get(t) == t as u8));
    }
}
