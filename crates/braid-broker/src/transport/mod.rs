//! The transports clients connect through: TCP (with the parking lot), TLS, WebSocket and
//! QUIC listeners. Their list ([`Transport`], [`PerTransport`]) is a base type, in
//! [`crate::transport_kind`].

pub mod admission;
pub mod listener;
pub mod quic;
pub mod tcp;
pub mod tls;
mod ws;

pub use crate::transport_kind::{PerTransport, Transport};
