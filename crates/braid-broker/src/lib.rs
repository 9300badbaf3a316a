//! The Braid MQTT broker.
//!
//! Layers, top to bottom (the full table is in docs/architecture.md): [`server`],
//! [`transport`] ([`transport::tcp`]: plain TCP accepts and the wait for CONNECT;
//! [`transport::listener`]: TLS, WebSocket; [`transport::tls`] loads the certificates; QUIC),
//! [`connection`] (one client: reader and writer), [`broker`] (the sans-IO core), [`router`]
//! (topic trie and shared groups), [`retained`], [`rules`] (`[[rules]]`), [`session`] (sans-IO per-client state).
//! [`broker::Broker`] ties them together.

pub mod auth;
pub mod balance;
pub mod broker;
pub mod config;
pub mod connection;
pub mod control;
pub mod directory;
pub mod harness;
pub mod limits;
pub mod message;
pub mod metrics;
pub mod report;
pub mod retained;
pub mod rewrite;
pub mod router;
pub mod rule_book;
pub mod rules;
pub mod server;
pub mod session;
pub mod store;
mod sys;
pub mod trace;
pub mod transport;
pub mod transport_kind;

pub use broker::Broker;
pub use config::Config;
pub use server::Server;
