//! The floor of scenario 1: the least work any broker can do for a QoS 1 fan-in on loopback.
//!
//! `braid-floor epoll|uring PORT` listens on 127.0.0.1:PORT and does only what the load tool
//! needs to run: it answers CONNECT, SUBSCRIBE and PINGREQ, acknowledges every QoS 1 PUBLISH
//! at once and forwards every PUBLISH to the last client that subscribed (whatever its filter),
//! in one write per loop turn. One thread, no routing, no sessions, no allocation per message,
//! and the fewest system calls the protocol allows: one read per PUBLISH (each publisher has
//! one in flight), one write per PUBACK. QoS 2 and everything else close the connection.
//! What it costs per message is the part of a broker's CPU that no broker code can remove.

mod epoll;
mod packets;
mod uring;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mode), Some(Ok(port))) = (args.get(1), args.get(2).map(|p| p.parse::<u16>())) else {
        eprintln!("usage: braid-floor epoll|uring PORT");
        return ExitCode::from(2);
    };
    let listener = match std::net::TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("braid-floor: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match mode.as_str() {
        "epoll" => epoll::run(listener),
        "uring" => uring::run(listener),
        other => {
            eprintln!("braid-floor: unknown mode {other:?} (epoll or uring)");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("braid-floor: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Sets TCP_NODELAY, as every broker measured here does.
fn no_delay(fd: std::os::fd::RawFd) {
    let one: libc::c_int = 1;
    let len = std::mem::size_of_val(&one) as libc::socklen_t;
    unsafe {
        libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, (&one as *const libc::c_int).cast(), len)
    };
}
