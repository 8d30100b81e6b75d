"""SimpleConsumer against a real broker: order and offsets, large messages, resets,
long polls, leader changes."""

from __future__ import annotations

import threading

import pytest

from broker.client.consumer import SimpleConsumer
from broker.client.errors import FetchSizeTooSmall
from broker.client.producer import Producer
from broker.common.errors import OffsetOutOfRange
from broker.common.zklayout import create_topic
from harness.process import wait_until
from tests.integration.clientutil import produce_batch_and_gzip_set, wait_visible


def produce(zk_connect: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    with Producer(zookeeper=zk_connect, monitoring=False) as producer:
        for value in values:
            producer.send(topic, value, partition=partition)


@pytest.fixture
def one_partition(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "events", 1)
    return "events"


def test_reads_messages_in_order_with_contiguous_offsets(one_partition, zk_connect):
    produce(zk_connect, "events", [b"m%d" % i for i in range(50)])
    wait_visible(zk_connect, "events", 50)
    with SimpleConsumer("events", 0, zookeeper=zk_connect, offset="smallest", fetch_size=300) as consumer:
        messages = list(consumer)
    assert [m.value for m in messages] == [b"m%d" % i for i in range(50)]
    assert all(a.next_offset == b.offset for a, b in zip(messages, messages[1:]))
    assert consumer.offset == messages[-1].next_offset == consumer.latest()


def test_seek_reads_from_a_message_boundary(one_partition, zk_connect):
    produce(zk_connect, "events", [b"a", b"b", b"c"])
    messages = wait_visible(zk_connect, "events", 3)[0]
    with SimpleConsumer("events", 0, zookeeper=zk_connect) as consumer:
        consumer.seek(messages[1].offset)
        assert [m.value for m in consumer.fetch()] == [b"b", b"c"]


def test_a_message_larger_than_the_fetch_size_is_read_with_a_bigger_fetch(one_partition, zk_connect):
    produce(zk_connect, "events", [b"x" * 5000, b"small"])
    wait_visible(zk_connect, "events", 2)
    with SimpleConsumer("events", 0, zookeeper=zk_connect, offset="smallest", fetch_size=100,
                        max_fetch_size=8192) as consumer:
        assert [len(m.value) for m in consumer] == [5000, 5]


def test_a_message_larger_than_max_fetch_size_is_a_clear_error(one_partition, zk_connect):
    produce(zk_connect, "events", [b"x" * 5000])
    wait_visible(zk_connect, "events", 1)
    with SimpleConsumer("events", 0, zookeeper=zk_connect, offset="smallest", fetch_size=100,
                        max_fetch_size=1000) as consumer:
        with pytest.raises(FetchSizeTooSmall, match="max_fetch_size"):
            consumer.fetch()


def test_offset_out_of_range_resets_to_the_earliest(one_partition, zk_connect):
    produce(zk_connect, "events", [b"first", b"second"])
    wait_visible(zk_connect, "events", 2)
    with SimpleConsumer("events", 0, zookeeper=zk_connect, offset=10**9, auto_offset_reset="smallest") as consumer:
        assert [m.value for m in consumer.fetch()] == [b"first", b"second"]


def test_offset_out_of_range_raises_when_reset_is_error(one_partition, zk_connect):
    with SimpleConsumer("events", 0, zookeeper=zk_connect, offset=10**9, auto_offset_reset="error") as consumer:
        with pytest.raises(OffsetOutOfRange):
            consumer.fetch()


def test_a_long_poll_returns_the_message_that_arrives_while_it_waits(one_partition, zk_connect):
    with SimpleConsumer("events", 0, zookeeper=zk_connect, offset="largest", max_wait_ms=30_000) as consumer:
        sender = threading.Timer(0.2, produce, (zk_connect, "events", [b"late"]))
        sender.start()
        try:
            assert [m.value for m in consumer.fetch()] == [b"late"]
        finally:
            sender.join()


def test_reading_continues_after_the_leader_restarts(cluster, zk, zk_connect):
    broker = cluster.start_broker(0)
    create_topic(zk, "restart", 1)
    produce(zk_connect, "restart", [b"one"])
    wait_visible(zk_connect, "restart", 1)
    with SimpleConsumer("restart", 0, zookeeper=zk_connect, offset="smallest", retry_timeout_ms=60_000) as consumer:
        assert [m.value for m in consumer.fetch()] == [b"one"]
        broker.stop()
        cluster.start_broker(0)
        produce(zk_connect, "restart", [b"two"])
        assert wait_until(consumer.fetch, 30, "the message after the restart")[0].value == b"two"


def test_a_consumer_resumes_at_any_record_of_a_batch_or_a_compressed_set(one_partition, zk_connect):
    """Every record has its own offset (docs/architecture.md, "Offsets"): a consumer
    started at the offset of any record — inside an idempotent producer's batch, inside
    a gzip set, or just past a batch's last record (a Kafka reader's last + 1) — reads
    exactly the records from there on, each once."""
    produce_batch_and_gzip_set(zk_connect, "events")
    everything = wait_visible(zk_connect, "events", 20)[0]
    offsets = [m.offset for m in everything]
    assert offsets == sorted(set(offsets)), "offsets must be unique and increasing"
    assert len({m.next_offset for m in everything}) == 20
    shared_entries = sum(1 for a, b in zip(everything, everything[1:]) if b.offset == a.offset + 1)
    assert shared_entries >= 10, "the test needs records that share an entry"
    for i, start in enumerate(offsets):
        with SimpleConsumer("events", 0, zookeeper=zk_connect, offset=start, max_wait_ms=0) as consumer:
            assert [m.value for m in consumer] == [m.value for m in everything[i:]]
    past_last = everything[9].offset + 1  # inside the batch's entry, after its last record
    with SimpleConsumer("events", 0, zookeeper=zk_connect, offset=past_last, max_wait_ms=0) as consumer:
        assert [m.value for m in consumer] == [m.value for m in everything[10:]]
