"""Batch reads against a real broker: `SimpleConsumer.fetch_columns`/`batches` and a
group stream's `next_batch` hand out exactly the messages iteration hands out — plain,
gzip and magic-3 producer batches (compressed or not) — and the positions to commit
and resume from are right."""

from __future__ import annotations

import pytest

from broker.client.consumer import SimpleConsumer
from broker.client.group import ConsumerGroup
from broker.common.message import BatchIdentity, Codec, encode_batch, encode_message_set
from broker.common.zklayout import read_offset
from tests.integration.brokerutil import connect, wait_flushed


def _values(prefix: str, n: int) -> list[tuple[bytes | None, bytes, int]]:
    return [(b"key" if i % 2 else None, b"%s-%d" % (prefix.encode(), i), 1000 + i) for i in range(n)]


PARTS = [("plain", 5), ("gzip", 4), ("batch", 6), ("gzip-batch", 3), ("last", 2)]
SETS = [
    encode_message_set(_values("plain", 5)),
    encode_message_set(_values("gzip", 4), Codec.GZIP),
    encode_batch(_values("batch", 6), BatchIdentity(1, 0, 0, 6)),
    encode_batch(_values("gzip-batch", 3), BatchIdentity(1, 0, 6, 3), Codec.GZIP),
    encode_message_set(_values("last", 2)),
]
VALUES = [value for part in PARTS for _, value, _ in _values(*part)]


@pytest.fixture
def mixed(cluster) -> int:
    """Topic "reads", one partition holding every kind of set; returns its end offset."""
    broker = cluster.start_broker(0)
    with connect(broker) as conn:
        conn.create_topic("reads", 1)
        for data in SETS:
            conn.produce("reads", 0, data, acks=1)
        end = sum(len(data) for data in SETS)
        wait_flushed(conn, "reads", 0, end)
    return end


def test_simple_consumer_batches_are_the_messages_iteration_gives(mixed, zk_connect):
    with SimpleConsumer("reads", 0, zookeeper=zk_connect, offset=0, fetch_size=300) as consumer:
        iterated = list(consumer)
    with SimpleConsumer("reads", 0, zookeeper=zk_connect, offset=0, fetch_size=300) as consumer:
        batches = list(consumer.batches(idle_timeout=0))
        assert consumer.offset == mixed
    assert [m.value for m in iterated] == VALUES
    assert [m for b in batches for m in b.messages()] == iterated
    assert len(batches) > 1  # 300-byte fetches: several, some ending in a partial entry
    assert [b.offsets[0] for b in batches[1:]] == [b.next_offset for b in batches[:-1]]
    assert batches[-1].next_offset == mixed


def test_a_simple_consumer_resumes_at_a_batch_next_offset(mixed, zk_connect):
    with SimpleConsumer("reads", 0, zookeeper=zk_connect, offset=0, fetch_size=300) as consumer:
        everything = list(consumer)
    with SimpleConsumer("reads", 0, zookeeper=zk_connect, offset=0, fetch_size=300) as consumer:
        first = consumer.fetch_columns()
    with SimpleConsumer("reads", 0, zookeeper=zk_connect, offset=first.next_offset, fetch_size=300) as consumer:
        rest = list(consumer)
    assert first.messages() + rest == everything


def _group(zk_connect: str) -> ConsumerGroup:
    return ConsumerGroup("batch-readers", {"reads": 1}, zk_connect, consumer_timeout_ms=5000, max_wait_ms=100,
                         rebalance_backoff_ms=100, auto_commit_interval_ms=0, fetch_size=300)


def test_group_batches_are_the_messages_iteration_gives_and_commit_their_next_offset(mixed, zk, zk_connect):
    group = _group(zk_connect)
    try:
        stream = group.streams["reads"][0]
        one = next(stream)  # one message, then the rest of its chunk as a batch
        batches = [stream.next_batch()]
        while batches[-1].next_offset < mixed:
            batches.append(stream.next_batch())
        group.commit()
        assert read_offset(zk, "batch-readers", "reads", 0) == mixed
    finally:
        group.close()
    values = [one.value] + [v for b in batches for v in b.columns.values()]
    assert values == VALUES
    assert batches[0].columns.offsets[0] == one.next_offset
    assert {(b.topic, b.partition) for b in batches} == {("reads", 0)}


def test_a_group_resumes_after_the_last_batch_it_committed(mixed, zk, zk_connect):
    group = _group(zk_connect)
    try:
        first = group.streams["reads"][0].next_batch()
        group.commit()
    finally:
        group.close()
    assert read_offset(zk, "batch-readers", "reads", 0) == first.next_offset
    successor = _group(zk_connect)
    try:
        stream = successor.streams["reads"][0]
        rest = [next(stream)]
        while rest[-1].next_offset < mixed:
            rest.append(next(stream))
    finally:
        successor.close()
    assert rest[0].offset == first.next_offset
    assert first.columns.values() + [m.value for m in rest] == VALUES
