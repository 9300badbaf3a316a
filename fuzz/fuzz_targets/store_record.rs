//! Feeds arbitrary bytes to the store's record readers (`braid_broker::store::codec`): a
//! session, a queued delivery, a message. They must return a record or an error, never panic,
//! and a record read, written again, must read back as itself.
#![no_main]

use std::time::{Duration, Instant};

use braid_broker::store::{codec, UnixClock};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte chooses the reader.
    let Some((&kind, body)) = data.split_first() else { return };
    let clock = UnixClock::new(Instant::now(), Duration::from_millis(1_700_000_000_000));
    let (once, twice) = match kind % 3 {
        0 => {
            let Ok(r) = codec::read_session(body) else { return };
            let once = codec::session(&r);
            (once.clone(), codec::session(&codec::read_session(&once).expect("reads back")))
        }
        1 => {
            let Ok(d) = codec::read_delivery(body, &clock) else { return };
            let once = codec::delivery(&d, &clock);
            (once.clone(), codec::delivery(&codec::read_delivery(&once, &clock).expect("reads back"), &clock))
        }
        _ => {
            let Ok(m) = codec::read_message(BytesMut::from(body), &clock) else { return };
            let once = codec::message(&m, &clock);
            let again = codec::read_message(BytesMut::from(&once[..]), &clock).expect("reads back");
            (once.clone(), codec::message(&again, &clock))
        }
    };
    assert_eq!(once, twice, "a record written again differs");
});
