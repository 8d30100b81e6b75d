"""Deleting a topic while one of its replicas is down (docs/zookeeper.md, "Deleting a
topic"): the case that breaks deletion in real systems. A replica is killed -9, two
topics are deleted without it, one of them is created again under the same name — with
the dead broker among its replicas, since its registration lingers until its session
expires — and written to by the same idempotent producer as before; then the dead
broker comes back. It must drop both old topics' data and serve the new topic's
only: no old record, offset, producer sequence, group offset or audit count."""

from __future__ import annotations

from pathlib import Path

from broker.client.connection import BrokerConnection
from broker.client.producer import Producer
from broker.common.auditcounts import PartitionCounts, audit_path
from broker.common.message import encode_message_set, iter_messages
from broker.common.zklayout import (
    decode_topic_id, deletion_path, offset_path, read_assignment, topic_path, write_offset,
)
from harness.process import wait_until
from tests.replication.faults import die_after_removing_topic_nodes
from tests.replication.replicated import (
    BROKER_SETTINGS, create_replicated_topic, state, wait_identical, wait_isr, zookeeper_client,
)

SETTINGS = {**BROKER_SETTINGS, "audit.count.interval.ms": 200}
LINGERING = {"zookeeper.session.timeout.ms": 10_000}  # the victim's registration outlives it by up to 10 s
KEPT, DROPPED = "clicks", "dropped"  # clicks: led by broker 0 (its first replica), broker 2 a follower


def partition_dirs(cluster, broker_id: int, topic: str) -> list[Path]:
    return sorted(Path(cluster.brokers[broker_id].log_dir).glob(f"{topic}-[0-9]*"))


def stored_bytes(cluster, broker_id: int, topic: str) -> bytes:
    return b"".join(f.read_bytes() for d in partition_dirs(cluster, broker_id, topic) for f in sorted(d.iterdir())
                    if f.suffix == ".kafka")


def read_all(broker, topic: str) -> list[tuple[int, bytes]]:
    with BrokerConnection(*broker.address) as connection:
        answer = connection.fetch(topic, 0, 0, 1 << 20)
        return [(m.offset, m.value) for m in iter_messages(answer.messages, 0)]


def audited(zk, topic: str) -> int:
    data, _ = zk.get(audit_path(topic, 0))
    return sum(PartitionCounts.decode(data).windows.values())


def test_a_replica_down_during_a_deletion_and_a_recreation_serves_only_the_new_topic(cluster, zk_connect):
    for broker_id in range(3):
        cluster.start_broker(broker_id, {**SETTINGS, **(LINGERING if broker_id == 2 else {})})
    with zookeeper_client(zk_connect) as zk:
        for topic in (KEPT, DROPPED):
            create_replicated_topic(cluster, zk, topic, 1, 3)
        old = [b"old-%03d" % i for i in range(50)]
        producer = Producer(zookeeper=zk_connect, acks=-1, mode="sync", monitoring=False, retries=100,
                            retry_backoff_ms=100)
        try:
            for topic in (KEPT, DROPPED):
                for value in old:
                    producer.send(topic, value, partition=0)
            wait_identical(cluster, KEPT, 0, [0, 1, 2])
            write_offset(zk, "readers", KEPT, 0, 999)  # a group's commit of the old topic
            wait_until(lambda: zk.exists(audit_path(KEPT, 0)) and audited(zk, KEPT) == len(old), 30,
                       "the brokers to count the old records")
            old_id = decode_topic_id(zk.get(topic_path(KEPT))[0])

            cluster.brokers[2].kill()  # kill -9: its session lingers, its directories stay
            live = cluster.brokers[0] if cluster.brokers[0].alive else cluster.brokers[1]
            with BrokerConnection(*live.address) as connection:
                for topic in (KEPT, DROPPED):
                    connection.delete_topic(topic, 30_000)  # complete without broker 2
            other = cluster.brokers[1 if live is cluster.brokers[0] else 0]
            for topic in (KEPT, DROPPED):
                assert zk.exists(topic_path(topic)) is None and zk.exists(deletion_path(topic)) is None
                assert partition_dirs(cluster, live.broker_id, topic) == []  # the answering broker's watch came first
                # the other live replica removes its directories on its own watch, not before the answer
                wait_until(lambda: partition_dirs(cluster, other.broker_id, topic) == [], 30,
                           f"broker {other.broker_id} to remove {topic}'s directories")
            assert zk.exists(offset_path("readers", KEPT, 0)) is None
            assert zk.exists(audit_path(KEPT, 0)) is None
            assert partition_dirs(cluster, 2, KEPT) and partition_dirs(cluster, 2, DROPPED)  # it was down

            with BrokerConnection(*live.address) as connection:
                connection.create_topic(KEPT, 1, 3)
            assignment = read_assignment(zk, KEPT)
            assert 2 in assignment[0], "broker 2's registration should still linger (10 s session timeout)"
            assert decode_topic_id(zk.get(topic_path(KEPT))[0]) not in (old_id, None)
            wait_until(lambda: cluster.brokers[2].alive is False and zk.exists("/brokers/ids/2") is None, 30,
                       "broker 2's session to expire")
            new = [b"new-%03d" % i for i in range(20)]
            offsets = [producer.send(KEPT, value, partition=0).offset for value in new]  # same producer id
        finally:
            producer.close(30)
        assert offsets[0] == 0, "the new topic starts at offset 0"

        cluster.start_broker(2)
        wait_isr(zk, KEPT, {0, 1, 2})
        wait_identical(cluster, KEPT, 0, [0, 1, 2])
        assert partition_dirs(cluster, 2, DROPPED) == []
        assert b"old-" not in stored_bytes(cluster, 2, KEPT)
        leader = cluster.brokers[state(zk, KEPT).leader]
        assert [v for _, v in read_all(leader, KEPT)] == new
        assert zk.exists(offset_path("readers", KEPT, 0)) is None
        wait_until(lambda: zk.exists(audit_path(KEPT, 0)) and audited(zk, KEPT) == len(new), 30,
                   "the brokers to count the new topic's records")
        with BrokerConnection(*cluster.brokers[2].address) as connection:
            assert DROPPED not in {t.topic for t in connection.metadata([]).topics}


def test_a_deletion_survives_a_controller_killed_midway(cluster, zk_connect):
    """The controller dies (kill -9) between removing the topic's nodes and removing
    what refers to it; the next controller finds the marker and finishes. The request,
    sent to the other broker, is answered once the deletion is complete."""
    with zookeeper_client(zk_connect) as zk:
        cluster.start_broker(0, SETTINGS, preamble=die_after_removing_topic_nodes())
        wait_until(lambda: zk.exists("/controller") is not None, 30, "broker 0 to be the controller")
        cluster.start_broker(1, SETTINGS)
        create_replicated_topic(cluster, zk, KEPT, 1, 2)
        with BrokerConnection(*cluster.brokers[1].address) as connection:
            connection.produce(KEPT, 0, encode_message_set([(None, b"old", 1)]), acks=-1)
        write_offset(zk, "readers", KEPT, 0, 7)

        with BrokerConnection(*cluster.brokers[1].address) as connection:
            connection.delete_topic(KEPT, 60_000)
        assert cluster.brokers[0].logged_since(0, "fault: controller killed -9 midway")
        wait_until(lambda: not cluster.brokers[0].alive, 10, "broker 0 to be dead")
        assert zk.exists(topic_path(KEPT)) is None and zk.exists(deletion_path(KEPT)) is None
        assert zk.exists(offset_path("readers", KEPT, 0)) is None
        assert partition_dirs(cluster, 1, KEPT) == []

        cluster.brokers[0].preamble = None
        cluster.start_broker(0)  # it missed the rest of the deletion: its directory goes at start
        assert partition_dirs(cluster, 0, KEPT) == []
