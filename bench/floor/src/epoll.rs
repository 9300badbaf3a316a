//! The floor on epoll (level-triggered): one `recv` per readable client, its replies written
//! at once, the subscriber's forwards written once per `epoll_wait`.

use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};

use crate::packets::{Client, Forwarder, Verdict};

pub fn run(listener: TcpListener) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let lfd = listener.as_raw_fd();
    let ep = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    ctl(ep, libc::EPOLL_CTL_ADD, lfd, false)?;
    let mut clients: HashMap<RawFd, Client> = HashMap::new();
    let mut fwd = Forwarder::new();
    // Forwards the subscriber's socket did not take yet; EPOLLOUT is armed while there are any.
    let mut unsent: Vec<u8> = Vec::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    loop {
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, -1) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        for e in &events[..check(n)? as usize] {
            let (fd, ev) = (e.u64 as RawFd, e.events);
            if fd == lfd {
                accept_all(lfd, ep, &mut clients)?;
                continue;
            }
            if ev & libc::EPOLLOUT as u32 != 0 && fwd.subscriber == Some(fd) {
                let n = send(fd, &unsent);
                unsent.drain(..n);
            }
            if ev & (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR) as u32 == 0 {
                continue;
            }
            let Some(c) = clients.get_mut(&fd) else { continue };
            let r = unsafe { libc::recv(fd, c.spare().as_mut_ptr().cast(), c.spare().len(), 0) };
            let close = match r {
                0 => true,
                r if r < 0 => io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock,
                r => {
                    c.len += r as usize;
                    matches!(fwd.handle(fd, c), Verdict::Close)
                }
            };
            if !c.out.is_empty() {
                // A reply is a few bytes to a client waiting for it: it fits the socket buffer.
                send(fd, &c.out);
                c.out.clear();
            }
            if close {
                clients.remove(&fd);
                fwd.gone(fd);
                if fwd.subscriber.is_none() {
                    unsent.clear();
                }
                unsafe { libc::close(fd) };
            }
        }
        let Some(s) = fwd.subscriber else { continue };
        let was_waiting = !unsent.is_empty();
        if !fwd.forward.is_empty() {
            let n = if was_waiting { 0 } else { send(s, &fwd.forward) };
            unsent.extend_from_slice(&fwd.forward[n..]);
            fwd.forward.clear();
        }
        let waiting = !unsent.is_empty();
        if waiting != was_waiting {
            ctl(ep, libc::EPOLL_CTL_MOD, s, waiting)?;
        }
    }
}

fn accept_all(lfd: RawFd, ep: RawFd, clients: &mut HashMap<RawFd, Client>) -> io::Result<()> {
    loop {
        let fd =
            unsafe { libc::accept4(lfd, std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_NONBLOCK) };
        if fd < 0 {
            return Ok(());
        }
        crate::no_delay(fd);
        ctl(ep, libc::EPOLL_CTL_ADD, fd, false)?;
        clients.insert(fd, Client::new());
    }
}

fn ctl(ep: RawFd, op: i32, fd: RawFd, writable: bool) -> io::Result<()> {
    let events = libc::EPOLLIN as u32 | if writable { libc::EPOLLOUT as u32 } else { 0 };
    let mut e = libc::epoll_event { events, u64: fd as u64 };
    check(unsafe { libc::epoll_ctl(ep, op, fd, &mut e) }).map(drop)
}

/// Bytes written (0 when none could be).
fn send(fd: RawFd, b: &[u8]) -> usize {
    let n = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
    n.max(0) as usize
}

fn check(r: i32) -> io::Result<i32> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}
