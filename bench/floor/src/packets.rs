//! The little MQTT the floor speaks: whole packets out of a read buffer, canned replies, and
//! PUBLISH forwarded byte for byte with a new packet identifier.

/// Read buffer of one connection (a packet larger than this closes it).
pub const READ_BUF: usize = 64 * 1024;

/// One client's bytes: what was read and not yet handled, and replies not yet written.
pub struct Client {
    pub buf: Box<[u8]>,
    pub len: usize,
    pub out: Vec<u8>,
}

impl Client {
    pub fn new() -> Self {
        Client { buf: vec![0; READ_BUF].into_boxed_slice(), len: 0, out: Vec::new() }
    }

    /// Where the next read goes.
    pub fn spare(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..]
    }
}

/// Whether a connection goes on after its packets were handled.
pub enum Verdict {
    Keep,
    Close,
}

/// What the floor knows across connections: the subscriber and what it is owed.
pub struct Forwarder<K> {
    /// The connection of the last client that subscribed.
    pub subscriber: Option<K>,
    /// PUBLISH packets for the subscriber, not yet written.
    pub forward: Vec<u8>,
    next_id: u16,
    v5: bool,
}

impl<K: Copy + PartialEq> Forwarder<K> {
    pub fn new() -> Self {
        Forwarder { subscriber: None, forward: Vec::new(), next_id: 0, v5: true }
    }

    /// Forgets `conn` if it was the subscriber.
    pub fn gone(&mut self, conn: K) {
        if self.subscriber == Some(conn) {
            self.subscriber = None;
            self.forward.clear();
        }
    }

    /// Handles the whole packets in `c`'s buffer (keeping a partial one): replies go to
    /// `c.out`, forwarded PUBLISH packets to `self.forward`.
    pub fn handle(&mut self, conn: K, c: &mut Client) -> Verdict {
        let mut at = 0;
        let verdict = loop {
            let (total, body) = match frame(&c.buf[at..c.len]) {
                Frame::Whole(total, body) => (total, body),
                // A partial packet that fills the buffer can never be read whole.
                Frame::Partial if c.len - at < READ_BUF => break Verdict::Keep,
                Frame::Partial | Frame::Malformed => break Verdict::Close,
            };
            let p = &c.buf[at..at + total];
            let ok = match p[0] >> 4 {
                1 => self.connect(&p[body..], &mut c.out),
                8 => self.subscribe(conn, &p[body..], &mut c.out),
                3 => self.publish(p, body, &mut c.out),
                4 => true, // the subscriber's PUBACK
                12 => {
                    c.out.extend_from_slice(&[0xd0, 0]);
                    true
                }
                _ => false, // DISCONNECT, QoS 2 flow, anything else
            };
            at += total;
            if !ok {
                break Verdict::Close;
            }
        };
        c.buf.copy_within(at..c.len, 0);
        c.len -= at;
        verdict
    }

    fn connect(&mut self, body: &[u8], out: &mut Vec<u8>) -> bool {
        let Some(name) = body.get(..2).map(|n| u16::from_be_bytes([n[0], n[1]]) as usize) else {
            return false;
        };
        let Some(&level) = body.get(2 + name) else { return false };
        self.v5 = level == 5;
        out.extend_from_slice(if self.v5 { &[0x20, 3, 0, 0, 0] } else { &[0x20, 2, 0, 0] });
        true
    }

    fn subscribe(&mut self, conn: K, body: &[u8], out: &mut Vec<u8>) -> bool {
        let Some(id) = body.get(..2) else { return false };
        self.subscriber = Some(conn);
        // One filter granted QoS 1 (the load tool subscribes to one).
        if self.v5 {
            out.extend_from_slice(&[0x90, 4, id[0], id[1], 0, 1]);
        } else {
            out.extend_from_slice(&[0x90, 3, id[0], id[1], 1]);
        }
        true
    }

    fn publish(&mut self, p: &[u8], body: usize, out: &mut Vec<u8>) -> bool {
        let qos = (p[0] >> 1) & 3;
        let Some(topic) = p.get(body..body + 2).map(|t| u16::from_be_bytes([t[0], t[1]]) as usize) else {
            return false;
        };
        let id_at = body + 2 + topic;
        if qos > 1 || (qos == 1 && p.len() < id_at + 2) {
            return false;
        }
        if qos == 1 {
            out.extend_from_slice(&[0x40, 2, p[id_at], p[id_at + 1]]);
        }
        if self.subscriber.is_some() {
            let start = self.forward.len();
            self.forward.extend_from_slice(p);
            if qos == 1 {
                self.next_id = self.next_id.wrapping_add(1).max(1);
                self.forward[start + id_at..start + id_at + 2].copy_from_slice(&self.next_id.to_be_bytes());
            }
        }
        true
    }
}

/// What the start of a buffer holds.
enum Frame {
    /// A whole packet: its length and where its body starts.
    Whole(usize, usize),
    /// Part of one.
    Partial,
    /// A remaining length of more than four bytes.
    Malformed,
}

fn frame(b: &[u8]) -> Frame {
    let mut len = 0usize;
    for i in 0..4 {
        let Some(&x) = b.get(1 + i) else { return Frame::Partial };
        len |= usize::from(x & 0x7f) << (7 * i);
        if x & 0x80 == 0 {
            let total = 2 + i + len;
            return if b.len() >= total { Frame::Whole(total, 2 + i) } else { Frame::Partial };
        }
    }
    Frame::Malformed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(f: &mut Forwarder<u32>, conn: u32, c: &mut Client, bytes: &[u8]) -> bool {
        c.spare()[..bytes.len()].copy_from_slice(bytes);
        c.len += bytes.len();
        matches!(f.handle(conn, c), Verdict::Keep)
    }

    #[test]
    fn publish_is_acknowledged_and_forwarded_with_the_subscribers_packet_id() {
        let mut f = Forwarder::new();
        let (mut publisher, mut subscriber) = (Client::new(), Client::new());
        // v5 CONNECT (fields after the level are not looked at), then SUBSCRIBE id 7.
        assert!(feed(&mut f, 1, &mut subscriber, &[0x10, 7, 0, 4, b'M', b'Q', b'T', b'T', 5]));
        assert!(feed(&mut f, 1, &mut subscriber, &[0x82, 6, 0, 7, 0, 1, b't', 1]));
        assert_eq!(subscriber.out, [0x20, 3, 0, 0, 0, 0x90, 4, 0, 7, 0, 1]);
        // QoS 1 PUBLISH "t", id 0x0102, no properties, payload "xy"; the first half arrives alone.
        let publish = [0x32, 8, 0, 1, b't', 1, 2, 0, b'x', b'y'];
        assert!(feed(&mut f, 2, &mut publisher, &publish[..4]));
        assert!(publisher.out.is_empty() && f.forward.is_empty());
        assert!(feed(&mut f, 2, &mut publisher, &publish[4..]));
        assert_eq!(publisher.out, [0x40, 2, 1, 2]);
        assert_eq!(f.forward, [0x32, 8, 0, 1, b't', 0, 1, 0, b'x', b'y']);
    }

    #[test]
    fn qos_2_and_disconnect_close_the_connection() {
        let mut f = Forwarder::new();
        assert!(!feed(&mut f, 1, &mut Client::new(), &[0x34, 5, 0, 1, b't', 0, 1]));
        assert!(!feed(&mut f, 1, &mut Client::new(), &[0xe0, 0]));
    }
}
