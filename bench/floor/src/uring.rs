//! The floor on io_uring (single issuer, deferred task work): a multishot accept, one `recv`
//! in flight per client, and every send of a loop turn submitted with the wait for the next
//! completion, in one `io_uring_enter`.

use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::packets::{Client, Forwarder, Verdict};

const ACCEPT: u64 = 1;
const RECV: u64 = 2;
const SEND: u64 = 3;
const FORWARD: u64 = 4;

/// A client and the reply bytes a SEND in flight points at (kept until it completes).
struct Conn {
    fd: RawFd,
    client: Client,
    sending: Vec<u8>,
    sent: usize,
    closed: bool,
}

impl Conn {
    /// The SEND of the replies waiting, if there are any and no SEND is in flight.
    fn send_replies(&mut self, token: u32) -> Option<squeue::Entry> {
        if !self.sending.is_empty() || self.client.out.is_empty() {
            return None;
        }
        std::mem::swap(&mut self.client.out, &mut self.sending);
        self.sent = 0;
        Some(send(SEND, token, self.fd, &self.sending))
    }
}

/// Operation and connection token in one user_data word (tokens are never reused, so a late
/// completion cannot reach another connection).
fn tag(op: u64, token: u32) -> u64 {
    op << 32 | u64::from(token)
}

pub fn run(listener: TcpListener) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let lfd = listener.as_raw_fd();
    let mut ring: IoUring<squeue::Entry, cqueue::Entry> =
        IoUring::builder().setup_single_issuer().setup_defer_taskrun().build(8192)?;
    let mut conns: HashMap<u32, Conn> = HashMap::new();
    let mut next_token = 0u32;
    let mut fwd: Forwarder<u32> = Forwarder::new();
    // The forwards a FORWARD send in flight points at, and how much of them went out.
    let (mut forwarding, mut forwarded) = (Vec::<u8>::new(), 0usize);
    let mut todo = vec![accept(lfd)];
    let mut done = Vec::new();
    loop {
        for e in todo.drain(..) {
            while unsafe { ring.submission().push(&e) }.is_err() {
                ring.submit()?;
            }
        }
        match ring.submit_and_wait(1) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => r?,
        };
        done.extend(ring.completion().map(|c| (c.user_data(), c.result(), c.flags())));
        for (ud, res, flags) in done.drain(..) {
            let token = ud as u32;
            match ud >> 32 {
                ACCEPT => {
                    if res >= 0 {
                        crate::no_delay(res);
                        next_token += 1;
                        let mut c = Conn {
                            fd: res,
                            client: Client::new(),
                            sending: Vec::new(),
                            sent: 0,
                            closed: false,
                        };
                        todo.push(recv(next_token, &mut c));
                        conns.insert(next_token, c);
                    }
                    if !cqueue::more(flags) {
                        todo.push(accept(lfd));
                    }
                }
                RECV => {
                    let Some(c) = conns.get_mut(&token) else { continue };
                    let close = match res {
                        r if r > 0 => {
                            c.client.len += r as usize;
                            matches!(fwd.handle(token, &mut c.client), Verdict::Close)
                        }
                        r => r == 0 || (r != -libc::EAGAIN && r != -libc::EINTR),
                    };
                    todo.extend(c.send_replies(token));
                    if !close {
                        todo.push(recv(token, c));
                        continue;
                    }
                    c.closed = true;
                    unsafe { libc::close(c.fd) };
                    fwd.gone(token);
                    if c.sending.is_empty() {
                        conns.remove(&token);
                    }
                }
                SEND => {
                    let Some(c) = conns.get_mut(&token) else { continue };
                    c.sent += res.max(0) as usize;
                    if res > 0 && c.sent < c.sending.len() {
                        todo.push(send(SEND, token, c.fd, &c.sending[c.sent..]));
                        continue;
                    }
                    c.sending.clear();
                    if c.closed {
                        conns.remove(&token);
                    } else {
                        todo.extend(c.send_replies(token));
                    }
                }
                FORWARD => {
                    forwarded += res.max(0) as usize;
                    let fd = fwd.subscriber.filter(|s| *s == token).and_then(|s| conns.get(&s)).map(|c| c.fd);
                    match fd {
                        Some(fd) if res > 0 && forwarded < forwarding.len() => {
                            todo.push(send(FORWARD, token, fd, &forwarding[forwarded..]))
                        }
                        _ => forwarding.clear(),
                    }
                }
                _ => {}
            }
        }
        let Some(s) = fwd.subscriber else { continue };
        if forwarding.is_empty() && !fwd.forward.is_empty() {
            if let Some(c) = conns.get(&s) {
                std::mem::swap(&mut forwarding, &mut fwd.forward);
                forwarded = 0;
                todo.push(send(FORWARD, s, c.fd, &forwarding));
            }
        }
    }
}

fn accept(lfd: RawFd) -> squeue::Entry {
    opcode::AcceptMulti::new(types::Fd(lfd)).build().user_data(tag(ACCEPT, 0))
}

fn recv(token: u32, c: &mut Conn) -> squeue::Entry {
    let spare = c.client.spare();
    opcode::Recv::new(types::Fd(c.fd), spare.as_mut_ptr(), spare.len() as u32)
        .build()
        .user_data(tag(RECV, token))
}

/// A send of `b`, which must stay where it is until its completion.
fn send(op: u64, token: u32, fd: RawFd, b: &[u8]) -> squeue::Entry {
    opcode::Send::new(types::Fd(fd), b.as_ptr(), b.len() as u32).build().user_data(tag(op, token))
}
