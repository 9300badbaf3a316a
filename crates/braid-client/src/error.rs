//! The one error type of the client.

use braid_proto::ReasonCode;

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The network connection could not be opened, or failed while connecting.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The server refused the connection; the CONNACK reason (3.1.x return codes are mapped to
    /// their v5 equivalents).
    #[error("connection refused: {} (0x{:02X})", .0.description(), *.0 as u8)]
    Refused(ReasonCode),
    /// The server broke the protocol, or a request could not be put on the wire.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// No CONNACK within [`crate::ClientOptions::connect_timeout`].
    #[error("timed out waiting for CONNACK")]
    Timeout,
    /// The client was closed, or the connection was lost and will not be re-established.
    #[error("the client is closed")]
    Closed,
    /// The server (or a limit it announced) rejected a request: a PUBACK or PUBREC with a
    /// failure reason, or a publish the server said it cannot take (too large, QoS or retain
    /// not supported, invalid topic).
    #[error("rejected: {} (0x{:02X})", .0.description(), *.0 as u8)]
    Rejected(ReasonCode),
}
