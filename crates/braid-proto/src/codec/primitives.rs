//! Wire primitives: Variable Byte Integers, big-endian integers, length-prefixed strings and
//! binary data, read from a [`Reader`] over a frozen frame and written into a `BytesMut`.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use crate::{DecodeError, EncodeError, ReasonCode};

/// Largest value a (four byte) Variable Byte Integer can hold.
pub(crate) const MAX_VARINT: usize = 268_435_455;

const TOO_SHORT: DecodeError = DecodeError::Malformed("packet shorter than its contents");

/// Parses a Variable Byte Integer at the start of `bytes`.
///
/// Returns the value and the number of bytes it took, `Ok(None)` if `bytes` ends before the
/// integer does, and an error for a fifth continuation byte.
pub(super) fn parse_varint(bytes: &[u8]) -> Result<Option<(usize, usize)>, DecodeError> {
    let mut value = 0usize;
    for (i, &byte) in bytes.iter().take(4).enumerate() {
        value |= usize::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() >= 4 {
        Err(DecodeError::Malformed("variable byte integer longer than 4 bytes"))
    } else {
        Ok(None)
    }
}

/// Number of bytes the Variable Byte Integer for `value` takes.
pub(super) fn varint_len(value: usize) -> usize {
    match value {
        0..=0x7F => 1,
        0x80..=0x3FFF => 2,
        0x4000..=0x1F_FFFF => 3,
        _ => 4,
    }
}

/// Writes `value` as a Variable Byte Integer.
pub(super) fn put_varint(buf: &mut BytesMut, value: usize) -> Result<(), EncodeError> {
    if value > MAX_VARINT {
        return Err(EncodeError::TooLarge);
    }
    let mut rest = value;
    loop {
        // `rest % 128` always fits in a byte.
        let mut byte = (rest % 128) as u8;
        rest /= 128;
        if rest > 0 {
            byte |= 0x80;
        }
        buf.put_u8(byte);
        if rest == 0 {
            return Ok(());
        }
    }
}

/// Number of bytes a length-prefixed string or binary field of `len` bytes takes.
pub(super) fn prefixed_len(len: usize) -> usize {
    2 + len
}

/// Writes a string or binary field: a two byte length, then the bytes.
pub(super) fn put_prefixed(buf: &mut BytesMut, bytes: &[u8]) -> Result<(), EncodeError> {
    let len = u16::try_from(bytes.len()).map_err(|_| EncodeError::FieldTooLong)?;
    buf.put_u16(len);
    buf.put_slice(bytes);
    Ok(())
}

/// Validates a UTF-8 Encoded String without copying it: valid UTF-8 and no U+0000.
pub(super) fn utf8(bytes: Bytes) -> Result<ByteString, DecodeError> {
    if bytes.contains(&0) {
        return Err(DecodeError::Malformed("string contains U+0000"));
    }
    ByteString::try_from(bytes).map_err(|_| DecodeError::Malformed("string is not valid UTF-8"))
}

/// A cursor over the body of one frame. Every read checks the length first, so hostile input
/// yields `DecodeError::Malformed`, never a panic; `Bytes` results share the frame's memory.
#[derive(Debug)]
pub(super) struct Reader {
    buf: Bytes,
}

impl Reader {
    /// A reader over `buf`.
    pub(super) fn new(buf: Bytes) -> Reader {
        Reader { buf }
    }

    /// True when every byte has been read.
    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Reads one byte.
    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        Ok(self.buf.get_u8())
    }

    /// Reads a big-endian Two Byte Integer.
    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        self.need(2)?;
        Ok(self.buf.get_u16())
    }

    /// Reads a big-endian Four Byte Integer.
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        self.need(4)?;
        Ok(self.buf.get_u32())
    }

    /// Reads a Variable Byte Integer.
    pub(super) fn varint(&mut self) -> Result<usize, DecodeError> {
        let (value, len) = parse_varint(&self.buf)?.ok_or(TOO_SHORT)?;
        self.buf.advance(len);
        Ok(value)
    }

    /// Reads a non-zero Packet Identifier.
    pub(super) fn packet_id(&mut self) -> Result<u16, DecodeError> {
        match self.u16()? {
            0 => Err(DecodeError::Protocol("packet identifier 0")),
            id => Ok(id),
        }
    }

    /// Reads a v5 reason code; an unknown code byte is Malformed.
    pub(super) fn reason(&mut self) -> Result<ReasonCode, DecodeError> {
        ReasonCode::from_u8(self.u8()?).ok_or(DecodeError::Malformed("unknown reason code"))
    }

    /// Takes the next `len` bytes.
    pub(super) fn take(&mut self, len: usize) -> Result<Bytes, DecodeError> {
        self.need(len)?;
        Ok(self.buf.split_to(len))
    }

    /// Reads Binary Data: a two byte length, then the bytes.
    pub(super) fn binary(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }

    /// Reads a UTF-8 Encoded String.
    pub(super) fn string(&mut self) -> Result<ByteString, DecodeError> {
        utf8(self.binary()?)
    }

    /// Takes every byte that is left.
    pub(super) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }

    /// Fails if bytes are left over: a packet's grammar must consume all of it.
    pub(super) fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Malformed("trailing bytes after packet contents"))
        }
    }

    fn need(&self, len: usize) -> Result<(), DecodeError> {
        if self.buf.len() < len {
            Err(TOO_SHORT)
        } else {
            Ok(())
        }
    }
}

/// A fixed-shape value as properties carry it: its read, size and write in one place.
pub(super) trait Wire: Sized {
    /// Reads the value.
    fn read(r: &mut Reader) -> Result<Self, DecodeError>;
    /// Bytes the value takes on the wire.
    fn wire_len(&self) -> usize;
    /// Writes the value.
    fn write(&self, buf: &mut BytesMut) -> Result<(), EncodeError>;
}

impl Wire for u8 {
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        r.u8()
    }
    fn wire_len(&self) -> usize {
        1
    }
    fn write(&self, buf: &mut BytesMut) -> Result<(), EncodeError> {
        buf.put_u8(*self);
        Ok(())
    }
}

impl Wire for u16 {
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        r.u16()
    }
    fn wire_len(&self) -> usize {
        2
    }
    fn write(&self, buf: &mut BytesMut) -> Result<(), EncodeError> {
        buf.put_u16(*self);
        Ok(())
    }
}

impl Wire for u32 {
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        r.u32()
    }
    fn wire_len(&self) -> usize {
        4
    }
    fn write(&self, buf: &mut BytesMut) -> Result<(), EncodeError> {
        buf.put_u32(*self);
        Ok(())
    }
}

impl Wire for Bytes {
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        r.binary()
    }
    fn wire_len(&self) -> usize {
        prefixed_len(self.len())
    }
    fn write(&self, buf: &mut BytesMut) -> Result<(), EncodeError> {
        put_prefixed(buf, self)
    }
}

impl Wire for ByteString {
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        r.string()
    }
    fn wire_len(&self) -> usize {
        prefixed_len(self.len())
    }
    fn write(&self, buf: &mut BytesMut) -> Result<(), EncodeError> {
        put_prefixed(buf, self.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_FIELD: usize = u16::MAX as usize;

    #[test]
    fn varint_boundaries_round_trip() {
        for (value, len) in [
            (0, 1),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (2_097_151, 3),
            (2_097_152, 4),
            (MAX_VARINT, 4),
        ] {
            let mut buf = BytesMut::new();
            put_varint(&mut buf, value).unwrap();
            assert_eq!(buf.len(), len, "{value}");
            assert_eq!(varint_len(value), len, "{value}");
            assert_eq!(parse_varint(&buf).unwrap(), Some((value, len)));
        }
    }

    #[test]
    fn varint_spec_examples() {
        assert_eq!(parse_varint(&[0x00]).unwrap(), Some((0, 1)));
        assert_eq!(parse_varint(&[0x80, 0x01]).unwrap(), Some((128, 2)));
        assert_eq!(parse_varint(&[0xFF, 0xFF, 0xFF, 0x7F]).unwrap(), Some((MAX_VARINT, 4)));
    }

    #[test]
    fn varint_incomplete_and_too_long() {
        assert_eq!(parse_varint(&[]).unwrap(), None);
        assert_eq!(parse_varint(&[0x80, 0x80, 0x80]).unwrap(), None);
        assert!(matches!(parse_varint(&[0x80, 0x80, 0x80, 0x80]), Err(DecodeError::Malformed(_))));
        assert!(matches!(parse_varint(&[0xFF, 0xFF, 0xFF, 0xFF, 0x01]), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn varint_above_maximum_is_not_encoded() {
        let mut buf = BytesMut::new();
        assert_eq!(put_varint(&mut buf, MAX_VARINT + 1), Err(EncodeError::TooLarge));
    }

    #[test]
    fn prefixed_field_limit() {
        let mut buf = BytesMut::new();
        put_prefixed(&mut buf, &vec![b'a'; MAX_FIELD]).unwrap();
        assert_eq!(buf.len(), prefixed_len(MAX_FIELD));
        assert_eq!(put_prefixed(&mut buf, &vec![b'a'; MAX_FIELD + 1]), Err(EncodeError::FieldTooLong));
    }

    #[test]
    fn reader_rejects_short_input_and_bad_strings() {
        let mut r = Reader::new(Bytes::from_static(&[0x00, 0x03, b'a', b'b']));
        assert!(matches!(r.string(), Err(DecodeError::Malformed(_))));
        let mut r = Reader::new(Bytes::from_static(&[0x00, 0x02, b'a', 0x00]));
        assert!(matches!(r.string(), Err(DecodeError::Malformed(_))));
        let mut r = Reader::new(Bytes::from_static(&[0x00, 0x02, 0xC3, 0x28]));
        assert!(matches!(r.string(), Err(DecodeError::Malformed(_))));
        let mut r = Reader::new(Bytes::from_static(&[0x00, 0x00]));
        assert_eq!(r.packet_id(), Err(DecodeError::Protocol("packet identifier 0")));
        let mut r = Reader::new(Bytes::from_static(&[0x01]));
        assert!(r.u16().is_err());
        assert!(r.u32().is_err());
        assert_eq!(r.u8(), Ok(1));
        assert!(r.u8().is_err());
        r.finish().unwrap();
    }

    #[test]
    fn strings_share_the_frame() {
        let frame = Bytes::from_static(&[0x00, 0x02, b'h', b'i', b'!']);
        let mut r = Reader::new(frame.clone());
        let s = r.string().unwrap();
        assert_eq!(&*s, "hi");
        assert_eq!(s.as_bytes().as_ptr(), frame[2..].as_ptr());
        assert!(r.finish().is_err());
        assert_eq!(r.rest(), Bytes::from_static(b"!"));
        assert!(r.is_empty());
    }
}
