//! WebSocket frames (RFC 6455 §5), sans-IO.
//!
//! [`Decoder`] turns bytes read from the peer into the payload of its binary messages, in place
//! and as they arrive: the part of a frame that has arrived is handed on before the rest of it,
//! so a large frame on a slow link yields its bytes steadily instead of all at once at its end.
//! Control frames (ping, pong, close) may come between the frames of a fragmented message; they
//! are at most 125 bytes and are the only thing the decoder keeps. [`encode`] writes one frame.

/// Which end of the connection this is: a client masks the frames it sends and a server must
/// not, and each refuses frames that break the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Client,
    Server,
}

pub(crate) const CONTINUATION: u8 = 0x0;
pub(crate) const TEXT: u8 = 0x1;
pub(crate) const BINARY: u8 = 0x2;
pub(crate) const CLOSE: u8 = 0x8;
pub(crate) const PING: u8 = 0x9;
pub(crate) const PONG: u8 = 0xA;

/// Close status codes (RFC 6455 §7.4.1).
pub(crate) const NORMAL_CLOSURE: u16 = 1000;
const PROTOCOL_ERROR: u16 = 1002;
const UNSUPPORTED_DATA: u16 = 1003;
const INVALID_PAYLOAD: u16 = 1007;
const MESSAGE_TOO_BIG: u16 = 1009;

/// Largest control frame payload.
const MAX_CONTROL: u64 = 125;

/// Why the peer's frames cannot be read: the status code to close with, and the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Violation {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
}

fn violation<T>(code: u16, reason: &'static str) -> Result<T, Violation> {
    Err(Violation { code, reason })
}

/// What the decoder is in the middle of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A frame header (`Decoder::head_len` bytes of it so far).
    Header,
    /// The payload of a binary or continuation frame.
    Data,
    /// The payload of a ping, pong or close frame (into `Decoder::control`).
    Control(u8),
    /// A close frame arrived: nothing after it is read.
    Closed,
}

/// Decodes the frames a peer sends, handing on binary message payload as it arrives.
#[derive(Debug)]
pub(crate) struct Decoder {
    role: Role,
    max_message: u64,
    state: State,
    head: [u8; 14],
    head_len: u8,
    /// Payload bytes of the current frame still to come.
    remaining: u64,
    /// The current frame's masking key, rotated to apply to its next payload byte.
    mask: Option<[u8; 4]>,
    /// Length so far of a binary message whose final frame has not arrived yet.
    message: Option<u64>,
    /// The payload of the control frame being read.
    control: Vec<u8>,
    /// The payload of the last ping not yet answered.
    pong: Option<Vec<u8>>,
    /// The payload of the close frame to send back, once one arrived.
    close_reply: Option<Vec<u8>>,
}

impl Decoder {
    /// A decoder for the frames `role`'s peer sends, refusing messages over `max_message` bytes.
    pub(crate) fn new(role: Role, max_message: u64) -> Self {
        Decoder {
            role,
            max_message,
            state: State::Header,
            head: [0; 14],
            head_len: 0,
            remaining: 0,
            mask: None,
            message: None,
            control: Vec::new(),
            pong: None,
            close_reply: None,
        }
    }

    /// Decodes `buf`, bytes just read from the peer, in place: the binary message payload they
    /// hold (unmasked) is moved to the front, and its length returned. Frame headers and control
    /// frames are consumed; bytes after a close frame are ignored.
    pub(crate) fn decode(&mut self, buf: &mut [u8]) -> Result<usize, Violation> {
        let (mut r, mut w) = (0, 0);
        while r < buf.len() {
            match self.state {
                State::Closed => break,
                State::Header => {
                    let have = usize::from(self.head_len);
                    let take = (self.header_len() - have).min(buf.len() - r);
                    self.head[have..have + take].copy_from_slice(&buf[r..r + take]);
                    self.head_len += take as u8;
                    r += take;
                    if have < 2 && self.head_len >= 2 {
                        self.check_start()?;
                    }
                    if self.head_len >= 2 && usize::from(self.head_len) == self.header_len() {
                        self.start_frame()?;
                    }
                }
                State::Data => {
                    let n = self.take(buf.len() - r);
                    unmask(buf, r, w, n, self.mask);
                    r += n;
                    w += n;
                    self.advance(n)?;
                }
                State::Control(_) => {
                    let n = self.take(buf.len() - r);
                    unmask(buf, r, r, n, self.mask);
                    self.control.extend_from_slice(&buf[r..r + n]);
                    r += n;
                    self.advance(n)?;
                }
            }
        }
        Ok(w)
    }

    /// The payload of a ping to answer with a pong (only the last one, RFC 6455 §5.5.3).
    pub(crate) fn take_pong(&mut self) -> Option<Vec<u8>> {
        self.pong.take()
    }

    /// The payload of the close frame to answer the peer's close frame with, once.
    pub(crate) fn take_close_reply(&mut self) -> Option<Vec<u8>> {
        self.close_reply.take()
    }

    /// The length of the header being read, as far as its first two bytes tell.
    fn header_len(&self) -> usize {
        if self.head_len < 2 {
            return 2;
        }
        let extended = match self.head[1] & 0x7F {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        2 + extended + if self.head[1] & 0x80 != 0 { 4 } else { 0 }
    }

    /// The checks the first two header bytes allow.
    fn check_start(&self) -> Result<(), Violation> {
        let (b0, b1) = (self.head[0], self.head[1]);
        let (fin, opcode) = (b0 & 0x80 != 0, b0 & 0x0F);
        if b0 & 0x70 != 0 {
            return violation(PROTOCOL_ERROR, "reserved bits set (no extension was negotiated)");
        }
        match (self.role, b1 & 0x80 != 0) {
            (Role::Server, false) => return violation(PROTOCOL_ERROR, "unmasked frame from a client"),
            (Role::Client, true) => return violation(PROTOCOL_ERROR, "masked frame from a server"),
            _ => {}
        }
        match opcode {
            TEXT => violation(UNSUPPORTED_DATA, "text frame (MQTT over WebSocket uses binary frames)"),
            BINARY if self.message.is_some() => {
                violation(PROTOCOL_ERROR, "binary frame inside a fragmented message")
            }
            CONTINUATION if self.message.is_none() => {
                violation(PROTOCOL_ERROR, "continuation frame outside a fragmented message")
            }
            BINARY | CONTINUATION => Ok(()),
            CLOSE | PING | PONG if !fin => violation(PROTOCOL_ERROR, "fragmented control frame"),
            CLOSE | PING | PONG if u64::from(b1 & 0x7F) > MAX_CONTROL => {
                violation(PROTOCOL_ERROR, "control frame longer than 125 bytes")
            }
            CLOSE | PING | PONG => Ok(()),
            _ => violation(PROTOCOL_ERROR, "unknown opcode"),
        }
    }

    /// A whole header has arrived: starts its payload.
    fn start_frame(&mut self) -> Result<(), Violation> {
        let head = &self.head[..usize::from(self.head_len)];
        let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0F);
        let len = match head[1] & 0x7F {
            126 => u64::from(u16::from_be_bytes([head[2], head[3]])),
            127 => u64::from_be_bytes(head[2..10].try_into().expect("8 bytes")),
            n => u64::from(n),
        };
        if len >> 63 != 0 {
            return violation(PROTOCOL_ERROR, "frame length with its most significant bit set");
        }
        self.mask = (head[1] & 0x80 != 0).then(|| head[head.len() - 4..].try_into().expect("4 bytes"));
        self.head_len = 0;
        self.remaining = len;
        self.state = match opcode {
            BINARY | CONTINUATION => {
                let total = self.message.unwrap_or(0).saturating_add(len);
                if total > self.max_message {
                    return violation(MESSAGE_TOO_BIG, "message larger than the maximum");
                }
                self.message = (!fin).then_some(total);
                State::Data
            }
            _ => {
                self.control.clear();
                State::Control(opcode)
            }
        };
        self.advance(0)
    }

    /// How much of `available` bytes belongs to the current frame's payload.
    fn take(&self, available: usize) -> usize {
        self.remaining.min(available as u64) as usize
    }

    /// `n` more payload bytes of the current frame were read; ends the frame when it is whole.
    fn advance(&mut self, n: usize) -> Result<(), Violation> {
        self.remaining -= n as u64;
        if let Some(mask) = &mut self.mask {
            mask.rotate_left(n % 4);
        }
        if self.remaining > 0 {
            return Ok(());
        }
        self.state = match self.state {
            State::Control(PING) => {
                self.pong = Some(std::mem::take(&mut self.control));
                State::Header
            }
            State::Control(CLOSE) => {
                self.close_reply = Some(close_reply(&self.control)?);
                State::Closed
            }
            State::Closed => State::Closed,
            _ => State::Header,
        };
        Ok(())
    }
}

/// Checks a close frame's payload (RFC 6455 §5.5.1, §7.4) and returns the payload of the reply:
/// the same status code, or nothing if none was given.
fn close_reply(payload: &[u8]) -> Result<Vec<u8>, Violation> {
    match payload {
        [] => Ok(Vec::new()),
        [_] => violation(PROTOCOL_ERROR, "close frame with a 1-byte payload"),
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            if !matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999) {
                return violation(PROTOCOL_ERROR, "invalid close status code");
            }
            if std::str::from_utf8(reason).is_err() {
                return violation(INVALID_PAYLOAD, "close reason is not UTF-8");
            }
            Ok(vec![*hi, *lo])
        }
    }
}

/// Moves `n` bytes of `buf` from `from` to `to`, then XORs them with `mask` (whose first byte
/// applies to the first byte moved) if there is one.
fn unmask(buf: &mut [u8], from: usize, to: usize, n: usize, mask: Option<[u8; 4]>) {
    if from != to {
        buf.copy_within(from..from + n, to);
    }
    let Some(m) = mask else { return };
    // Eight bytes at a time over exact chunks, which the compiler turns into vector code.
    let wide = u64::from_ne_bytes([m[0], m[1], m[2], m[3], m[0], m[1], m[2], m[3]]);
    let mut chunks = buf[to..to + n].chunks_exact_mut(8);
    for chunk in &mut chunks {
        let word = u64::from_ne_bytes((&*chunk).try_into().expect("8 bytes")) ^ wide;
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= m[i % 4];
    }
}

/// Appends one final frame with `payload` to `out`, masked with a random key when sent by a
/// client.
pub(crate) fn encode(out: &mut Vec<u8>, role: Role, opcode: u8, payload: &[u8]) {
    let mask = (role == Role::Client).then(|| rand::random::<u32>().to_ne_bytes());
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    out.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n <= 0xFFFF => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if let Some(m) = mask {
        out.extend_from_slice(&m);
    }
    let start = out.len();
    out.extend_from_slice(payload);
    unmask(out, start, start, payload.len(), mask);
}

/// For the fuzz target `fuzz/fuzz_targets/ws_frame.rs`, not an API: decodes `wire`, the frames
/// a client (`from_client`) or a server sends, in reads of `read` bytes, refusing messages over
/// `max_message` bytes. Returns the payload handed on and, at the end, the reply to a close
/// frame if one arrived, or the status code of the violation that stopped decoding.
#[doc(hidden)]
pub fn fuzz_ws_decode(
    wire: &[u8],
    from_client: bool,
    max_message: u64,
    read: usize,
) -> (Vec<u8>, Result<Option<Vec<u8>>, u16>) {
    let mut d = Decoder::new(if from_client { Role::Server } else { Role::Client }, max_message);
    let mut payload = Vec::new();
    for chunk in wire.chunks(read.max(1)) {
        let mut buf = chunk.to_vec();
        match d.decode(&mut buf) {
            Ok(n) => payload.extend_from_slice(&buf[..n]),
            Err(v) => return (payload, Err(v.code)),
        }
    }
    (payload, Ok(d.take_close_reply()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MASK: [u8; 4] = [0x37, 0xFA, 0x21, 0x3D];

    /// A frame as a client sends it (masked with [`MASK`]), or as a server does (`mask: None`).
    fn frame(fin: bool, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![u8::from(fin) << 7 | opcode];
        let bit = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => out.push(bit | n as u8),
            n if n <= 0xFFFF => {
                out.push(bit | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(bit | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        if let Some(m) = mask {
            out.extend_from_slice(&m);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ m[i % 4]));
        } else {
            out.extend_from_slice(payload);
        }
        out
    }

    fn client(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        frame(fin, opcode, payload, Some(MASK))
    }

    /// Feeds `wire` to a server-side decoder in reads of the given sizes (the last one repeated)
    /// and returns the payload bytes handed on.
    fn decode_in_reads(wire: &[u8], reads: &[usize]) -> (Decoder, Result<Vec<u8>, Violation>) {
        let mut d = Decoder::new(Role::Server, 1 << 20);
        let mut out = Vec::new();
        let mut rest = wire;
        let mut sizes = reads.iter().copied().chain(std::iter::repeat(*reads.last().unwrap()));
        while !rest.is_empty() {
            let n = sizes.next().unwrap().min(rest.len());
            let mut buf = rest[..n].to_vec();
            match d.decode(&mut buf) {
                Ok(k) => out.extend_from_slice(&buf[..k]),
                Err(v) => return (d, Err(v)),
            }
            rest = &rest[n..];
        }
        (d, Ok(out))
    }

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn a_frame_split_at_every_byte_boundary_yields_its_payload() {
        for len in [0, 5, 125, 126, 300, 65_535, 65_536, 70_000] {
            let data = payload(len);
            let wire = client(true, BINARY, &data);
            for split in 0..=wire.len().min(400) {
                let (_, got) = decode_in_reads(&wire, &[split.max(1), wire.len()]);
                assert_eq!(got.unwrap(), data, "length {len}, split at {split}");
            }
        }
        // One byte at a time, every mask rotation.
        let data = payload(1000);
        let (_, got) = decode_in_reads(&client(true, BINARY, &data), &[1]);
        assert_eq!(got.unwrap(), data);
        for n in 2..=9 {
            let (_, got) = decode_in_reads(&client(true, BINARY, &data), &[n]);
            assert_eq!(got.unwrap(), data, "reads of {n}");
        }
    }

    #[test]
    fn several_frames_in_one_read_and_a_ping_inside_a_fragmented_message() {
        let mut wire = client(true, BINARY, b"hello ");
        wire.extend(client(false, BINARY, b"frag"));
        wire.extend(client(true, PING, b"are you there"));
        wire.extend(client(false, CONTINUATION, b"mented "));
        wire.extend(client(true, PONG, b""));
        wire.extend(client(true, CONTINUATION, b"world"));
        wire.extend(client(true, BINARY, &payload(200)));
        let mut expected = b"hello fragmented world".to_vec();
        expected.extend(payload(200));
        for reads in [&[wire.len()][..], &[1], &[3], &[7, 1, 13]] {
            let (mut d, got) = decode_in_reads(&wire, reads);
            assert_eq!(got.unwrap(), expected, "reads {reads:?}");
            assert_eq!(d.take_pong().as_deref(), Some(&b"are you there"[..]));
            assert_eq!(d.take_pong(), None, "answered once");
            assert_eq!(d.take_close_reply(), None);
        }
    }

    #[test]
    fn a_close_frame_ends_reading_and_is_answered_with_its_code() {
        let mut wire = client(true, BINARY, b"last");
        wire.extend(client(true, CLOSE, &[0x03, 0xE8, b'b', b'y', b'e']));
        wire.extend(client(true, BINARY, b"ignored"));
        let (mut d, got) = decode_in_reads(&wire, &[wire.len()]);
        assert_eq!(got.unwrap(), b"last");
        assert_eq!(d.take_close_reply(), Some(vec![0x03, 0xE8]));
        let (mut d, _) = decode_in_reads(&client(true, CLOSE, b""), &[1]);
        assert_eq!(d.take_close_reply(), Some(vec![]));
    }

    #[test]
    fn protocol_violations_are_refused_with_their_close_code() {
        let cases: Vec<(Vec<u8>, u16)> = vec![
            (frame(true, BINARY, b"unmasked", None), PROTOCOL_ERROR),
            (client(true, TEXT, b"\xc0\x00"), UNSUPPORTED_DATA),
            (client(true, CONTINUATION, b"x"), PROTOCOL_ERROR),
            ([client(false, BINARY, b"a"), client(true, BINARY, b"b")].concat(), PROTOCOL_ERROR),
            (client(false, PING, b""), PROTOCOL_ERROR),
            (client(true, PING, &[0; 126]), PROTOCOL_ERROR),
            (client(true, 0x3, b""), PROTOCOL_ERROR),
            ([&[0xC2][..], &client(true, BINARY, b"")[1..]].concat(), PROTOCOL_ERROR),
            (client(true, CLOSE, &[0x03]), PROTOCOL_ERROR),
            (client(true, CLOSE, &[0x03, 0xED]), PROTOCOL_ERROR),
            (client(true, CLOSE, &[0x03, 0xE8, 0xFF]), INVALID_PAYLOAD),
        ];
        for (wire, code) in cases {
            for reads in [&[wire.len()][..], &[1]] {
                let (_, got) = decode_in_reads(&wire, reads);
                assert_eq!(got.map_err(|v| v.code), Err(code), "{wire:02x?}");
            }
        }
    }

    #[test]
    fn an_oversized_message_is_refused_from_its_header() {
        let mut d = Decoder::new(Role::Server, 1000);
        // A header announcing 2^40 bytes, masked: refused before any payload.
        let mut head = vec![0x82, 0x80 | 127];
        head.extend_from_slice(&(1u64 << 40).to_be_bytes());
        head.extend_from_slice(&MASK);
        assert_eq!(d.decode(&mut head).map_err(|v| v.code), Err(MESSAGE_TOO_BIG));
        // The limit is on the message: fragments that add up to more are refused too.
        let mut d = Decoder::new(Role::Server, 1000);
        let mut wire = client(false, BINARY, &payload(600));
        assert_eq!(d.decode(&mut wire), Ok(600));
        let mut wire = client(true, CONTINUATION, &payload(401));
        assert_eq!(d.decode(&mut wire[..8]).map_err(|v| v.code), Err(MESSAGE_TOO_BIG));
        // 64-bit lengths with the top bit set are refused whatever the limit.
        let mut d = Decoder::new(Role::Server, u64::MAX);
        let mut head = vec![0x82, 0x80 | 127, 0x80, 0, 0, 0, 0, 0, 0, 0];
        head.extend_from_slice(&MASK);
        assert_eq!(d.decode(&mut head).map_err(|v| v.code), Err(PROTOCOL_ERROR));
    }

    #[test]
    fn a_client_reads_unmasked_server_frames_and_refuses_masked_ones() {
        let data = payload(70_000);
        let mut d = Decoder::new(Role::Client, 1 << 20);
        let mut wire = frame(true, BINARY, &data, None);
        let n = d.decode(&mut wire).unwrap();
        assert_eq!(&wire[..n], &data[..]);
        let mut d = Decoder::new(Role::Client, 1 << 20);
        assert_eq!(d.decode(&mut client(true, BINARY, b"x")).map_err(|v| v.code), Err(PROTOCOL_ERROR));
    }

    #[test]
    fn encoded_frames_decode_on_the_other_side() {
        for len in [0, 1, 125, 126, 65_535, 65_536] {
            let data = payload(len);
            for (sender, receiver) in [(Role::Client, Role::Server), (Role::Server, Role::Client)] {
                let mut wire = Vec::new();
                encode(&mut wire, sender, BINARY, &data);
                let mut d = Decoder::new(receiver, 1 << 20);
                let n = d.decode(&mut wire).unwrap();
                assert_eq!(&wire[..n], &data[..], "{sender:?}, length {len}");
            }
        }
    }
}
