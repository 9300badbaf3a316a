//! An async MQTT client for protocol versions 3.1, 3.1.1 and 5.0, built on the
//! [`braid_proto`] codec.
//!
//! - QoS 0, 1 and 2 in both directions; inbound QoS 2 is handed out once (ids are remembered
//!   until PUBREL).
//! - An outbound in-flight window, min([`ClientOptions::max_inflight`], server Receive
//!   Maximum): [`Client::publish`] waits while it is full.
//! - Inbound QoS 1/2 messages are acknowledged when the application takes them from
//!   [`Client::recv`], so [`ClientOptions::receive_maximum`] works as a prefetch count.
//! - Keep alive (PINGREQ), server Topic Aliases resolved, v5 Assigned Client Identifier and
//!   Server Keep Alive honoured, server DISCONNECT reported as [`Event::Disconnected`].
//! - Optional reconnect with exponential backoff that resumes the session, resending
//!   unacknowledged publishes with DUP and PUBREL for released QoS 2 ones.
//!
//! Each connection is one tokio task that reads and writes in a single select loop; handles
//! talk to it over bounded channels, packets are encoded straight into one write buffer and
//! many go out per write, and nothing is spawned per message.
//!
//! # Example
//!
//! ```no_run
//! use braid_client::{Client, ClientOptions, Event, Message, QoS, Properties, ReasonCode, SubscriptionOptions};
//!
//! # async fn demo() -> Result<(), braid_client::Error> {
//! let mut opts = ClientOptions::new("127.0.0.1", 1883);
//! opts.client_id = "sensor-reader".into();
//! let (client, connected) = Client::connect(opts).await?;
//! println!("connected, session present: {}", connected.session_present);
//!
//! let sub = SubscriptionOptions { qos: QoS::AtLeastOnce, ..Default::default() };
//! client.subscribe(vec![("sensors/#".into(), sub)], Properties::default()).await?;
//!
//! // QoS 1: `publish` returns when the window has room; the handle resolves on PUBACK.
//! let handle = client.publish(Message::new("sensors/kitchen", "21.5", QoS::AtLeastOnce)).await?;
//! handle.acked().await?;
//!
//! while let Some(event) = client.recv().await {
//!     match event {
//!         Event::Message(p) => {
//!             println!("{}: {:?}", p.topic, p.payload);
//!             break;
//!         }
//!         Event::Disconnected(reason) => println!("disconnected: {reason:?}"),
//!         Event::Connected(_) => println!("reconnected"),
//!     }
//! }
//! client.disconnect(ReasonCode::Success).await?;
//! # Ok(())
//! # }
//! ```

mod backoff;
mod client;
mod connect;
mod connection;
mod error;
mod inbound;
mod inflight;
mod message;
mod options;
mod quic;
mod tls;

mod transport;

pub use backoff::Backoff;
pub use braid_pacing::Pacing;
pub use braid_proto::{
    ByteString, Bytes, Properties, ProtocolVersion, Publish, QoS, ReasonCode, RetainHandling,
    SubscriptionOptions,
};
pub use client::{Client, PublishHandle, Received};
pub use error::Error;
pub use message::{Connected, Event, Message};
pub use options::{ClientOptions, InMemory, QuicOptions, Reconnect, TlsOptions, Transport, Will};
pub use tls::{connect as tls_connect, AnyServer};
