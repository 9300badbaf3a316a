//! Takeover over real sockets: what the old connection's client sent before the new CONNECT (a
//! DISCONNECT) is handled first, whichever worker thread reads which socket first. The rest of
//! takeover (0x8E, wills, delayed wills) is tested on the virtual clock (virtual_clock.rs).

mod common;

use common::*;

async fn watcher(addr: std::net::SocketAddr) -> TestClient {
    let (mut w, _) = TestClient::connect_ok(addr, V5, connect_packet("watcher", true)).await;
    w.subscribe("will/#", QoS::AtLeastOnce).await;
    w
}

/// A client that sends DISCONNECT and at once CONNECTs again on a new socket: the DISCONNECT
/// is honoured (no will, the session ended or kept as its expiry says), not lost to a takeover
/// that would publish the will. Many rounds, since a lost DISCONNECT is a matter of timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_then_reconnect_at_once_is_never_a_takeover() {
    let b = start_default().await;
    let mut w = watcher(b.addr).await;
    for round in 0..500u32 {
        // Even rounds: the session ends at DISCONNECT (expiry 0); odd rounds: it is kept.
        let expiry = if round % 2 == 0 { 0 } else { 300 };
        let mut c = connect_with_expiry("reconnects", true, expiry);
        c.will = will("will/reconnects", b"lost a DISCONNECT");
        let (mut a, _) = TestClient::connect_ok(b.addr, V5, c).await;
        a.send(Packet::Disconnect(Disconnect {
            reason: ReasonCode::Success,
            properties: Properties::default(),
        }))
        .await;
        let (bb, ack) = TestClient::connect_ok(b.addr, V5, connect_with_expiry("reconnects", false, 0)).await;
        assert_eq!(ack.session_present, expiry != 0, "round {round}: session present");
        assert_eq!(a.expect_closed().await, None, "round {round}: the old connection was not taken over");
        bb.disconnect().await;
    }
    // A will published at a takeover would be routed before this marker.
    let (mut p, _) = TestClient::connect_ok(b.addr, V5, connect_packet("reconnect-marker", true)).await;
    p.publish_and_ack("will/marker", QoS::AtLeastOnce, b"marker", 1).await;
    assert_eq!(&*w.expect_publish().await.topic, "will/marker", "a will was published");
}
