//! Who holds a client's session when several brokers serve as one: the seam a cluster
//! implements so that a CONNECT claims its client id cluster-wide before the session attaches
//! (see [`crate::broker::ClusterSide::set_directory`]). A single broker has none.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use braid_proto::{ByteString, ReasonCode};

/// The future of a claim.
pub type Claiming<'a> = Pin<Box<dyn Future<Output = Result<(), ReasonCode>> + Send + 'a>>;

/// What a SUBSCRIBE waits for before it is handled.
pub type Waiting = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A cluster-wide directory of sessions.
pub trait Directory: Send + Sync + Debug {
    /// Makes this broker the holder of `client_id`'s session before its CONNECT is accepted
    /// (an empty one, to be assigned, is only checked against 0x9C):
    /// a connection to another node that holds it is closed (0x8E) and the session, unless
    /// `clean_start`, handed over and adopted here ([`crate::broker::ClusterSide::adopt`]). `Err`
    /// is the CONNACK reason to refuse with: 0x9C while this node must not serve (cut off
    /// from the cluster), 0x88 when the claim failed.
    fn claim<'a>(&'a self, client_id: &'a str, clean_start: bool) -> Claiming<'a>;

    /// A connection of `client_id` attached here after its claim: the directory checks that
    /// no other node claimed it meanwhile (else it closes it here, with 0x8E).
    fn attached(&self, client_id: &str);

    /// What a SUBSCRIBE must wait for before it is handled, if anything: until this broker has
    /// what the cluster stored before it arrived (retained messages another node acknowledged).
    fn before_subscribe(&self) -> Option<Waiting>;

    /// What a SUBACK must wait for, if anything: until every node routes by the filters the
    /// SUBSCRIBE added here, so that a message published anywhere after the SUBACK reaches it.
    fn after_subscribe(&self) -> Option<Waiting>;

    /// `client_id`'s session ended here (its expiry passed, or it was not persistent and its
    /// connection closed): the claim may go.
    fn ended(&self, client_id: &str);

    /// Where a client this broker refuses with 0x9C (Use another server) should connect
    /// instead, if the cluster knows a node that serves: a v5 CONNACK's Server Reference.
    fn server_reference(&self) -> Option<ByteString>;
}
