//! A deterministic harness for the broker core, in the spirit of quinn's `Pair`: the core and
//! any number of in-memory clients, packets in and packets out, on a virtual clock that the
//! test advances. No socket, no runtime and no wall-clock sleep: a will delay of an hour is an
//! [`Harness::advance`] away, and what happens in which order is exactly what the test says.
//!
//! Each client is served by the same code as a real connection: `Inbound` reads its packets
//! (through `Inbound::handle_buffered`, as every transport does), the session encodes its
//! deliveries, and a close the broker asks for ends it as a connection task would (a v5
//! DISCONNECT with the reason, then [`Broker::disconnected`]). What is left out is what only
//! sockets have: the wait for a takeover's old connection to read its socket, parking, and
//! publishers held back by full subscriber queues (their release is a runtime wait; those stay
//! in the socket tests).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use braid_proto::ReasonCode;
use braid_proto::{
    decode, encode, BytesMut, ConnAck, Connect, Packet, Properties, ProtocolVersion, ReadBuffer,
};

use crate::broker::{Accepted, Broker, Ending};
use crate::connection::inbound::{Flow, Inbound};
use crate::connection::{closing_disconnect, ending_for, transmit, Closing};
use crate::session::Origin;
use crate::transport_kind::Transport;

/// The broker core and its in-memory clients on a virtual clock.
pub struct Harness<'b> {
    broker: &'b Broker,
    now: Instant,
    clients: Vec<Client<'b>>,
}

/// One client of a [`Harness`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientKey(usize);

struct Client<'b> {
    version: ProtocolVersion,
    /// Its connection, until it ends.
    conn: Option<Conn<'b>>,
    /// Packets the broker sent it, not yet taken by [`Harness::received`].
    inbox: VecDeque<Packet>,
    /// Why the broker closed it (Success: the client disconnected or dropped).
    closed: Option<ReasonCode>,
}

struct Conn<'b> {
    accepted: Accepted,
    inbound: Inbound<'b>,
    rbuf: ReadBuffer,
}

impl<'b> Harness<'b> {
    /// A harness around `broker` (made with [`Broker::new`]), its clock at the broker's start.
    pub fn new(broker: &'b Broker) -> Harness<'b> {
        Harness { broker, now: broker.started(), clients: Vec::new() }
    }

    /// The virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Moves the clock on by `by`, runs the broker's timers due by then (wills, expiries,
    /// keep alive) and lets every client receive what they produced.
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
        self.broker.handle_timeout(self.now);
        self.pump();
    }

    /// A new client sends `connect` (on the plain TCP listener); returns it with the CONNACK.
    /// A refused client is closed at once.
    pub fn connect(&mut self, connect: Connect) -> (ClientKey, ConnAck) {
        let key = ClientKey(self.clients.len());
        let version = connect.protocol;
        let (conn, connack) = match self.accept(&connect) {
            Ok((conn, connack)) => (Some(conn), connack),
            Err(reason) => {
                (None, ConnAck { session_present: false, reason, properties: Properties::default() })
            }
        };
        let closed = conn.is_none().then_some(connack.reason);
        self.clients.push(Client { version, conn, inbox: VecDeque::new(), closed });
        self.pump();
        (key, connack)
    }

    /// Authenticates and attaches a client as a real connection's handshake does.
    fn accept(&self, connect: &Connect) -> Result<(Conn<'b>, ConnAck), ReasonCode> {
        let broker = self.broker;
        let identity = broker
            .security()
            .authenticate(connect, None)
            .now_or_never()
            .expect("the harness authenticates without I/O (no HTTP authentication)")
            .map_err(|refusal| refusal.reason)?;
        let seed = broker.security().seed(identity, &connect.client_id);
        let (accepted, connack, restore) =
            broker.connect(connect, broker.listener_limits(Transport::Tcp), Origin::default(), self.now)?;
        assert!(restore.is_none(), "the harness runs on the memory store");
        let acl = broker.security().resume_acl(seed, &accepted.session.client_id);
        let inbound =
            Inbound::new(broker, &accepted.session, connect.protocol, HashMap::new(), acl, self.now);
        Ok((Conn { accepted, inbound, rbuf: ReadBuffer::default() }, connack))
    }

    /// `client` sends `packet`; the broker handles it at the current time, and every client
    /// receives what that produced.
    pub fn send(&mut self, client: ClientKey, packet: Packet) {
        let (broker, now) = (self.broker, self.now);
        let c = &mut self.clients[client.0];
        let Some(conn) = c.conn.as_mut() else { panic!("client {} is closed", client.0) };
        encode(&packet, c.version, conn.rbuf.bytes()).expect("a packet the client's version can carry");
        conn.accepted.ctl.touch(broker.clock_ms(now));
        let mut out = BytesMut::new();
        let flow = conn.inbound.handle_buffered(&mut conn.rbuf, now, &mut out, |_| None);
        take_packets(&mut out, c.version, &mut c.inbox);
        let ctl = &conn.accepted.ctl;
        match flow {
            Flow::Continue => {}
            Flow::End(ending) => {
                ctl.close(ReasonCode::Success);
                self.end(client, ending);
            }
            Flow::Close(reason, detail) => {
                ctl.close_because(reason, detail);
                self.end(client, Ending::WithWill);
            }
        }
        self.pump();
    }

    /// `client`'s connection is lost (no DISCONNECT): the broker sees a network error.
    pub fn drop_connection(&mut self, client: ClientKey) {
        if let Some(conn) = &self.clients[client.0].conn {
            conn.accepted.ctl.close(ReasonCode::Success);
            self.end(client, Ending::WithWill);
        }
        self.pump();
    }

    /// Takes the packets the broker sent `client` so far (including what calls made on the
    /// broker directly, not through a client, have made ready).
    pub fn received(&mut self, client: ClientKey) -> Vec<Packet> {
        self.pump();
        self.clients[client.0].inbox.drain(..).collect()
    }

    /// Why the broker closed `client`'s connection, once it is closed (Success when the
    /// client itself disconnected or dropped it).
    pub fn closed(&self, client: ClientKey) -> Option<ReasonCode> {
        self.clients[client.0].closed
    }

    /// Lets every open client send what its session has ready, and ends those the broker
    /// asked to close (takeover, keep alive, eviction).
    fn pump(&mut self) {
        let (broker, now) = (self.broker, self.now);
        // First the ends, whose wills others may receive.
        for i in 0..self.clients.len() {
            let closing =
                self.clients[i].conn.as_ref().map(|conn| &conn.accepted.ctl).filter(|ctl| ctl.is_closed());
            if let Some(ctl) = closing {
                let ending = ending_for(ctl.reason());
                self.end(ClientKey(i), ending);
            }
        }
        for c in &mut self.clients {
            let Some(conn) = c.conn.as_mut() else { continue };
            let a = &conn.accepted;
            let _ = conn.inbound.take_transmit();
            let mut out = BytesMut::new();
            transmit(broker, &a.session, a.generation, |st| st.poll_transmit(now, &mut out, usize::MAX));
            take_packets(&mut out, c.version, &mut c.inbox);
        }
    }

    /// Ends `client`'s connection, closed at the broker's request or the client's, as a
    /// connection task does: the closing DISCONNECT, then the broker is told how it ended.
    fn end(&mut self, client: ClientKey, ending: Ending) {
        let c = &mut self.clients[client.0];
        let Some(conn) = c.conn.take() else { return };
        let ctl = &conn.accepted.ctl;
        if let Closing::Send(p) = closing_disconnect(ctl, c.version) {
            c.inbox.push_back(p);
        }
        c.closed = Some(ctl.reason());
        let Accepted { session, generation, .. } = &conn.accepted;
        self.broker.disconnected(session, *generation, ending, self.now);
    }
}

/// Decodes the packets the broker encoded in `out` into `inbox`.
fn take_packets(out: &mut BytesMut, version: ProtocolVersion, inbox: &mut VecDeque<Packet>) {
    while let Some(p) = decode(out, version, u32::MAX).expect("the broker encodes well-formed packets") {
        inbox.push_back(p);
    }
}
