//! Sans-IO MQTT codec for protocol versions 3.1 ("MQIsdp"), 3.1.1 and 5.0.
//!
//! [`decode`] turns bytes from a read buffer into a [`Packet`] whose topic and payload are
//! zero-copy slices of that buffer; [`encode`] writes a packet into a write buffer. Nothing here
//! does I/O or reads a clock, so every function can be fuzzed and tested in isolation.

mod codec;
mod error;
mod packet;
mod properties;
mod read_buffer;
mod reason;
pub mod topic;
#[cfg(feature = "tokio")]
mod write_through;
#[cfg(feature = "websocket")]
mod ws;

pub use bytes::{Bytes, BytesMut};
pub use bytestring::ByteString;
pub use codec::{decode, encode, encode_publish, encoded_len, packet_size};
pub use error::{DecodeError, EncodeError};
pub use packet::*;
pub use properties::{Properties, PropertyValues};
pub use read_buffer::ReadBuffer;
pub use reason::ReasonCode;
#[cfg(feature = "websocket")]
pub use tokio_tungstenite;
#[cfg(feature = "tokio")]
pub use write_through::WriteThrough;
#[cfg(feature = "websocket")]
#[doc(hidden)]
pub use ws::fuzz_ws_decode;
#[cfg(feature = "websocket")]
pub use ws::WsStream;
