//! Session ownership in the cluster, against a real Redis: claims of one client id on two
//! nodes at once, the fencing of a node that lost a session, the takeover of a node whose lease
//! lapsed, and a node's inbox read again after a crash.

#[macro_use]
mod common;

use braid_broker::store::codec;
use braid_client::{Event, ReasonCode};
use common::{connect, disconnect_reason, next_message, publish, subscribe, Redis, TestNode, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_nodes_claiming_one_client_id_at_once_exactly_one_owns_it() {
    let redis = Redis::start();
    let nodes = [TestNode::start(&redis, "n1", 5000).await, TestNode::start(&redis, "n2", 5000).await];
    let inspect = redis.conn().await;
    for round in 0..40 {
        let id = format!("racer-{round}");
        let ((a, _), (b, _)) = tokio::join!(connect(&nodes[0], &id), connect(&nodes[1], &id));
        let clients = [a, b];
        // The client that lost is told so; the other one goes on.
        let (loser, event) = tokio::time::timeout(WAIT, async {
            tokio::select! {
                e = clients[0].recv() => (0, e),
                e = clients[1].recv() => (1, e),
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{id}: both connections stay open, on both nodes"));
        assert!(
            matches!(event, Some(Event::Disconnected(Some(ReasonCode::SessionTakenOver)))),
            "{id} at {}: {event:?}",
            nodes[loser].name
        );
        let (winner, winner_node, loser_node) = (&clients[1 - loser], &nodes[1 - loser], &nodes[loser]);
        assert_eq!(
            inspect.ownership(&id).await,
            (Some(winner_node.name.clone()), Some(2)),
            "{id}: owned by the node still serving it, the epoch raised by each claim"
        );
        assert!(inspect.owned(&winner_node.name).await.contains(&id));
        eventually!("the losing node lets the session go", !loser_node.broker.cluster().has_session(&id));
        // The winner's session is the one the cluster routes to, and its writes are not fenced
        // (a SUBSCRIBE writes its record).
        let topic = format!("race/{round}");
        subscribe(winner, &topic).await;
        let (publisher, _) = connect(loser_node, &format!("publisher-{round}")).await;
        publish(&publisher, &topic, "to the winner").await;
        assert_eq!(next_message(winner).await.payload, "to the winner");
        assert_eq!(inspect.ownership(&id).await.1, Some(2), "{id}: no claim since");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_missed_a_claim_cannot_write_the_session_it_lost() {
    let redis = Redis::start();
    // Long leases: n1's heartbeat (every quarter lease) does not notice, while the test runs,
    // that its lease was taken away.
    let n1 = TestNode::start(&redis, "n1", 30_000).await;
    let n2 = TestNode::start(&redis, "n2", 30_000).await;
    let inspect = redis.conn().await;
    let (stale, _) = connect(&n1, "fenced").await;
    subscribe(&stale, "before").await;
    assert_eq!(inspect.ownership("fenced").await, (Some("n1".into()), Some(1)));
    // n1 looks gone to n2 (its lease lapsed, as when cut off from Redis) but goes on serving:
    // n2 takes the session over without asking n1, which never learns of it.
    inspect.query::<()>(redis::cmd("DEL").arg("braid:lease:{n1}")).await;
    let (_current, present) = connect(&n2, "fenced").await;
    assert!(present, "n2 took the session over with what n1 had written");
    assert_eq!(inspect.ownership("fenced").await, (Some("n2".into()), Some(2)));
    // n1 writes the session record (a SUBSCRIBE) under epoch 1: refused, and n1 lets the
    // session and its client go.
    let _ = stale.subscribe(vec![("after".into(), Default::default())], Default::default()).await;
    assert_eq!(
        disconnect_reason(&stale).await,
        Some(ReasonCode::SessionTakenOver),
        "n1's write is fenced, and its client told so"
    );
    eventually!("n1 lets the session go", !n1.broker.cluster().has_session("fenced"));
    let record: Vec<u8> = inspect.query(redis::cmd("HGET").arg("braid:s:{fenced}").arg("record")).await;
    let filters: Vec<String> = codec::read_session(&record)
        .expect("a session record")
        .subscriptions
        .iter()
        .map(|(f, _)| f.to_string())
        .collect();
    assert_eq!(filters, ["before"], "the stale owner's write did not reach Redis");
    assert_eq!(n2.broker.subscriptions_of("fenced"), ["before"]);
    assert_eq!(inspect.ownership("fenced").await, (Some("n2".into()), Some(2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_of_a_node_whose_lease_lapsed_are_taken_over_with_its_inbox() {
    let redis = Redis::start();
    let n1 = TestNode::start(&redis, "n1", 1000).await;
    let n2 = TestNode::start(&redis, "n2", 1000).await;
    let inspect = redis.conn().await;
    let (client, _) = connect(&n1, "orphan").await;
    subscribe(&client, "reap/t").await;
    client.disconnect(ReasonCode::Success).await.expect("DISCONNECT");
    let (publisher, _) = connect(&n2, "publisher").await;
    n1.kill();
    // Sent while n1's lease still runs: into n1's inbox, which nobody reads now.
    publish(&publisher, "reap/t", "sent to the dead node").await;
    // No client comes back for it: n2's reaper takes the session over once n1's lease lapsed,
    // drains n1's inbox into it, then clears n1's routes.
    eventually!("n2 owns the session", inspect.ownership("orphan").await == (Some("n2".into()), Some(2)));
    let routes = redis::cmd("EXISTS").arg("braid:routes:{n1}").clone();
    eventually!("n2 cleared n1's routes", !inspect.query::<bool>(&routes).await);
    assert!(inspect.owned("n2").await.contains(&"orphan".to_string()));
    assert!(inspect.owned("n1").await.is_empty());
    assert!(n2.broker.cluster().has_session("orphan"));
    publish(&publisher, "reap/t", "sent after the takeover").await;
    let (client, present) = connect(&n2, "orphan").await;
    assert!(present, "the session survived its node");
    assert_eq!(next_message(&client).await.payload, "sent to the dead node");
    assert_eq!(next_message(&client).await.payload, "sent after the takeover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_reads_again_what_it_had_not_acknowledged_in_its_inbox() {
    let redis = Redis::start();
    // A short lease: n1 starts again soon after its crash. n2's long one: its reaper (every
    // half lease) does not take n1 over meanwhile.
    let n1 = TestNode::start(&redis, "n1", 1000).await;
    let n2 = TestNode::start(&redis, "n2", 60_000).await;
    let inspect = redis.conn().await;
    let inbox = "braid:inbox:{n1}";
    let (client, _) = connect(&n1, "reader").await;
    subscribe(&client, "inbox/t").await;
    client.disconnect(ReasonCode::Success).await.expect("DISCONNECT");
    let (publisher, _) = connect(&n2, "publisher").await;
    publish(&publisher, "inbox/t", "m1").await;
    // n1 reads m1 into the session and acknowledges (and deletes) its entry.
    let xlen = redis::cmd("XLEN").arg(inbox).clone();
    eventually!("n1 acknowledged m1", inspect.query::<u64>(&xlen).await == 0);
    assert_eq!(n1.metric("braid_cluster_received_messages_total"), 1.0);
    n1.kill();
    publish(&publisher, "inbox/t", "m2").await;
    publish(&publisher, "inbox/t", "m3").await;
    assert_eq!(inspect.query::<u64>(&xlen).await, 2, "m2 and m3 wait in n1's inbox");
    // As n1's reader would have before it crashed: an entry read, never acknowledged.
    let _: redis::Value = inspect
        .query(
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg("braid")
                .arg("n1")
                .arg("COUNT")
                .arg(1)
                .arg("STREAMS")
                .arg(inbox)
                .arg(">"),
        )
        .await;
    let pending: (u64, redis::Value, redis::Value, redis::Value) =
        inspect.query(redis::cmd("XPENDING").arg(inbox).arg("braid")).await;
    assert!(pending.0 >= 1, "an entry read and not acknowledged");
    let n1 = TestNode::start(&redis, "n1", 1000).await;
    eventually!("n1 acknowledged m2 and m3", inspect.query::<u64>(&xlen).await == 0);
    assert_eq!(n1.metric("braid_cluster_received_messages_total"), 2.0, "m2 and m3, not m1 again");
    assert_eq!(n1.metric("braid_cluster_duplicate_messages_total"), 0.0);
    let (client, present) = connect(&n1, "reader").await;
    assert!(present);
    for m in ["m1", "m2", "m3"] {
        assert_eq!(next_message(&client).await.payload, m);
    }
    // Each once: nothing more is held for the client once it took them.
    eventually!("the session holds nothing more", n1.broker.held_for("reader") == Some(0));
}
