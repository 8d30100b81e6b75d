"""kafka-python and aiokafka through the Kafka listener: each produces a topic with its
own producer (idempotent, acks=all; lz4 and snappy), then consumes part of it in a consumer group,
commits, leaves; a second consumer of the group resumes exactly where the first
committed (docs/kafka.md, "Consumer groups"). Each client negotiates its own
versions: kafka-python 3.0 the highest of Kafka 4.x's schemas, aiokafka 0.14 its fixed
ones (JoinGroup v5, SyncGroup v3, OffsetCommit v3, OffsetFetch v3, ...)."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kafka import KafkaConsumer, KafkaProducer

from broker.client.offsets import group_offsets
from tests.integration.brokerutil import connect, produce, read_partition
from tests.integration.test_cli import logbus
from tests.kafka.test_groups import FAST_GROUPS

PARTITIONS, RECORDS = 2, 30
FIRST = 25  # what the first consumer reads and commits


@pytest.fixture
def records(cluster):
    broker = cluster.start_broker(0, settings=FAST_GROUPS, kafka=True)
    conn = connect(broker)
    conn.create_topic("t", PARTITIONS)
    for p in range(PARTITIONS):
        produce(conn, "t", p, [f"{p}-{i}".encode() for i in range(RECORDS)])
    offsets = {p: [m.offset for m in read_partition(conn, "t", p)] for p in range(PARTITIONS)}
    return broker, offsets


def kafka_python_reads(bootstrap: str, group: str, count: int) -> list[bytes]:
    consumer = KafkaConsumer("t", bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=500)
    got: list[bytes] = []
    deadline = time.monotonic() + 90
    try:
        while len(got) < count and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500, max_records=count - len(got)).values():
                got += [m.value for m in messages]
        consumer.commit()
    finally:
        consumer.close()
    return got


async def aiokafka_reads(bootstrap: str, group: str, count: int) -> list[bytes]:
    consumer = AIOKafkaConsumer("t", bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=500)
    await consumer.start()
    got: list[bytes] = []
    deadline = time.monotonic() + 90
    try:
        while len(got) < count and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=500, max_records=count - len(got))).values():
                got += [m.value for m in messages]
        await consumer.commit()
    finally:
        await consumer.stop()
    return got


def kafka_python_produces(bootstrap: str, values: dict[int, list[bytes]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                             compression_type="lz4", linger_ms=20)
    try:
        futures = [producer.send("t", v, partition=p) for p, vs in values.items() for v in vs]
        producer.flush(60)
        assert all(f.get(30).offset >= 0 for f in futures)
    finally:
        producer.close(30)


async def aiokafka_produces(bootstrap: str, values: dict[int, list[bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                                compression_type="snappy", linger_ms=20)  # cramjam's, in xerial's framing
    await producer.start()
    try:
        sent = [await producer.send("t", v, partition=p) for p, vs in values.items() for v in vs]
        delivered = [await f for f in sent]
        assert all(r.offset >= 0 for r in delivered)
    finally:
        await producer.stop()


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_a_client_produces_and_its_group_commits_and_a_later_member_resumes_exactly(cluster, zk, zk_connect,
                                                                                    client):
    broker = cluster.start_broker(0, settings=FAST_GROUPS, kafka=True)
    conn = connect(broker)
    conn.create_topic("t", PARTITIONS)
    values = {p: [f"{p}-{i}".encode() for i in range(RECORDS)] for p in range(PARTITIONS)}
    if client == "kafka-python":
        kafka_python_produces(broker.kafka_bootstrap, values)
    else:
        asyncio.run(aiokafka_produces(broker.kafka_bootstrap, values))
    offsets = {p: [m.offset for m in read_partition(conn, "t", p)] for p in range(PARTITIONS)}
    assert {p: len(o) for p, o in offsets.items()} == {p: RECORDS for p in range(PARTITIONS)}  # each once

    def read(count: int) -> list[bytes]:
        if client == "kafka-python":
            return kafka_python_reads(broker.kafka_bootstrap, "g", count)
        return asyncio.run(aiokafka_reads(broker.kafka_bootstrap, "g", count))

    first = read(FIRST)
    assert len(first) == FIRST
    rows = [r.split("\t") for r in logbus(zk_connect, "groups", "describe", "g").stdout.splitlines()[2:]]
    assert sum(int(r[4]) for r in rows) == PARTITIONS * RECORDS - FIRST, \
        f"logbus groups describe reports the Kafka group's lag in records: {rows}"
    rest = read(PARTITIONS * RECORDS - FIRST)
    everything = {f"{p}-{i}".encode() for p in range(PARTITIONS) for i in range(RECORDS)}
    assert sorted(first + rest) == sorted(everything), "every record once: nothing skipped, nothing read again"
    assert group_offsets(zk, "g", "t", list(range(PARTITIONS))) == {p: o[-1] + 1 for p, o in offsets.items()}


def test_admin_clients_list_and_describe_groups_and_their_offsets(records, zk):
    """confluent-kafka's AdminClient (ListGroups, DescribeGroups, OffsetFetch through
    FindCoordinator) sees the group kafka-python left with its offsets committed."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    broker, offsets = records
    kafka_python_reads(broker.kafka_bootstrap, "g", FIRST)
    admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    listed = admin.list_consumer_groups().result(30)
    described = admin.describe_consumer_groups(["g"])["g"].result(30)
    committed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("g", [
        TopicPartition("t", p) for p in range(PARTITIONS)])])["g"].result(30)
    assert [g.group_id for g in listed.valid] == ["g"]
    assert described.group_id == "g" and str(described.state).endswith("EMPTY") and not described.members
    stored = group_offsets(zk, "g", "t", list(range(PARTITIONS)))
    assert {tp.partition: tp.offset for tp in committed.topic_partitions if tp.offset >= 0} == stored
    assert sum(len([o for o in offsets[p] if o < stored.get(p, 0)]) for p in offsets) == FIRST
