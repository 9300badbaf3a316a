//! The writer half of a connection: encodes what the session has ready, many packets per
//! write, and sends the closing DISCONNECT.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncWrite, AsyncWriteExt};

use braid_proto::{encode, BytesMut, Disconnect, Packet, Properties, ProtocolVersion};

use crate::broker::Broker;
use crate::control::ConnControl;
use crate::metrics::Metrics;
use crate::session::Session;

/// Bytes encoded before a write; more stays queued until the write completes.
const WRITE_BUDGET: usize = 64 * 1024;
/// A buffer that grew beyond this is released once written.
const KEEP_CAPACITY: usize = 16 * 1024;

/// Runs until the connection is asked to close or a write fails.
pub async fn run<W: AsyncWrite + Unpin>(
    broker: Arc<Broker>,
    session: Arc<Session>,
    generation: u64,
    ctl: Arc<ConnControl>,
    version: ProtocolVersion,
    mut wr: W,
) {
    let mut buf = BytesMut::new();
    'outer: loop {
        tokio::select! {
            biased;
            _ = ctl.closed() => break,
            _ = session.woken() => {}
        }
        loop {
            let t = {
                let mut st = session.lock();
                if !st.is_attached(generation) {
                    break 'outer;
                }
                st.poll_transmit(Instant::now(), &mut buf, WRITE_BUDGET)
            };
            Metrics::add(&broker.metrics.messages_sent, t.published);
            Metrics::add(&broker.metrics.messages_dropped, t.dropped);
            if buf.is_empty() {
                break;
            }
            tokio::select! {
                r = wr.write_all(&buf) => if r.is_err() {
                    ctl.close(braid_proto::ReasonCode::Success);
                    return;
                },
                _ = ctl.closed() => break 'outer,
            }
            Metrics::add(&broker.metrics.bytes_sent, buf.len() as u64);
            buf.clear();
            if !t.more {
                break;
            }
        }
        if buf.capacity() > KEEP_CAPACITY {
            buf = BytesMut::new();
        }
    }
    buf.clear();
    let reason = ctl.reason();
    if version.is_v5() && reason.is_error() {
        let d = Disconnect {
            reason,
            properties: Properties::default(),
        };
        let _ = encode(&Packet::Disconnect(d), version, &mut buf);
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        if !buf.is_empty() {
            wr.write_all(&buf).await?;
        }
        wr.shutdown().await
    })
    .await;
}
