//! Feeds arbitrary bytes to the WebSocket frame decoder, as a server and as a client, with a
//! maximum message size from the input: it must hand on payload or stop at a violation, never
//! panic, and reads of any size must give what one read of everything gives.
#![no_main]

use braid_proto::fuzz_ws_decode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Two bytes choose the decoder: its role and read size, and its maximum message size.
    let [setup, max, wire @ ..] = data else { return };
    let from_client = setup & 1 != 0;
    let read = usize::from(setup >> 1) + 1;
    let max_message = u64::MAX.checked_shr(u32::from(max % 65)).unwrap_or(0);
    let (whole, end) = fuzz_ws_decode(wire, from_client, max_message, wire.len());
    let (pieces, pieces_end) = fuzz_ws_decode(wire, from_client, max_message, read);
    assert_eq!(end, pieces_end, "reads of {read} bytes end otherwise than one read");
    if end.is_ok() {
        assert_eq!(whole, pieces, "reads of {read} bytes hand on other payload than one read");
    }
    assert!(pieces.len() <= wire.len());
});
