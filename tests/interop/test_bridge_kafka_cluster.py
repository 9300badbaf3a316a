"""The Kafka bridge on a Braid cluster: three nodes on one Redis, each with the same
`[[bridges.kafka]]`, against a real Kafka (tests/interop/kafkaproc.py), checked with Kafka's own
console tools and paho-mqtt.

* MQTT -> Kafka: each node bridges what is published on it, through an outbox of its own whose
  filters are not announced to the other nodes: a message published on any node is in Kafka
  once (not once per node), in its publisher's order.
* Kafka -> MQTT: the nodes' consumers share the group: each record is published once in the
  cluster, and reaches subscribers on every node.
"""
import time

import pytest

from helpers import MQTTv5, unique, wait_until
from kafkaproc import KafkaServer

pytestmark = pytest.mark.braid_only


@pytest.fixture(scope="module")
def kafka(tmp_path_factory):
    k = KafkaServer(tmp_path_factory.mktemp("kafka"))
    yield k
    k.stop()


def _bridge(uid, kafka, **routes):
    """The --set value of one bridge named `uid` on `kafka`."""
    return {"bridges.kafka": [dict(name=uid, brokers=[kafka.bootstrap], **routes)]}


def test_each_message_published_on_any_node_reaches_kafka_once_in_order(kafka, braid_cluster, connect):
    uid = unique("cl-out")
    ktopic = f"clout.{uid}"
    nodes = braid_cluster(3, settings=_bridge(uid, kafka, out=[dict(filter=f"{uid}/#", topic=ktopic)]))
    # A subscriber of the bridged topics on n2 makes its filter announced to the others: the
    # outboxes must still not take what other nodes publish.
    watcher = connect(nodes[1], protocol=MQTTv5)
    watcher.subscribe(f"{uid}/#", 1)
    sent = []
    for i, node in enumerate(nodes):
        pub = connect(node, protocol=MQTTv5)
        for j in range(20):
            payload = f"n{i + 1}-{j:03d}".encode()
            assert pub.publish(f"{uid}/n{i + 1}", payload, qos=1) == 0
            sent.append((f"{uid}/n{i + 1}".encode(), payload))
    records = kafka.consume(ktopic, len(sent) + 10, timeout=15)
    got = [(r.key, r.value) for r in records]
    missing = [s for s in sent if s not in got]
    extra = len(got) - len(set(got))
    assert not missing and extra == 0 and len(got) == len(sent), (
        f"{len(sent)} published across 3 nodes, Kafka has {len(got)} records: {len(missing)} missing "
        f"{missing[:3]}, {extra} twice")
    for key in {k for k, _ in sent}:
        assert [v for k, v in got if k == key] == [v for k, v in sent if k == key], f"order of {key}"
    wait_until(lambda: len(watcher.received) == len(sent), timeout=10,
               message="the MQTT subscriber on n2 gets every message as usual")


def test_each_kafka_record_is_published_once_in_the_cluster(kafka, braid_cluster, connect):
    uid = unique("cl-in")
    ktopic = f"clin.{uid}"
    kafka.create_topic(ktopic, partitions=3)
    nodes = braid_cluster(3, settings=_bridge(
        uid, kafka, **{"in": [dict(topic=ktopic, mqtt_topic=f"{uid}/cmd/${{key}}")]}))
    subs = [connect(n, protocol=MQTTv5) for n in (nodes[0], nodes[2])]
    for s in subs:
        s.subscribe(f"{uid}/cmd/#", 1)
    time.sleep(1.0)  # the subscriptions reach every node's routes
    records = [(f"dev{i % 6}", f"r{i:03d}") for i in range(30)]
    kafka.produce(ktopic, records)
    for s in subs:
        wait_until(lambda s=s: len(s.received) >= len(records), timeout=30,
                   message=f"{len(records)} records on a subscriber")
    time.sleep(1.0)  # room for duplicates to show
    for s in subs:
        got = sorted(m.payload.decode() for m in s.received)
        assert got == sorted(v for _, v in records), (
            f"each record once on each subscriber: {len(got)} received, "
            f"{len(got) - len(set(got))} twice")
        topics = {m.topic for m in s.received}
        assert topics == {f"{uid}/cmd/dev{i}" for i in range(6)}, topics
